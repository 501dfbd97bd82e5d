"""MlflowEndpointsBackend through a real MLflow AI Gateway on loopback.

The gateway (``mlflow gateway start``, from ``mlflow[gateway]``) serves one chat endpoint whose
provider is ``openai``, with ``openai_api_base`` pointing at a scripted OpenAI-compatible
server that this module also runs on loopback (:class:`mlflow_rag_eval.testing.FakeJudgeServer`). One gateway serves the whole module (it takes
a few seconds to start); each test scripts the upstream's answer.
"""

from __future__ import annotations

import os
import sys
import time

import pytest
import requests

from mlflow_rag_eval.judges.llm.chat import ChatBackend, ChatRequest, PermanentError, TransientError
from mlflow_rag_eval.judges.providers.endpoints import MlflowEndpointsBackend, parse_endpoints_target
from mlflow_rag_eval.testing import FakeJudgeServer, Reply, free_port, serve

UPSTREAM_KEY = "sk-gateway-side-fake-key"
START_TIMEOUT_S = 60


def completion(content='{"supported": true}'):
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "gpt-4o-mini-2024-07-18",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 13, "completion_tokens": 4, "total_tokens": 17},
    }


@pytest.fixture(scope="module")
def upstream():
    """The scripted OpenAI-compatible upstream: ``upstream.reply = Reply(status, body, headers, delay)``;
    :meth:`~FakeJudgeServer.reset` brings back the plain completion below."""
    with FakeJudgeServer(reply=Reply(body=completion())) as fake:
        yield fake


