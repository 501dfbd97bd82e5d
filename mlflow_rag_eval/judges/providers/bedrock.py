"""Amazon Bedrock judges through the ``bedrock-runtime`` Converse API.

Converse gives one request shape for every Bedrock chat model. Each :meth:`complete` makes
exactly one attempt: the clients this backend creates have botocore's own retries turned off
(``total_max_attempts=1``), since retries and backoff live in the layer above. A client passed
in by the caller is used as is, its retry settings included.

Region and credentials come from the usual AWS configuration (environment, profile, instance
role) through ``boto3.Session``; nothing secret is stored on the backend, and the secret key
and session token boto3 resolved are hidden by the redactor in every reply and error. boto3 is imported on
first use, never at package import.

Generation parameters map as ``temperature``, ``max_tokens`` -> ``maxTokens``, ``top_p`` ->
``topP``, ``stop`` -> ``stopSequences``; Converse has no ``seed``, so it and any other
parameter are not sent. A ``content_filtered`` or ``guardrail_intervened`` stop reason is a
refusal. Structured output (Converse ``outputConfig.textFormat``) is asked for only with
``supports_schema=True``, because model support varies; a ValidationException about it raises
``PermanentError("SchemaUnsupported", ...)`` so the layer above can fall back to
prompt-and-parse.
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any

from mlflow_rag_eval._util.redaction import redact, remember, scrub
from mlflow_rag_eval.judges.llm.chat import ChatReply, ChatRequest, PermanentError, TransientError
from mlflow_rag_eval.judges.registry import as_bool, as_int, backend_options, register_judge_provider

__all__ = ["BedrockBackend", "parse_bedrock_target"]

_REFUSAL_STOPS = {"content_filtered", "guardrail_intervened"}
_TRANSIENT_CODES = {
    "ThrottlingException": "RateLimited",
    "TooManyRequestsException": "RateLimited",
    "ServiceQuotaExceededException": "RateLimited",
    "ServiceUnavailableException": "ServerError",
    "InternalServerException": "ServerError",
    "ModelNotReadyException": "ServerError",
    # 424: the model failed while processing; a later attempt usually succeeds.
    "ModelErrorException": "ServerError",
    "ModelTimeoutException": "Timeout",
}
_PERMANENT_CODES = {
    "ValidationException": "BadRequest",
    "AccessDeniedException": "AuthError",
    "UnrecognizedClientException": "AuthError",
    "ExpiredTokenException": "AuthError",
    "ResourceNotFoundException": "NotFound",
}
_SCHEMA_WORDS = re.compile(r"outputConfig|textFormat|json_?schema|structured output", re.I)
#: Options of a ``bedrock:/`` judge name and their types.
_TARGET_OPTIONS = {"region_name": str, "profile_name": str, "supports_schema": as_bool, "concurrency": as_int}


class BedrockBackend:
    """A judge backend for one Bedrock model (or inference profile) via Converse.

    Args:
        model_id: a model id, inference-profile id or ARN, e.g.
            ``anthropic.claude-3-5-haiku-20241022-v1:0`` or ``us.amazon.nova-lite-v1:0``.
        region_name / profile_name: passed to ``boto3.Session``; default: the AWS
            configuration's.
        client: a ready ``bedrock-runtime`` client (its region is used; its retries are its own).
        default_concurrency: the concurrency the layer above uses unless told otherwise.
        supports_schema: ask Converse for JSON-schema output (``outputConfig.textFormat``).
    """

    provider = "bedrock"
    base_url = None

    def __init__(
        self,
        model_id: str,
        *,
        region_name: str | None = None,
        profile_name: str | None = None,
        client: Any = None,
        default_concurrency: int = 4,
        supports_schema: bool = False,
    ):
        if not model_id:
            raise ValueError("BedrockBackend needs a model id")
        self.model = model_id
        self.region_name = region_name
        self.profile_name = profile_name
        self.default_concurrency = default_concurrency
        self.supports_schema = supports_schema
        self._client = client
        self._clients: dict[float, Any] = {}  # per read timeout; clients are thread-safe
        self._lock = threading.Lock()  # boto3.Session is not thread-safe
        self._session = None

    def __repr__(self) -> str:
        # No region lookup here: a repr must not import boto3 or read the AWS configuration.
        return f"BedrockBackend(model_id={self.model!r}, region_name={self.region_name!r})"

    def _boto_session(self):
        if self._session is None:
            import boto3

            self._session = boto3.Session(
                region_name=self.region_name, profile_name=self.profile_name
            )
        return self._session

    def region(self) -> str | None:
        """The region requests go to (resolved from the AWS configuration when not given)."""
        if self._client is not None:
            return self._client.meta.region_name
        if self.region_name:
            return self.region_name
        with self._lock:
            return self._boto_session().region_name

    def identity(self) -> dict[str, Any]:
        return {
            "provider": self.provider,
            "model": self.model,
            "base_url": None,
            "region": self.region(),
        }

    def client_for(self, timeout: float):
        """The ``bedrock-runtime`` client used for a request with this timeout."""
        if self._client is not None:
            return self._client
        with self._lock:
            client = self._clients.get(timeout)
            if client is None:
                from botocore.config import Config

                config = Config(
                    read_timeout=timeout,
                    connect_timeout=min(timeout, 10.0),
                    retries={"total_max_attempts": 1, "mode": "standard"},
                )
                client = self._boto_session().client("bedrock-runtime", config=config)
                self._clients[timeout] = client
                _remember_credentials(self._boto_session().get_credentials())
            return client

    def converse_kwargs(self, request: ChatRequest) -> dict[str, Any]:
        """The keyword arguments of ``client.converse`` for ``request``."""
        system = [{"text": m["content"]} for m in request.messages if m["role"] == "system"]
        messages: list[dict[str, Any]] = []
        for m in request.messages:
            if m["role"] == "system":
                continue
            role = "assistant" if m["role"] == "assistant" else "user"
            if messages and messages[-1]["role"] == role:  # Converse wants alternating turns
                messages[-1]["content"].append({"text": m["content"]})
            else:
                messages.append({"role": role, "content": [{"text": m["content"]}]})
        kwargs: dict[str, Any] = {"modelId": self.model, "messages": messages}
        if system:
            kwargs["system"] = system
        params = request.params
        inference = {
            name: params[key]
            for key, name in (("max_tokens", "maxTokens"), ("temperature", "temperature"), ("top_p", "topP"))
            if params.get(key) is not None
        }
        if params.get("stop"):
            stop = params["stop"]
            inference["stopSequences"] = [stop] if isinstance(stop, str) else list(stop)
        if inference:
            kwargs["inferenceConfig"] = inference
        if request.schema is not None and self.supports_schema:
            kwargs["outputConfig"] = {
                "textFormat": {
                    "type": "json_schema",
                    "structure": {
                        "jsonSchema": {
                            "schema": json.dumps(request.schema),
                            "name": request.schema_name,
                        }
                    },
                }
            }
        return kwargs

    def complete(self, request: ChatRequest) -> ChatReply:
        kwargs = self.converse_kwargs(request)
        client = self.client_for(request.timeout)
        if client is self._client:  # the caller's client: its signer holds what it sends
            signer = getattr(client, "_request_signer", None)
            _remember_credentials(getattr(signer, "_credentials", None))
        try:
            response = client.converse(**kwargs)
        except Exception as exc:  # botocore's exception classes are imported lazily, below
            mapped = self._map_error(exc, schema_sent="outputConfig" in kwargs)
            if mapped is None:
                raise  # not a botocore error: a bug, not a provider answer
            raise mapped from None
        blocks = response.get("output", {}).get("message", {}).get("content", [])
        text = "".join(block.get("text", "") for block in blocks)
        stop = response.get("stopReason")
        usage = response.get("usage") or {}
        text = redact(text)
        return ChatReply(
            text=text,
            model=self.model,
            tokens_in=usage.get("inputTokens"),
            tokens_out=usage.get("outputTokens"),
            refusal=redact(str(text or stop)) if stop in _REFUSAL_STOPS else None,
        )

    def _map_error(self, exc: Exception, *, schema_sent: bool) -> Exception | None:
        from botocore import exceptions as bce

        where = f"bedrock {self.model}"
        if isinstance(exc, bce.ClientError):
            error = exc.response.get("Error", {})
            code = error.get("Code", "")
            message = f"{where}: {scrub(str(code))}: {scrub(str(error.get('Message', '')))}"
            meta = exc.response.get("ResponseMetadata", {})
            status = meta.get("HTTPStatusCode") or 0
            if code in _TRANSIENT_CODES or status == 429 or status >= 500:
                from mlflow_rag_eval.judges.providers.openai import parse_retry_after

                kind = _TRANSIENT_CODES.get(code) or ("RateLimited" if status == 429 else "ServerError")
                retry_after = parse_retry_after(meta.get("HTTPHeaders") or {})
                return TransientError(kind, message, retry_after=retry_after)
            if schema_sent and code == "ValidationException" and _SCHEMA_WORDS.search(message):
                return PermanentError("SchemaUnsupported", message)
            kind = _PERMANENT_CODES.get(code) or {401: "AuthError", 403: "AuthError", 404: "NotFound"}.get(
                status, "BadRequest"
            )
            return PermanentError(kind, message)
        # ConnectTimeoutError is also a ConnectionError: test the timeouts first.
        if isinstance(exc, (bce.ReadTimeoutError, bce.ConnectTimeoutError)):
            return TransientError("Timeout", f"{where}: {type(exc).__name__}")
        if isinstance(exc, (bce.EndpointConnectionError, bce.ConnectionError, bce.HTTPClientError)):
            return TransientError("ConnectionError", f"{where}: {type(exc).__name__}: {scrub(str(exc))}")
        if isinstance(exc, (bce.NoCredentialsError, bce.PartialCredentialsError)):
            return PermanentError("AuthError", f"{where}: no AWS credentials found")
        if isinstance(exc, bce.NoRegionError):
            return PermanentError("BadRequest", f"{where}: no AWS region configured")
        if isinstance(exc, bce.BotoCoreError):  # ParamValidationError and the like
            return PermanentError("BadRequest", f"{where}: {type(exc).__name__}: {scrub(str(exc))}")
        return None


def _remember_credentials(credentials: Any) -> None:
    """Add the secret key and session token boto3 resolved to what the redactor hides (they
    may come from a profile or an instance role, not the environment)."""
    try:
        frozen = credentials.get_frozen_credentials() if credentials is not None else None
    except Exception:  # a refresh that fails here fails again, and is reported, on the call
        return
    if frozen is not None:
        remember(frozen.secret_key, frozen.token)


@register_judge_provider("bedrock")
def parse_bedrock_target(spec: str) -> BedrockBackend:
    """A backend from a judge name: ``bedrock:/<model id>``, options as a query string.

    Example: ``bedrock:/anthropic.claude-3-5-haiku-20241022-v1:0?region_name=us-west-2``.
    Options: ``region_name``, ``profile_name`` (both passed to ``boto3.Session``; default: the
    AWS configuration's), ``supports_schema`` (``true``/``false``), ``concurrency`` (the
    backend's default concurrency). Model ids contain ``:``; only the first one (after
    ``bedrock``) separates the scheme. Credentials come from the AWS configuration, never
    from the name.
    """
    model_id, options = backend_options(spec, "bedrock", _TARGET_OPTIONS, "model id", "model id")
    return BedrockBackend(model_id, **options)
