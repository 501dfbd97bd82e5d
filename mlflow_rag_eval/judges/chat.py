"""The narrow provider interface under every LLM judge.

A provider ("backend") turns one :class:`ChatRequest` into one :class:`ChatReply`, or raises
:class:`TransientError` (worth retrying: timeouts, 429, 5xx, refused connections) or
:class:`PermanentError` (not worth retrying: 4xx other than 429, a refusal, a bad model name).
Retries, backoff, caching, parsing, concurrency and accounting live above it, in
:class:`~mlflow_rag_eval.judges.llm.LLMJudge`, once for every provider. Provider SDKs are
imported only inside the backend that needs them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

__all__ = ["ChatBackend", "ChatReply", "ChatRequest", "PermanentError", "TransientError"]


@dataclass(frozen=True)
class ChatRequest:
    """One chat completion to make.

    Attributes:
        messages: ``[{"role": "system"|"user"|"assistant", "content": str}, ...]``.
        schema: JSON schema the reply must follow (for providers with structured output).
        schema_name: a short name for the schema (OpenAI's ``json_schema.name``).
        params: generation parameters (``temperature``, ``max_tokens``, ``seed``, ...).
        timeout: seconds for this attempt.
        template_id: which prompt template produced the messages (scripted backends and
            accounting use it; providers do not send it).
        variables: the template's variables, for scripted backends only.
    """

    messages: list[dict[str, str]]
    schema: dict[str, Any] | None = None
    schema_name: str = "reply"
    params: dict[str, Any] = field(default_factory=dict)
    timeout: float = 60.0
    template_id: str = ""
    variables: dict[str, Any] = field(default_factory=dict)


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


class TransientError(Exception):
    """A failure worth retrying (timeout, 429, 5xx, connection refused)."""

    def __init__(self, kind: str, message: str, retry_after: float | None = None):
        self.kind = kind
        self.retry_after = retry_after
        super().__init__(f"{kind}: {message}")


class PermanentError(Exception):
    """A failure not worth retrying (bad request, auth, unknown model, refusal)."""

    def __init__(self, kind: str, message: str):
        self.kind = kind
        super().__init__(f"{kind}: {message}")


@runtime_checkable
class ChatBackend(Protocol):
    """One provider connection. Identity fields go into cache keys and lineage."""

    provider: str  # "openai", "bedrock", "endpoints", "llamacpp", "scripted"
    model: str  # the model asked for
    base_url: str | None  # where requests go (None for in-process and SDK-routed providers)
    #: whether the provider enforces a JSON schema on its output
    supports_schema: bool
    #: a sane default for concurrent requests to this provider
    default_concurrency: int

    def complete(self, request: ChatRequest) -> ChatReply: ...

    def identity(self) -> dict[str, Any]:
        """Extra identity for the cache key and lineage (e.g. a GGUF file's sha256)."""
        ...
