"""OpenAICompatBackend against a scripted OpenAI-compatible server on loopback
(:class:`mlflow_rag_eval.testing.FakeJudgeServer`)."""

from __future__ import annotations

import email.utils
import json
import time

import pytest

from mlflow_rag_eval.judges.llm.chat import ChatBackend, ChatRequest, PermanentError, TransientError
from mlflow_rag_eval.judges.providers.openai import (
    OpenAICompatBackend,
    parse_openai_target,
    parse_retry_after,
)
from mlflow_rag_eval.testing import FakeJudgeServer, Reply, free_port

SECRET = "sk-test-DO-NOT-LOG-4242"
SCHEMA = {
    "type": "object",
    "properties": {"supported": {"type": "boolean"}},
    "required": ["supported"],
    "additionalProperties": False,
}


def completion(content='{"supported": true}', **extra):
    """An OpenAI chat.completion body."""
    message = {"role": "assistant", "content": content, "refusal": extra.pop("refusal", None)}
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": extra.pop("model", "gpt-4o-mini-2024-07-18"),
        "system_fingerprint": extra.pop("system_fingerprint", "fp_abc123"),
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16},
        **extra,
    }


@pytest.fixture
def server():
    """The loopback fake; its answer is set per test: ``server.reply = Reply(status, body, headers)``."""
    with FakeJudgeServer(reply=Reply(body=completion())) as fake:
        yield fake


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "MY_KEY"):
        monkeypatch.delenv(name, raising=False)


def ask(schema=SCHEMA, timeout=5.0, **params):
    return ChatRequest(
        messages=[
            {"role": "system", "content": "You are a strict grader."},
            {"role": "user", "content": "Is the claim supported?"},
        ],
        schema=schema,
        schema_name="verdict",
        params=params or {"temperature": 0.0, "max_tokens": 64, "seed": 7, "top_p": 1.0},
        timeout=timeout,
    )


def test_valid_reply_request_shape_and_parsing(server):
    backend = OpenAICompatBackend("gpt-4o-mini", base_url=server.base_url)
    assert isinstance(backend, ChatBackend)

    reply = backend.complete(ask())

    [sent] = server.requests
    assert sent["path"] == "/v1/chat/completions"
    assert "authorization" not in sent["headers"]  # no key, no header: local servers need none
    assert sent["body"] == {
        "model": "gpt-4o-mini",
        "messages": [
            {"role": "system", "content": "You are a strict grader."},
            {"role": "user", "content": "Is the claim supported?"},
        ],
        "temperature": 0.0,
        "max_tokens": 64,
        "seed": 7,
        "top_p": 1.0,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "verdict", "schema": SCHEMA, "strict": True},
        },
    }
    assert reply.text == '{"supported": true}'
    assert reply.model == "gpt-4o-mini-2024-07-18"
    assert reply.system_fingerprint == "fp_abc123"
    assert (reply.tokens_in, reply.tokens_out) == (11, 5)
    assert reply.refusal is None
    assert backend.identity() == {
        "provider": "openai",
        "model": "gpt-4o-mini",
        "base_url": server.base_url,
    }