@pytest.fixture(scope="module")
def gateway(upstream, tmp_path_factory):
    """The gateway URL; the gateway runs for the module and is always torn down."""
    try:
        import mlflow.gateway.cli  # noqa: F401  (needs mlflow[gateway]: watchfiles, gunicorn, ...)
    except ImportError as exc:
        pytest.skip(f"the MLflow gateway cannot run here: {exc} (install 'mlflow[gateway]')")
    if sys.platform == "win32":
        pytest.skip("the MLflow gateway does not run on Windows")

    home = tmp_path_factory.mktemp("gateway")
    config = home / "gateway.yaml"
    config.write_text(
        "endpoints:\n"
        "  - name: chat\n"
        "    endpoint_type: llm/v1/chat\n"
        "    model:\n"
        "      provider: openai\n"
        "      name: gpt-4o-mini\n"
        "      config:\n"
        "        openai_api_key: $FAKE_UPSTREAM_KEY\n"
        f"        openai_api_base: {upstream.base_url}\n"
    )
    port = free_port()
    env = {
        **os.environ,
        "FAKE_UPSTREAM_KEY": UPSTREAM_KEY,
        "HOME": str(home),  # gunicorn puts its control socket under ~/.gunicorn
        "MLFLOW_GATEWAY_API_BASE_ALLOW_PRIVATE_IPS": "true",  # the upstream is on loopback
        "MLFLOW_DISABLE_TELEMETRY": "true",
    }
    command = [sys.executable, "-m", "mlflow", "gateway", "start", "--config-path", str(config),
               "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    url = f"http://127.0.0.1:{port}"
    with serve(command, health_url=f"{url}/health", log_path=home / "gateway.log", env=env,
               timeout_s=START_TIMEOUT_S):
        yield url


@pytest.fixture
def backend(gateway, upstream):
    upstream.reset()
    return MlflowEndpointsBackend("chat", target_uri=gateway)


def ask(timeout=20.0, schema=None):
    return ChatRequest(
        messages=[
            {"role": "system", "content": "You are a strict grader."},
            {"role": "user", "content": "Is the claim supported?"},
        ],
        schema=schema,
        params={"temperature": 0.0, "max_tokens": 64},
        timeout=timeout,
    )


def test_valid_reply_round_trips(backend, upstream, gateway):
    assert isinstance(backend, ChatBackend)
    reply = backend.complete(ask())
    assert reply.text == '{"supported": true}'
    assert reply.model == "gpt-4o-mini-2024-07-18"
    assert (reply.tokens_in, reply.tokens_out) == (13, 4)
    assert reply.refusal is None

    [sent] = upstream.requests
    assert sent["path"] == "/v1/chat/completions"
    assert sent["headers"]["authorization"] == f"Bearer {UPSTREAM_KEY}"  # the gateway's key
    assert sent["body"]["model"] == "gpt-4o-mini"
    assert sent["body"]["messages"] == ask().messages
    assert (sent["body"]["temperature"], sent["body"]["max_tokens"]) == (0.0, 64)
    assert "response_format" not in sent["body"]
    assert backend.identity() == {"provider": "endpoints", "model": "chat", "base_url": gateway}


def test_schema_is_forwarded_when_enabled(gateway, upstream):
    upstream.reset()
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    MlflowEndpointsBackend("chat", target_uri=gateway, supports_schema=True).complete(ask(schema=schema))
    assert upstream.requests[0]["body"]["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "reply", "schema": schema, "strict": True},
    }


@pytest.mark.parametrize(("status", "kind"), [(429, "RateLimited"), (500, "ServerError"), (503, "ServerError")])
def test_upstream_failures_are_transient_after_one_attempt(backend, upstream, status, kind):
    upstream.reply = Reply(status, {"error": {"message": f"upstream says {status}"}}, {"Retry-After": "1"})
    with pytest.raises(TransientError) as info:
        backend.complete(ask())
    assert info.value.kind == kind
    assert f"upstream says {status}" in str(info.value)
    assert UPSTREAM_KEY not in str(info.value)
    # One attempt: the deployments client's own retries (7, with backoff) are bypassed.
    assert len(upstream.requests) == 1


def test_upstream_bad_request_is_permanent(backend, upstream):
    upstream.reply = Reply(400, {"error": {"message": "max_tokens is too large"}})
    with pytest.raises(PermanentError) as info:
        backend.complete(ask())
    assert info.value.kind == "BadRequest"


def test_unknown_endpoint_is_not_found(gateway):
    with pytest.raises(PermanentError) as info:
        MlflowEndpointsBackend("no-such-endpoint", target_uri=gateway).complete(ask())
    assert info.value.kind == "NotFound"


def test_slow_upstream_is_a_timeout(backend, upstream):
    upstream.reply = Reply(body=completion(), delay=5.0)
    started = time.monotonic()
    with pytest.raises(TransientError) as info:
        backend.complete(ask(timeout=0.5))
    assert info.value.kind == "Timeout"
    assert time.monotonic() - started < 4
    upstream.release()  # let the gateway's pending upstream call finish now
    time.sleep(0.1)


def test_connection_refused():
    backend = MlflowEndpointsBackend("chat", target_uri=f"http://127.0.0.1:{free_port()}")
    with pytest.raises(TransientError) as info:
        backend.complete(ask(timeout=2.0))
    assert info.value.kind == "ConnectionError"
    # Raised without __context__: requests' exception holds the request and its headers.
    assert info.value.__context__ is None and info.value.__cause__ is None


def test_target_from_env_and_judge_name(monkeypatch):
    monkeypatch.setenv("MLFLOW_DEPLOYMENTS_TARGET", "http://127.0.0.1:5999/")
    assert MlflowEndpointsBackend("chat").base_url == "http://127.0.0.1:5999"
    named = parse_endpoints_target("endpoints:/chat?target_uri=http://127.0.0.1:5001")
    assert (named.model, named.base_url) == ("chat", "http://127.0.0.1:5001")
    assert parse_endpoints_target("endpoints:/judge").base_url == "http://127.0.0.1:5999"
    # get_judge goes through the same parser: the name's target, not the environment's.
    from mlflow_rag_eval.judges import get_judge

    judge = get_judge("endpoints:/chat?target_uri=http://127.0.0.1:5001")
    assert (judge.backend.model, judge.backend.base_url) == ("chat", "http://127.0.0.1:5001")
    with pytest.raises(ValueError, match=r"allowed: \['concurrency', 'supports_schema', 'target_uri'\]"):
        parse_endpoints_target("endpoints:/chat?target=http://127.0.0.1:5001")
    monkeypatch.delenv("MLFLOW_DEPLOYMENTS_TARGET")
    with pytest.raises(ValueError, match="MLFLOW_DEPLOYMENTS_TARGET"):
        MlflowEndpointsBackend("chat")


class ScriptedClient:
    """A non-gateway deployments client (e.g. Databricks): only its public predict is used."""

    def __init__(self, outcome):
        self.outcome = outcome
        self.calls = []

    def predict(self, deployment_name=None, inputs=None, endpoint=None):
        self.calls.append((endpoint, inputs))
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome


def http_error(status, headers=None):
    response = requests.Response()
    response.status_code = status
    response.headers.update(headers or {})
    response._content = b'{"message": "nope"}'
    return requests.HTTPError(f"{status} Client Error. Response text: nope", response=response)


def timeout_error():
    from mlflow.exceptions import MlflowException

    try:
        try:
            raise requests.ReadTimeout("read timed out")
        except requests.ReadTimeout as cause:
            raise MlflowException("API request failed with timeout exception") from cause
    except MlflowException as first:
        try:  # predict() re-raises a timeout as a new MlflowException
            raise MlflowException("The provider has timed out") from None
        except MlflowException as second:
            second.__context__ = first
            return second


@pytest.mark.parametrize(
    ("outcome", "error", "kind", "retry_after"),
    [
        (http_error(429, {"Retry-After": "4"}), TransientError, "RateLimited", 4),
        (http_error(502), TransientError, "ServerError", None),
        (http_error(403), PermanentError, "AuthError", None),
        (timeout_error(), TransientError, "Timeout", None),
    ],
)
def test_other_clients_go_through_predict(outcome, error, kind, retry_after):
    backend = MlflowEndpointsBackend("judge", target_uri="databricks")
    backend._client = ScriptedClient(outcome)
    with pytest.raises(error) as info:
        backend.complete(ask())
    assert info.value.kind == kind
    assert getattr(info.value, "retry_after", None) == retry_after
    assert backend._client.calls == [("judge", {**ask().params, "messages": ask().messages})]


def test_other_clients_reply_is_parsed():
    backend = MlflowEndpointsBackend("judge", target_uri="databricks")
    backend._client = ScriptedClient(completion("yes"))
    reply = backend.complete(ask())
    assert (reply.text, reply.tokens_in, reply.tokens_out) == ("yes", 13, 4)


def test_a_credential_echoed_in_a_reply_is_redacted(monkeypatch):
    """A server that puts a token it was sent into its reply must not get it into the cache,
    justifications or reports: the backend replaces every credential it knows by ***."""
    token = "dapi-DO-NOT-STORE-0123456789"
    monkeypatch.setenv("DATABRICKS_TOKEN", token)
    backend = MlflowEndpointsBackend("judge", target_uri="databricks")
    backend._client = ScriptedClient(completion(f'{{"reason": "you sent {token}", "supported": true}}'))
    reply = backend.complete(ask())
    assert token not in reply.text
    assert reply.text == '{"reason": "you sent ***", "supported": true}'
