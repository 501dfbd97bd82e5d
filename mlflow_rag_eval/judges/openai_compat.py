"""One backend for every server that speaks OpenAI's ``/chat/completions``.

OpenAI, Azure OpenAI, vLLM, Ollama, the llama.cpp server and LM Studio all accept the same
request, so one class with plain ``requests`` covers them. Each :meth:`complete` call makes
exactly one HTTP attempt and maps the outcome onto :mod:`~mlflow_rag_eval.judges.chat`'s
exceptions; retries, backoff, caching and parsing live in the layer above.

Structured output: when a request carries a schema and ``supports_schema`` is true, the
request asks for ``response_format={"type": "json_schema", ..., "strict": true}``. Servers that
do not know that field answer 400; such a 400 (whose body mentions ``response_format`` or
``json_schema``) raises ``PermanentError("SchemaUnsupported", ...)``, the signal for the layer
above to fall back to prompt-and-parse. ``{"type": "json_object"}`` is never sent: several
local servers reject it, and prompt-and-parse already covers the case.

The API key is read from the environment variable ``api_key_env`` on every request and is
never stored on the backend, shown in its ``repr``, its ``identity()`` or any error message.
"""

from __future__ import annotations

import email.utils
import os
import re
import threading
import time
from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from mlflow_rag_eval.judges.chat import ChatReply, ChatRequest, PermanentError, TransientError

__all__ = [
    "OpenAICompatBackend",
    "error_for_status",
    "parse_chat_completion",
    "parse_openai_target",
    "parse_retry_after",
    "scrub",
]

DEFAULT_BASE_URL = "https://api.openai.com/v1"
#: How much of an error body goes into an exception message.
_DETAIL_CHARS = 300
_SCHEMA_WORDS = re.compile(r"response_format|json_schema", re.I)


def parse_retry_after(headers: Any, now: float | None = None) -> float | None:
    """Seconds to wait from a response's ``Retry-After`` (or OpenAI's ``retry-after-ms``).

    ``Retry-After`` is either a number of seconds or an HTTP date; a date in the past gives 0.
    Anything unreadable gives None (the layer above then uses its own backoff).
    """
    if headers is None:
        return None
    millis = headers.get("retry-after-ms")
    if millis is not None:
        try:
            return max(0.0, float(millis) / 1000.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def scrub(text: str, secrets: tuple[str | None, ...] = ()) -> str:
    """``text`` cut to a readable length, with every secret in it replaced by ``***``.

    Servers echo request details in error bodies (OpenAI's 401 names the key it was given), so
    any text that reaches an exception goes through here.
    """
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    text = " ".join(text.split())
    return text if len(text) <= _DETAIL_CHARS else text[: _DETAIL_CHARS - 3] + "..."


def error_for_status(
    status: int, headers: Any, detail: str, *, schema_sent: bool = False
) -> TransientError | PermanentError:
    """The exception for a non-2xx HTTP answer (``detail`` must already be scrubbed).

    429 is ``RateLimited`` and 5xx ``ServerError`` (both with ``retry_after`` from the
    headers), 408 ``Timeout``; 401/403 ``AuthError``, 404 ``NotFound``; a 400/422 about
    ``response_format``/``json_schema`` after a schema was sent is ``SchemaUnsupported``;
    any other 4xx is ``BadRequest``.
    """
    message = f"HTTP {status}: {detail}" if detail else f"HTTP {status}"
    if status == 429:
        return TransientError("RateLimited", message, retry_after=parse_retry_after(headers))
    if status >= 500:
        return TransientError("ServerError", message, retry_after=parse_retry_after(headers))
    if status == 408:
        return TransientError("Timeout", message)
    if status in (401, 403):
        return PermanentError("AuthError", message)
    if status == 404:
        return PermanentError("NotFound", message)
    if schema_sent and status in (400, 422) and _SCHEMA_WORDS.search(detail):
        return PermanentError("SchemaUnsupported", message)
    return PermanentError("BadRequest", message)


def _redact_url(url: str) -> str:
    """The URL without any ``user:password@`` part (it may be logged and cached)."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))


def _schema_name(name: str) -> str:
    # OpenAI accepts ^[a-zA-Z0-9_-]{1,64}$ for json_schema.name.
    return re.sub(r"[^A-Za-z0-9_-]", "_", name)[:64] or "reply"


def _text_of(content: Any) -> str:
    """A message's content as text (some servers answer a list of content parts)."""
    if content is None:
        return ""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)


