"""One backend for every server that speaks OpenAI's ``/chat/completions``.

OpenAI, Azure OpenAI, vLLM, Ollama, the llama.cpp server and LM Studio all accept the same
request, so one class with plain ``requests`` covers them. Each :meth:`complete` call makes
exactly one HTTP attempt and maps the outcome onto :mod:`~mlflow_rag_eval.judges.llm.chat`'s
exceptions; retries, backoff, caching and parsing live in the layer above.

Time: a request's ``timeout`` is the attempt's total wall-clock budget. requests' own timeouts
bound each socket operation, so a server sending one byte every half second never trips them;
here a timer shuts the attempt's connection down when the budget runs out (see
:class:`AttemptClock`), which wakes the blocked read at once and gives ``Timeout``. Connecting
has its own shorter limit (``connect_timeout``); a refused, reset or unresolvable connection,
or none within that limit, is ``ConnectionError`` (:data:`~.chat.CONNECTION_ERROR`), the kind the
layer above counts to declare a server unreachable. Replies are read up to
:data:`MAX_REPLY_BYTES`.

Structured output: when a request carries a schema and ``supports_schema`` is true, the
request asks for ``response_format={"type": "json_schema", ..., "strict": true}``, or for
``{"type": "json_object", "schema": ...}`` (llama-cpp-python's grammar form) when the backend
or the request says ``json_object``. A 4xx or 5xx whose body names ``response_format``,
``json_schema`` or ``json_object`` after a schema was sent raises
``PermanentError("SchemaUnsupported", ...)``: llama-cpp-python's server answers 500 to the
OpenAI form, so a 5xx of that kind is no reason to retry. The layer above then falls back to
``json_object``, then to prompt-and-parse.

The API key is read from the environment variable ``api_key_env`` on every request and is
never stored on the backend, shown in its ``repr``, its ``identity()`` or any error message;
a reply that echoes it, as written, JSON-escaped or URL-encoded, gets ``***`` in its place, so
no cache entry, justification or report can hold it. The same holds for every header value
sent (``headers=`` included) and every other credential the process holds, in any common
encoding (see :mod:`mlflow_rag_eval._util.redaction`). A ``base_url`` with a query string,
``;`` parameters or ``user:password@`` is refused: base_url is logged and stored. Redirects are followed within the server's origin only; one to another origin is a
``PermanentError("CrossOriginRedirect")``: requests would send the ``api-key`` header (it drops
only ``Authorization``) and the texts under evaluation to a server nobody configured.
"""

from __future__ import annotations

import email.utils
import os
import re
import threading
import time
from typing import Any

from mlflow_rag_eval._util.redaction import remember
from mlflow_rag_eval.judges.llm.chat import (
    RESPONSE_FORMATS,
    ChatReply,
    ChatRequest,
    PermanentError,
    TransientError,
)
from mlflow_rag_eval.judges.llm.usage import token_count
from mlflow_rag_eval.judges.providers._http_attempt import (  # scrub and redact are re-exported
    Answer,
    AttemptClock,
    read_body,
    redact,
    same_origin_session_class,
    scrub,
    transport_failure,
    watched_adapter_class,
)
from mlflow_rag_eval.judges.registry import (
    as_bool,
    as_int,
    as_positive_float,
    as_url,
    backend_options,
    register_judge_provider,
    url_refusal,
)

__all__ = [
    "OpenAICompatBackend",
    "error_for_status",
    "parse_chat_completion",
    "parse_openai_target",
    "parse_retry_after",
    "redact",
    "scrub",
]

DEFAULT_BASE_URL = "https://api.openai.com/v1"
_SCHEMA_WORDS = re.compile(r"response_format|json_schema|json_object", re.I)
#: Seconds to establish a connection, capped by the attempt's budget. A server that takes
#: longer to accept is treated as unreachable, not slow.
DEFAULT_CONNECT_TIMEOUT = 10.0


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