def test_bearer_header_when_key_in_env(server, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    backend = OpenAICompatBackend("gpt-4o-mini", base_url=server.base_url)
    backend.complete(ask())
    assert server.requests[0]["headers"]["authorization"] == f"Bearer {SECRET}"
    assert SECRET not in repr(backend)
    assert SECRET not in json.dumps(backend.identity())
    assert SECRET not in json.dumps({k: repr(v) for k, v in vars(backend).items()})


def test_no_response_format_without_schema_or_support(server):
    OpenAICompatBackend("m", base_url=server.base_url).complete(ask(schema=None))
    OpenAICompatBackend("m", base_url=server.base_url, supports_schema=False).complete(ask())
    for sent in server.requests:
        assert "response_format" not in sent["body"]  # json_object is never sent either


def test_base_url_from_env(server, monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url + "/")
    backend = OpenAICompatBackend("m")
    assert backend.base_url == server.base_url
    backend.complete(ask())
    assert len(server.requests) == 1


def test_rate_limited_with_retry_after(server):
    server.reply = Reply(429, {"error": {"message": "Rate limit reached"}}, {"Retry-After": "2"})
    backend = OpenAICompatBackend("m", base_url=server.base_url)
    with pytest.raises(TransientError) as info:
        backend.complete(ask())
    assert info.value.kind == "RateLimited"
    assert info.value.retry_after == 2
    assert "Rate limit reached" in str(info.value)
    assert len(server.requests) == 1  # exactly one attempt: retries are the layer above's job


def test_rate_limited_without_retry_after(server):
    server.reply = Reply(429, {"error": {"message": "slow down"}})
    with pytest.raises(TransientError) as info:
        OpenAICompatBackend("m", base_url=server.base_url).complete(ask())
    assert (info.value.kind, info.value.retry_after) == ("RateLimited", None)


def test_server_error(server):
    server.reply = Reply(500, {"error": {"message": "boom"}})
    with pytest.raises(TransientError) as info:
        OpenAICompatBackend("m", base_url=server.base_url).complete(ask())
    assert info.value.kind == "ServerError"
    assert info.value.retry_after is None
    server.reply = Reply(503, b"<html>overloaded</html>", {"Retry-After": "7"})
    with pytest.raises(TransientError) as info:
        OpenAICompatBackend("m", base_url=server.base_url).complete(ask())
    assert (info.value.kind, info.value.retry_after) == ("ServerError", 7)


def test_timeout(server):
    server.reply = Reply(body=completion(), delay=3.0)
    backend = OpenAICompatBackend("m", base_url=server.base_url)
    started = time.monotonic()
    with pytest.raises(TransientError) as info:
        backend.complete(ask(timeout=0.3))
    assert info.value.kind == "Timeout"
    assert time.monotonic() - started < 2.5


def test_connection_refused(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    base_url = f"http://127.0.0.1:{free_port()}/v1"
    backend = OpenAICompatBackend("m", base_url=base_url)
    with pytest.raises(TransientError) as info:
        backend.complete(ask(timeout=2.0))
    assert info.value.kind == "ConnectionError"
    assert str(info.value) == f"ConnectionError: {base_url} (m): connection refused"  # kind once, no addresses
    assert SECRET not in str(info.value) and SECRET not in repr(info.value)
    assert info.value.__cause__ is None and info.value.__context__ is None  # no request/headers


def test_schema_unsupported(server):
    server.reply = Reply(
        400,
        {
            "error": {
                "message": "Invalid parameter: 'response_format' of type 'json_schema' is not "
                "supported with this model."
            }
        },
    )
    with pytest.raises(PermanentError) as info:
        OpenAICompatBackend("m", base_url=server.base_url).complete(ask())
    assert info.value.kind == "SchemaUnsupported"


def test_a_5xx_about_the_schema_is_schema_unsupported_not_retried(server):
    # llama-cpp-python's server answers the OpenAI form with a 500 naming the field.
    server.reply = Reply(500, {"error": {"message": "1 validation error for CreateChatCompletionRequest\n"
                                                "response_format.type\n  Input should be 'text' or 'json_object'"}})
    with pytest.raises(PermanentError) as info:
        OpenAICompatBackend("m", base_url=server.base_url).complete(ask())
    assert info.value.kind == "SchemaUnsupported"
    with pytest.raises(TransientError) as info:  # the same 500 without a schema sent: a server error
        OpenAICompatBackend("m", base_url=server.base_url).complete(ask(schema=None))
    assert info.value.kind == "ServerError"


def test_the_request_can_ask_for_json_object(server):
    backend = OpenAICompatBackend("m", base_url=server.base_url)
    backend.complete(ChatRequest(messages=ask().messages, schema=SCHEMA, response_format="json_object"))
    assert server.requests[-1]["body"]["response_format"] == {"type": "json_object", "schema": SCHEMA}
    assert backend.response_formats == ("json_schema", "json_object")


def test_other_4xx_are_permanent(server, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    backend = OpenAICompatBackend("m", base_url=server.base_url)
    # OpenAI's 401 names the key it was given: it must not reach the exception.
    cases = {
        401: ({"error": {"message": f"Incorrect API key provided: {SECRET}."}}, "AuthError"),
        403: ({"error": {"message": "forbidden"}}, "AuthError"),
        404: ({"error": {"message": "The model `m` does not exist"}}, "NotFound"),
        400: ({"error": {"message": "max_tokens is too large"}}, "BadRequest"),
    }
    for status, (body, kind) in cases.items():
        server.reply = Reply(status, body)
        with pytest.raises(PermanentError) as info:
            backend.complete(ask())
        assert info.value.kind == kind, status
        assert SECRET not in str(info.value) and SECRET not in repr(info.value.args)


def test_an_api_key_echoed_in_a_reply_is_redacted(server, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    echo = f'{{"supported": true, "reason": "you sent {SECRET}"}}'
    server.reply = Reply(body=completion(echo, model=f"m-{SECRET}", refusal=None))
    reply = OpenAICompatBackend("m", base_url=server.base_url).complete(ask())
    assert reply.text == '{"supported": true, "reason": "you sent ***"}'
    assert SECRET not in repr(reply)
    # A placeholder key (local servers take "EMPTY", "ollama") is no secret: replacing that word
    # in replies would corrupt them.
    monkeypatch.setenv("OPENAI_API_KEY", "true")
    server.reply = Reply(body=completion('{"supported": true}'))
    assert OpenAICompatBackend("m", base_url=server.base_url).complete(ask()).text == '{"supported": true}'


@pytest.mark.parametrize(
    "usage",
    [{"prompt_tokens": "many", "completion_tokens": 5}, {"prompt_tokens": -1, "completion_tokens": 5},
     {"prompt_tokens": {"n": 1}, "completion_tokens": 5}, "lots"],
    ids=["text", "negative", "object", "not-a-dict"],
)
def test_unreadable_usage_is_unknown_never_an_exception(server, usage):
    server.reply = Reply(body={**completion(), "usage": usage, "model": ["x"]})
    reply = OpenAICompatBackend("m", base_url=server.base_url).complete(ask())
    assert reply.tokens_in is None and reply.text == '{"supported": true}'
    assert reply.model == "m"  # an unreadable model id falls back to the one asked for


def test_a_reply_over_the_size_limit_is_refused(server, monkeypatch):
    from mlflow_rag_eval.judges.providers import _http_attempt as http_attempt

    monkeypatch.setattr(http_attempt, "MAX_REPLY_BYTES", 1000)
    server.reply = Reply(body=completion("x" * 5000))
    with pytest.raises(PermanentError) as info:
        OpenAICompatBackend("m", base_url=server.base_url).complete(ask())
    assert info.value.kind == "ReplyTooLarge"


def test_refusal(server):
    server.reply = Reply(body=completion(content=None, refusal="I can't help with that."))
    reply = OpenAICompatBackend("m", base_url=server.base_url).complete(ask())
    assert reply.refusal == "I can't help with that."
    assert reply.text == ""


def test_azure_request(server, monkeypatch):
    monkeypatch.setenv("MY_KEY", SECRET)
    root = server.base_url.removesuffix("/v1")
    backend = OpenAICompatBackend(
        "gpt4o-deploy", base_url=root, api_key_env="MY_KEY", azure_api_version="2024-10-21"
    )
    backend.complete(ask())
    [sent] = server.requests
    assert sent["path"] == "/openai/deployments/gpt4o-deploy/chat/completions"
    assert sent["query"] == {"api-version": ["2024-10-21"]}
    assert sent["headers"]["api-key"] == SECRET
    assert "authorization" not in sent["headers"]
    assert SECRET not in repr(backend) and SECRET not in json.dumps(backend.identity())


def test_parse_openai_target():
    plain = parse_openai_target("openai:/gpt-4o-mini")
    assert (plain.model, plain.base_url) == ("gpt-4o-mini", "https://api.openai.com/v1")
    local = parse_openai_target("openai:/my-model?base_url=http://127.0.0.1:8080/v1")
    assert (local.model, local.base_url) == ("my-model", "http://127.0.0.1:8080/v1")
    nested = parse_openai_target("openai:/meta-llama/Llama-3.1-8B?supports_schema=false")
    assert (nested.model, nested.supports_schema) == ("meta-llama/Llama-3.1-8B", False)
    with pytest.raises(ValueError, match="api_key_env"):
        parse_openai_target("openai:/m?api_key=sk-oops")
    with pytest.raises(ValueError):
        parse_openai_target("bedrock:/m")


def test_parse_retry_after_forms():
    now = time.time()
    date = email.utils.formatdate(now + 30, usegmt=True)
    assert parse_retry_after({"retry-after": "1.5"}) == 1.5
    assert 28 <= parse_retry_after({"retry-after": date}, now=now) <= 30
    assert parse_retry_after({"retry-after": email.utils.formatdate(now - 60, usegmt=True)}) == 0
    assert parse_retry_after({"retry-after": "soon"}) is None
    assert parse_retry_after({"retry-after-ms": "250"}) == 0.25
    assert parse_retry_after({}) is None
