"""The narrow provider interface under every LLM judge.

A provider ("backend") turns one :class:`ChatRequest` into one :class:`ChatReply`, or raises
:class:`TransientError` (worth retrying: timeouts, 429, 5xx, refused connections) or
:class:`PermanentError` (not worth retrying: 4xx other than 429, a refusal, a bad model name).
Retries, backoff, caching, parsing, concurrency and accounting live above it, in
:class:`~mlflow_rag_eval.judges.llm.judge.LLMJudge`, once for every provider. Provider SDKs are
imported only inside the backend that needs them.

A request that never reached a server able to answer (refused, reset, host not found, no
connection within the connect timeout) is a ``TransientError`` of kind :data:`CONNECTION_ERROR`:
the judge counts those to declare a provider unreachable, so backends must use that kind for
them and only for them (a slow server is ``Timeout``, an HTTP error status is not either).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

from mlflow_rag_eval._util.redaction import redact

__all__ = [
    "CONNECTION_ERROR",
    "RESPONSE_FORMATS",
    "ChatBackend",
    "ChatReply",
    "ChatRequest",
    "PermanentError",
    "TransientError",
    "redacted",
]

#: The kind of a TransientError for a request that never reached a server able to answer.
CONNECTION_ERROR = "ConnectionError"
#: How a schema can be asked for: OpenAI's ``json_schema``, or ``json_object`` with the schema
#: beside it (llama-cpp-python's server turns that into a grammar).
RESPONSE_FORMATS = ("json_schema", "json_object")


@dataclass(frozen=True)
class ChatRequest:
    """One chat completion to make.

    Attributes:
        messages: ``[{"role": "system"|"user"|"assistant", "content": str}, ...]``.
        schema: JSON schema the reply must follow (for providers with structured output).
        schema_name: a short name for the schema (OpenAI's ``json_schema.name``).
        params: generation parameters (``temperature``, ``max_tokens``, ``seed``, ...).
        timeout: total seconds for this attempt (connecting, sending, waiting and reading the
            reply together). HTTP backends enforce it as wall-clock time, not per socket read:
            a server that trickles its reply must not hold a row past the judge's deadline.
        template_id: which prompt template produced the messages (scripted backends and
            accounting use it; providers do not send it).
        variables: the template's variables, for scripted backends only.
        response_format: how to ask for the schema, one of :data:`RESPONSE_FORMATS`, or None
            for the backend's own choice. The judge sets it when it falls back from a format
            the server refused; backends with a single way of asking ignore it.
    """

    messages: list[dict[str, str]]
    schema: dict[str, Any] | None = None
    schema_name: str = "reply"
    params: dict[str, Any] = field(default_factory=dict)
    timeout: float = 60.0
    template_id: str = ""
    variables: dict[str, Any] = field(default_factory=dict)
    response_format: str | None = None


@dataclass(frozen=True)
class ChatReply:
    """What a provider answered.

    Attributes:
        text: the reply's text (JSON expected; parsing happens above the provider).
        model: the model id the provider reports having used (may differ from the asked one).
        system_fingerprint: OpenAI's ``system_fingerprint`` or the provider's equivalent.
        tokens_in / tokens_out: usage as the provider reports it (None when it does not).
        refusal: the provider's refusal message, when the model refused.
    """

    text: str
    model: str | None = None
    system_fingerprint: str | None = None
    tokens_in: int | None = None
    tokens_out: int | None = None
    refusal: str | None = None


def redacted(reply: ChatReply) -> ChatReply:
    """``reply`` with every secret the process holds hidden in its texts: whatever backend
    answered (a caller's own included), nothing it echoes reaches a verdict, the cache or a log."""
    return replace(
        reply,
        text=redact(reply.text),
        refusal=redact(reply.refusal) if reply.refusal else reply.refusal,
        model=redact(reply.model) if isinstance(reply.model, str) else reply.model,
        system_fingerprint=redact(reply.system_fingerprint) if reply.system_fingerprint else reply.system_fingerprint,
    )


class TransientError(Exception):
    """A failure worth retrying (timeout, 429, 5xx, connection refused).

    ``str()`` is ``"<kind>: <message>"``; ``message`` alone is kept so that the layer above,
    which names failures by kind too, never prefixes the kind a second time.
    """

    def __init__(self, kind: str, message: str, retry_after: float | None = None):
        self.kind = kind
        self.message = message = redact(message)  # whoever raises it, no secret goes further
        self.retry_after = retry_after
        super().__init__(f"{kind}: {message}")


class PermanentError(Exception):
    """A failure not worth retrying (bad request, auth, unknown model, refusal).

    ``str()`` is ``"<kind>: <message>"``; ``message`` is the text without the kind.
    """

    def __init__(self, kind: str, message: str):
        self.kind = kind
        self.message = message = redact(message)
        super().__init__(f"{kind}: {message}")


@runtime_checkable
class ChatBackend(Protocol):
    """One provider connection. Identity fields go into cache keys and lineage."""

    provider: str  # "openai", "bedrock", "endpoints", "llamacpp", "scripted"
    model: str  # the model asked for
    base_url: str | None  # where requests go (None for in-process and SDK-routed providers)
    #: whether the provider enforces a JSON schema on its output. A backend that can ask in
    #: more than one way lists them in an optional ``response_formats`` attribute (a tuple
    #: from :data:`RESPONSE_FORMATS`) and honours ``ChatRequest.response_format``.
    supports_schema: bool
    #: a sane default for concurrent requests to this provider
    default_concurrency: int

    def complete(self, request: ChatRequest) -> ChatReply: ...

    def identity(self) -> dict[str, Any]:
        """Extra identity for the cache key and lineage (e.g. a GGUF file's sha256)."""
        ...
