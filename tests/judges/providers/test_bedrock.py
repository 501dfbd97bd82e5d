"""BedrockBackend against a real bedrock-runtime client under botocore's Stubber.

The Stubber checks every request against the installed service model (parameter names, types,
ranges) and every canned response against the output shape, so these tests pin the real
Converse API without a network.
"""

from __future__ import annotations

import subprocess
import sys

import boto3  # noqa: E402  (a core dependency)
import pytest
from botocore.stub import Stubber  # noqa: E402

from mlflow_rag_eval.judges.llm.chat import (  # noqa: E402
    ChatBackend,
    ChatRequest,
    PermanentError,
    TransientError,
)
from mlflow_rag_eval.judges.providers.bedrock import BedrockBackend, parse_bedrock_target  # noqa: E402

MODEL = "anthropic.claude-3-5-haiku-20241022-v1:0"


@pytest.fixture(autouse=True)
def fake_aws(monkeypatch, tmp_path):
    """Fake credentials and an empty AWS config: nothing here may reach a real account."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "fake-secret-not-real")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_REGION"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def stubbed():
    client = boto3.client("bedrock-runtime", region_name="us-east-1")
    with Stubber(client) as stubber:
        yield BedrockBackend(MODEL, client=client), stubber
        stubber.assert_no_pending_responses()


def ask(**params):
    return ChatRequest(
        messages=[
            {"role": "system", "content": "You are a strict grader."},
            {"role": "user", "content": "Is the claim supported?"},
        ],
        schema={"type": "object"},
        params=params or {"temperature": 0.0, "max_tokens": 64, "top_p": 0.9, "seed": 7},
        timeout=30.0,
    )


def converse_response(text='{"supported": true}', stop="end_turn"):
    return {
        "output": {"message": {"role": "assistant", "content": [{"text": text}]}},
        "stopReason": stop,
        "usage": {"inputTokens": 21, "outputTokens": 6, "totalTokens": 27},
        "metrics": {"latencyMs": 120},
    }


def test_valid_converse_call(stubbed):
    backend, stubber = stubbed
    assert isinstance(backend, ChatBackend)
    stubber.add_response(
        "converse",
        converse_response(),
        expected_params={
            "modelId": MODEL,
            "messages": [{"role": "user", "content": [{"text": "Is the claim supported?"}]}],
            "system": [{"text": "You are a strict grader."}],
            # seed has no Converse equivalent and is not sent
            "inferenceConfig": {"maxTokens": 64, "temperature": 0.0, "topP": 0.9},
        },
    )
    reply = backend.complete(ask())
    assert reply.text == '{"supported": true}'
    assert (reply.tokens_in, reply.tokens_out) == (21, 6)
    assert reply.model == MODEL
    assert reply.refusal is None
    assert backend.identity() == {
        "provider": "bedrock",
        "model": MODEL,
        "base_url": None,
        "region": "us-east-1",
    }


def test_consecutive_turns_are_merged(stubbed):
    backend, stubber = stubbed
    request = ChatRequest(
        messages=[
            {"role": "user", "content": "a"},
            {"role": "user", "content": "b"},
            {"role": "assistant", "content": "c"},
            {"role": "user", "content": "d"},
        ],
        params={"stop": "END"},
    )
    stubber.add_response(
        "converse",
        converse_response(),
        expected_params={
            "modelId": MODEL,
            "messages": [
                {"role": "user", "content": [{"text": "a"}, {"text": "b"}]},
                {"role": "assistant", "content": [{"text": "c"}]},
                {"role": "user", "content": [{"text": "d"}]},
            ],
            "inferenceConfig": {"stopSequences": ["END"]},
        },
    )
    backend.complete(request)


def test_throttling_is_rate_limited(stubbed):
    backend, stubber = stubbed
    stubber.add_client_error(
        "converse",
        service_error_code="ThrottlingException",
        service_message="Too many requests, please wait before trying again.",
        http_status_code=429,
        response_meta={"HTTPHeaders": {"retry-after": "3"}},
    )
    with pytest.raises(TransientError) as info:
        backend.complete(ask())
    assert info.value.kind == "RateLimited"
    assert info.value.retry_after == 3
    assert "fake-secret-not-real" not in str(info.value)


@pytest.mark.parametrize(
    ("code", "status", "kind"),
    [
        ("ServiceUnavailableException", 503, "ServerError"),
        ("InternalServerException", 500, "ServerError"),
        ("ModelNotReadyException", 429, "ServerError"),
        ("ModelTimeoutException", 408, "Timeout"),
    ],
)
def test_transient_codes(stubbed, code, status, kind):
    backend, stubber = stubbed
    stubber.add_client_error("converse", service_error_code=code, http_status_code=status)
    with pytest.raises(TransientError) as info:
        backend.complete(ask())
    assert info.value.kind == kind


@pytest.mark.parametrize(
    ("code", "status", "kind"),
    [
        ("ValidationException", 400, "BadRequest"),
        ("AccessDeniedException", 403, "AuthError"),
        ("ResourceNotFoundException", 404, "NotFound"),
    ],
)
def test_permanent_codes(stubbed, code, status, kind):
    backend, stubber = stubbed
    stubber.add_client_error(
        "converse", service_error_code=code, service_message="nope", http_status_code=status
    )
    with pytest.raises(PermanentError) as info:
        backend.complete(ask())
    assert info.value.kind == kind
    assert code in str(info.value)


@pytest.mark.parametrize("stop", ["content_filtered", "guardrail_intervened"])
def test_filtered_reply_is_a_refusal(stubbed, stop):
    backend, stubber = stubbed
    stubber.add_response("converse", converse_response(text="", stop=stop))
    reply = backend.complete(ask())
    assert reply.refusal == stop
    assert reply.text == ""


def test_structured_output_request_shape():
    """With supports_schema, the schema goes in outputConfig (validated by the Stubber)."""
    client = boto3.client("bedrock-runtime", region_name="us-east-1")
    backend = BedrockBackend(MODEL, client=client, supports_schema=True)
    with Stubber(client) as stubber:
        stubber.add_response(
            "converse",
            converse_response(),
            expected_params={
                "modelId": MODEL,
                "messages": [{"role": "user", "content": [{"text": "Is the claim supported?"}]}],
                "system": [{"text": "You are a strict grader."}],
                "inferenceConfig": {"maxTokens": 8},
                "outputConfig": {
                    "textFormat": {
                        "type": "json_schema",
                        "structure": {"jsonSchema": {"schema": '{"type": "object"}', "name": "reply"}},
                    }
                },
            },
        )
        backend.complete(ask(max_tokens=8))
        stubber.add_client_error(
            "converse",
            service_error_code="ValidationException",
            service_message="This model doesn't support the outputConfig.textFormat field.",
        )
        with pytest.raises(PermanentError) as info:
            backend.complete(ask(max_tokens=8))
        assert info.value.kind == "SchemaUnsupported"


def test_own_client_makes_one_attempt_with_the_request_timeout():
    backend = BedrockBackend(MODEL, region_name="us-west-2")
    client = backend.client_for(12.5)
    assert client.meta.region_name == "us-west-2"
    assert client.meta.config.read_timeout == 12.5
    assert client.meta.config.retries["total_max_attempts"] == 1
    assert backend.client_for(12.5) is client
    with Stubber(client) as stubber:
        stubber.add_response("converse", converse_response())
        assert backend.complete(ChatRequest(messages=[{"role": "user", "content": "x"}], timeout=12.5)).text
    assert backend.identity()["region"] == "us-west-2"
    assert "fake-secret" not in repr(backend)


def test_region_from_aws_configuration():
    assert BedrockBackend(MODEL).identity()["region"] == "us-east-1"  # AWS_DEFAULT_REGION


def test_parse_bedrock_target():
    backend = parse_bedrock_target(f"bedrock:/{MODEL}?region_name=eu-central-1")
    assert (backend.model, backend.region_name) == (MODEL, "eu-central-1")
    with pytest.raises(ValueError):
        parse_bedrock_target("openai:/gpt-4o")
    allowed = r"allowed: \['concurrency', 'profile_name', 'region_name', 'supports_schema'\]"
    with pytest.raises(ValueError, match=allowed):
        parse_bedrock_target(f"bedrock:/{MODEL}?region=eu-central-1")


def test_judge_name_region_wins_over_the_aws_configuration():
    """get_judge goes through the same parser: the name's region, not AWS_DEFAULT_REGION."""
    from mlflow_rag_eval.judges import get_judge

    judge = get_judge(f"bedrock:/{MODEL}?region_name=eu-central-1")
    assert judge.backend.model == MODEL
    assert judge.backend.identity()["region"] == "eu-central-1"
    assert get_judge(f"bedrock:/{MODEL}").backend.identity()["region"] == "us-east-1"


def test_package_imports_without_boto3():
    code = (
        "import sys, mlflow_rag_eval, mlflow_rag_eval.judges.providers.bedrock as b\n"
        "repr(b.BedrockBackend('m'))\n"
        "assert 'boto3' not in sys.modules and 'botocore' not in sys.modules, 'boto imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