def error_for_status(
    status: int, headers: Any, detail: str, *, schema_sent: bool = False
) -> TransientError | PermanentError:
    """The exception for a non-2xx HTTP answer (``detail`` must already be scrubbed).

    429 is ``RateLimited``, 408 ``Timeout``, 401/403 ``AuthError``, 404 ``NotFound``. After a
    schema was sent, any other 4xx *or 5xx* whose detail names ``response_format``,
    ``json_schema`` or ``json_object`` is ``SchemaUnsupported`` (permanent: the same request
    fails the same way; llama-cpp-python's server answers 500 to the OpenAI form). Other 5xx
    are ``ServerError`` (with ``retry_after`` from the headers), other 4xx ``BadRequest``.
    """
    message = f"HTTP {status}: {detail}" if detail else f"HTTP {status}"
    if status == 429:
        return TransientError("RateLimited", message, retry_after=parse_retry_after(headers))
    if status == 408:
        return TransientError("Timeout", message)
    if status in (401, 403):
        return PermanentError("AuthError", message)
    if status == 404:
        return PermanentError("NotFound", message)
    if schema_sent and _SCHEMA_WORDS.search(detail):
        return PermanentError("SchemaUnsupported", message)
    if status >= 500:
        return TransientError("ServerError", message, retry_after=parse_retry_after(headers))
    return PermanentError("BadRequest", message)


def _schema_name(name: str) -> str:
    # OpenAI accepts ^[a-zA-Z0-9_-]{1,64}$ for json_schema.name.
    return re.sub(r"[^A-Za-z0-9_-]", "_", name)[:64] or "reply"