class OpenAICompatBackend:
    """A judge backend for any OpenAI-compatible ``/chat/completions`` server.

    Args:
        model: the model name sent in the request (the deployment name for Azure).
        base_url: the API root, e.g. ``http://127.0.0.1:8000/v1`` for vLLM or
            ``http://127.0.0.1:11434/v1`` for Ollama; default ``$OPENAI_BASE_URL``, else
            OpenAI's. For Azure, the resource root ``https://<name>.openai.azure.com``.
        api_key_env: the environment variable holding the key. Unset or empty: no
            ``Authorization`` header (local servers need none).
        azure_api_version: set for Azure OpenAI: requests go to
            ``{base_url}/openai/deployments/{model}/chat/completions?api-version=...`` with an
            ``api-key`` header instead of a bearer token.
        headers: extra HTTP headers (never logged or part of the identity).
        supports_schema: whether to ask the server for strict JSON-schema output.
        response_format: how to ask for it: ``"json_schema"`` (OpenAI's
            ``{"type": "json_schema", "json_schema": {...}}``) or ``"json_object"``
            (``{"type": "json_object", "schema": {...}}``, the form llama-cpp-python's server
            turns into a grammar; it answers 500 to the OpenAI form).
        default_concurrency: the concurrency the layer above uses unless told otherwise.
    """

    provider = "openai"

    def __init__(
        self,
        model: str,
        base_url: str | None = None,
        api_key_env: str = "OPENAI_API_KEY",
        *,
        azure_api_version: str | None = None,
        headers: dict[str, str] | None = None,
        supports_schema: bool = True,
        response_format: str = "json_schema",
        default_concurrency: int = 8,
    ):
        if not model:
            raise ValueError("OpenAICompatBackend needs a model name")
        self.model = model
        root = (base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL).rstrip("/")
        # Requests go to the URL as given; base_url (shown, logged, cached) drops user:password.
        self._request_root = root
        self.base_url = _redact_url(root)
        self.api_key_env = api_key_env
        self.azure_api_version = azure_api_version
        self._headers = dict(headers or {})
        self.supports_schema = supports_schema
        if response_format not in RESPONSE_FORMATS:
            raise ValueError(f"response_format must be one of {RESPONSE_FORMATS}, got {response_format!r}")
        self.response_format = response_format
        self.default_concurrency = default_concurrency
        self._local = threading.local()  # one requests.Session per thread

    def __repr__(self) -> str:
        azure = f", azure_api_version={self.azure_api_version!r}" if self.azure_api_version else ""
        return (
            f"OpenAICompatBackend(model={self.model!r}, base_url={self.base_url!r}, "
            f"api_key_env={self.api_key_env!r}{azure})"
        )

    def identity(self) -> dict[str, Any]:
        ident = {"provider": self.provider, "model": self.model, "base_url": self.base_url}
        if self.response_format != "json_schema":
            ident["response_format"] = self.response_format
        if self.azure_api_version:
            ident["azure_api_version"] = self.azure_api_version
        return ident

    # -- one attempt -----------------------------------------------------------------------

    def _session(self):
        import requests

        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = requests.Session()
        return session

    def _url_and_auth(self, key: str | None) -> tuple[str, dict[str, str], dict[str, str]]:
        headers = {"Content-Type": "application/json", **self._headers}
        if self.azure_api_version:
            root = self._request_root.removesuffix("/openai")
            url = f"{root}/openai/deployments/{self.model}/chat/completions"
            if key:
                headers["api-key"] = key
            return url, {"api-version": self.azure_api_version}, headers
        if key:
            headers["Authorization"] = f"Bearer {key}"
        return f"{self._request_root}/chat/completions", {}, headers

    def body(self, request: ChatRequest) -> dict[str, Any]:
        """The JSON body sent for ``request`` (public so tests and lineage can show it)."""
        body: dict[str, Any] = {**request.params, "model": self.model, "messages": request.messages}
        if request.schema is not None and self.supports_schema and self.response_format == "json_object":
            body["response_format"] = {"type": "json_object", "schema": request.schema}
        elif request.schema is not None and self.supports_schema:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {
                    "name": _schema_name(request.schema_name),
                    "schema": request.schema,
                    "strict": True,
                },
            }
        return body

    def complete(self, request: ChatRequest) -> ChatReply:
        import requests

        key = os.environ.get(self.api_key_env) or None
        secrets = (key,)
        url, query, headers = self._url_and_auth(key)
        body = self.body(request)
        where = f"{self.base_url} ({self.model})"
        failure: Exception | None = None
        try:
            response = self._session().post(
                url, params=query, json=body, headers=headers, timeout=request.timeout
            )
        except requests.exceptions.Timeout as exc:  # ConnectTimeout and ReadTimeout
            failure = TransientError(
                "Timeout", f"{where}: no answer within {request.timeout:g}s ({type(exc).__name__})"
            )
        except (requests.exceptions.InvalidURL, requests.exceptions.MissingSchema) as exc:
            failure = PermanentError("BadRequest", f"{where}: invalid URL ({type(exc).__name__})")
        except requests.exceptions.RequestException as exc:  # refused, reset, DNS, broken body
            failure = TransientError(
                "ConnectionError", f"{where}: {type(exc).__name__}: {scrub(str(exc), secrets)}"
            )
        if failure is not None:
            # Raised outside the except block so that no __context__ links to requests'
            # exception, whose .request still holds the Authorization header.
            raise failure

        try:
            payload = response.json()
        except ValueError:
            payload = None

        if response.status_code >= 400:
            detail = scrub(_error_detail(payload, response.text), secrets)
            if _is_content_filter(payload):  # Azure's prompt filter answers 400
                return ChatReply(text="", model=self.model, refusal=detail or "content_filter")
            raise error_for_status(
                response.status_code,
                response.headers,
                f"{where}: {detail}",
                schema_sent="response_format" in body,
            )
        if not isinstance(payload, dict):
            raise TransientError(
                "ServerError", f"{where}: HTTP {response.status_code} without a JSON body"
            )
        return parse_chat_completion(payload, default_model=self.model, where=where)