def _text_of(content: Any) -> str:
    """A message's content as text (some servers answer a list of content parts)."""
    if content is None:
        return ""
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
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
            turns into a grammar; it answers 500 to the OpenAI form). A request's own
            ``response_format`` (set by the judge after a fallback) takes precedence.
        default_concurrency: the concurrency the layer above uses unless told otherwise.
        default_rate_limit: requests per second the layer above keeps to unless told otherwise
            (None: no limit).
        connect_timeout: seconds to establish a connection (capped by the attempt's budget).
    """

    provider = "openai"
    #: the ways this backend can ask for a schema (the judge's fallback order)
    response_formats = RESPONSE_FORMATS

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
        default_rate_limit: float | None = None,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    ):
        if not model:
            raise ValueError("OpenAICompatBackend needs a model name")
        self.model = model
        root = (base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL).rstrip("/")
        refused = url_refusal(root)
        if refused:  # base_url is shown, logged, cached, and written to the lineage and the report
            raise ValueError(f"base_url has {refused}; refused (base_url is logged and stored): put a key in "
                             "the environment variable named by api_key_env, other credentials in headers=")
        self._request_root = self.base_url = root
        if not isinstance(default_concurrency, int) or isinstance(default_concurrency, bool) or default_concurrency < 1:
            raise ValueError(f"default_concurrency must be a positive integer, got a {type(default_concurrency).__name__}")
        self.api_key_env = api_key_env
        self.azure_api_version = azure_api_version
        self._headers = dict(headers or {})
        # Whatever goes on the wire beside the body is a credential as far as any text is concerned.
        remember(*self._headers.values(), os.environ.get(api_key_env))
        self.supports_schema = supports_schema
        if response_format not in RESPONSE_FORMATS:
            raise ValueError(f"response_format must be one of {RESPONSE_FORMATS}")
        self.response_format = response_format
        self.default_concurrency = default_concurrency
        if default_rate_limit is not None and not default_rate_limit > 0:
            raise ValueError("rate_limit must be a positive number of requests per second, got a "
                             f"{type(default_rate_limit).__name__}")
        self.default_rate_limit = default_rate_limit
        self.connect_timeout = connect_timeout
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
        session = getattr(self._local, "session", None)
        if session is None:
            # Redirects are followed within the server's origin only: no key, nor any text under
            # evaluation, goes to a server that was not configured.
            session = self._local.session = same_origin_session_class()()
            adapter = watched_adapter_class()
            session.mount("http://", adapter())
            session.mount("https://", adapter())
        return session

    def _drop_session(self) -> None:
        """Forget this thread's session (after an attempt cut short: its pool may hold a
        connection shut down mid-reply)."""
        session = getattr(self._local, "session", None)
        self._local.session = None
        if session is not None:
            session.close()

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
        if request.schema is None or not self.supports_schema:
            return body
        if (request.response_format or self.response_format) == "json_object":
            body["response_format"] = {"type": "json_object", "schema": request.schema}
        else:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {
                    "name": _schema_name(request.schema_name),
                    "schema": request.schema,
                    "strict": True,
                },
            }
        return body

    def _post(self, url: str, query: dict, body: dict, headers: dict, budget: float, where: str,
              secrets: tuple[str | None, ...]) -> Answer:
        """One POST, read in full within ``budget`` seconds of wall-clock time."""
        budget = max(budget, 0.001)
        connect = min(self.connect_timeout, budget)
        failure: Exception | None = None
        with AttemptClock(budget) as clock:
            try:
                response = self._session().post(
                    url, params=query, json=body, headers=headers, timeout=(connect, budget), stream=True
                )
                try:
                    answer = Answer(response.status_code, response.headers, read_body(response, clock),
                                     response.encoding)
                finally:
                    response.close()
            except Exception as exc:  # requests', urllib3's or the socket's: mapped below
                failure = transport_failure(exc, clock, where, connect, secrets)
        if failure is not None:
            if clock.expired:
                self._drop_session()
            # Raised outside the except block so that no __context__ links to requests'
            # exception, whose .request still holds the Authorization header.
            raise failure
        return answer

    def complete(self, request: ChatRequest) -> ChatReply:
        key = os.environ.get(self.api_key_env) or None
        url, query, headers = self._url_and_auth(key)
        remember(*(v for k, v in headers.items() if k != "Content-Type"))
        secrets = (key,)
        body = self.body(request)
        where = f"{self.base_url} ({self.model})"
        response = self._post(url, query, body, headers, request.timeout, where, secrets)
        try:
            payload = response.json()
        except (ValueError, RecursionError):  # not JSON, or nested past the parser's limit
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
        return parse_chat_completion(payload, default_model=self.model, where=where, secrets=secrets)


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


def _short_text(value: Any, secrets: tuple[str | None, ...]) -> str | None:
    """An identifier the server reports (model, fingerprint) as text, or None."""
    if value is None or isinstance(value, (dict, list)):
        return None
    return redact(str(value), secrets)[:200] or None


def parse_chat_completion(
    payload: dict[str, Any], *, default_model: str, where: str, secrets: tuple[str | None, ...] = ()
) -> ChatReply:
    """A :class:`ChatReply` from an OpenAI-style chat completion (also the MLflow gateway's).

    Only the choices are required; usage, model and fingerprint are read when they are
    readable and left unknown otherwise. Every ``secret`` is replaced by ``***`` in all text.
    """
    choices = payload.get("choices") or []
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise TransientError("ServerError", f"{where}: reply without choices")
    choice = choices[0]
    message = choice.get("message")
    message = message if isinstance(message, dict) else {}
    refusal = message.get("refusal") or None
    if refusal is None and choice.get("finish_reason") == "content_filter":
        refusal = "content_filter"
    usage = payload.get("usage")
    usage = usage if isinstance(usage, dict) else {}
    return ChatReply(
        text=redact(_text_of(message.get("content")), secrets),
        model=_short_text(payload.get("model"), secrets) or default_model,
        system_fingerprint=_short_text(payload.get("system_fingerprint"), secrets),
        tokens_in=token_count(usage.get("prompt_tokens")),
        tokens_out=token_count(usage.get("completion_tokens")),
        refusal=redact(str(refusal), secrets) if refusal is not None else None,
    )


#: Options of an ``openai:/`` judge name and their types: nothing else is accepted.
_TARGET_OPTIONS = {
    "base_url": as_url, "api_key_env": str, "azure_api_version": str, "supports_schema": as_bool,
    "response_format": str, "concurrency": as_int, "rate_limit": as_positive_float,
}


@register_judge_provider("openai")
def parse_openai_target(spec: str) -> OpenAICompatBackend:
    """A backend from a judge name.

    Forms: ``openai:/gpt-4o-mini``; options go in a query string, e.g.
    ``openai:/my-model?base_url=http://127.0.0.1:8080/v1`` or
    ``openai:/gpt4o-deployment?base_url=https://x.openai.azure.com&azure_api_version=2024-10-21``
    (add ``&api_key_env=AZURE_OPENAI_API_KEY`` to read the key from another variable).
    Options: ``base_url``, ``api_key_env``, ``azure_api_version``, ``supports_schema``
    (``true``/``false``), ``response_format`` (``json_schema``, the default, or ``json_object``
    for llama-cpp-python's server: ``openai:/smollm2?base_url=...&response_format=json_object``),
    ``concurrency``, ``rate_limit`` (requests per second); any other is refused. A key is never
    accepted in the name (names are logged): use ``api_key_env``; a ``base_url`` with
    ``user:password@``, a query string or ``;`` parameters is refused, and a bad value is named
    by option and type, never echoed.
    """
    model, options = backend_options(spec, "openai", _TARGET_OPTIONS, "model", "model")
    if "rate_limit" in options:
        options["default_rate_limit"] = options.pop("rate_limit")
    return OpenAICompatBackend(model, **options)