def _error_detail(payload: Any, text: str) -> str:
    if isinstance(payload, dict):
        error = payload.get("error", payload.get("detail", payload.get("message")))
        if isinstance(error, dict):
            return str(error.get("message") or error)
        if error:
            return str(error)
    return text or ""


def _is_content_filter(payload: Any) -> bool:
    error = payload.get("error") if isinstance(payload, dict) else None
    return isinstance(error, dict) and error.get("code") == "content_filter"


def parse_chat_completion(payload: dict[str, Any], *, default_model: str, where: str) -> ChatReply:
    """A :class:`ChatReply` from an OpenAI-style chat completion (also the MLflow gateway's)."""
    choices = payload.get("choices") or []
    if not choices or not isinstance(choices[0], dict):
        raise TransientError("ServerError", f"{where}: reply without choices")
    choice = choices[0]
    message = choice.get("message") or {}
    refusal = message.get("refusal") or None
    if refusal is None and choice.get("finish_reason") == "content_filter":
        refusal = "content_filter"
    usage = payload.get("usage") or {}
    return ChatReply(
        text=_text_of(message.get("content")),
        model=payload.get("model") or default_model,
        system_fingerprint=payload.get("system_fingerprint"),
        tokens_in=usage.get("prompt_tokens"),
        tokens_out=usage.get("completion_tokens"),
        refusal=refusal,
    )


_TARGET_OPTIONS = {
    "base_url", "api_key_env", "azure_api_version", "supports_schema", "response_format", "concurrency",
}
RESPONSE_FORMATS = ("json_schema", "json_object")


def parse_openai_target(spec: str) -> OpenAICompatBackend:
    """A backend from a judge name.

    Forms: ``openai:/gpt-4o-mini``; options go in a query string, e.g.
    ``openai:/my-model?base_url=http://127.0.0.1:8080/v1`` or
    ``openai:/gpt4o-deployment?base_url=https://x.openai.azure.com&azure_api_version=2024-10-21``
    (add ``&api_key_env=AZURE_OPENAI_API_KEY`` to read the key from another variable).
    Options: ``base_url``, ``api_key_env``, ``azure_api_version``, ``supports_schema``
    (``true``/``false``), ``response_format`` (``json_schema``, the default, or ``json_object``
    for llama-cpp-python's server: ``openai:/smollm2?base_url=...&response_format=json_object``),
    ``concurrency``. Everything after the first ``?`` is options, so a
    ``base_url`` with its own query string must be percent-encoded. A key is never accepted
    in the name (names are logged): use ``api_key_env``.
    """
    scheme, sep, rest = spec.partition(":")
    if scheme != "openai" or not sep:
        raise ValueError(f"not an openai judge name: {spec!r} (expected 'openai:/<model>')")
    rest = rest[1:] if rest.startswith("/") else rest
    model, _, query = rest.partition("?")
    if not model:
        raise ValueError(f"no model in judge name {spec!r} (expected 'openai:/<model>')")
    options = dict(parse_qsl(query, keep_blank_values=True))
    unknown = set(options) - _TARGET_OPTIONS
    if unknown:
        hint = " (keys come from the environment: use api_key_env=)" if any(
            "key" in k and k != "api_key_env" for k in unknown
        ) else ""
        raise ValueError(
            f"unknown option(s) {sorted(unknown)} in judge name; allowed: {sorted(_TARGET_OPTIONS)}{hint}"
        )
    kwargs: dict[str, Any] = {}
    if "supports_schema" in options:
        value = options["supports_schema"].lower()
        if value not in ("true", "false", "1", "0"):
            raise ValueError(f"supports_schema must be true or false, got {value!r}")
        kwargs["supports_schema"] = value in ("true", "1")
    if "concurrency" in options:
        kwargs["default_concurrency"] = int(options["concurrency"])
    if "response_format" in options:
        kwargs["response_format"] = options["response_format"]
    return OpenAICompatBackend(
        model,
        base_url=options.get("base_url") or None,
        api_key_env=options.get("api_key_env") or "OPENAI_API_KEY",
        azure_api_version=options.get("azure_api_version") or None,
        **kwargs,
    )
