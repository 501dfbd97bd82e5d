"""LLM judges: every judge primitive as a prompt, over any :class:`ChatBackend`.

Everything that makes a judge trustworthy lives here, once, for every provider:
- **Structured output.** Each reply is validated against the template's pydantic schema. On
  failure: safe repairs (:mod:`.parsing`), then one retry that shows the model the validation
  error, then a named :class:`JudgeFailure` (``ParseError``) for that row. Never a default,
  never a NaN.
- **Faults.** Transient errors (timeouts, 429, 5xx, refused connections) are retried with
  exponential backoff and full jitter, honouring ``Retry-After``, under a total deadline per
  call that also caps each attempt's own wall-clock budget. Permanent errors and refusals
  fail the row at once. A provider that cannot be reached at all (``unreachable_after``
  consecutive connection failures) raises :class:`JudgeUnreachable`, which stops the
  evaluation instead of failing every row the same way.
- **Schema fallback.** A server that refuses the requested structured-output format
  (``SchemaUnsupported``) is asked the next way: ``json_schema``, then ``json_object`` where
  the backend has it, then prompt-and-parse. The switch is made once per judge, remembered
  for the process per (provider, base_url, model), logged, and counted in the usage.
- **Containment.** Anything that goes wrong with one reply (parsing, accounting, a check)
  is that row's named :class:`JudgeFailure`, never the batch's.
- **Cache.** A reply that parsed is stored under a key covering provider, model, base_url,
  backend identity, generation parameters, template id/version/sha256, rendered messages and
  output schema. Errors and refusals are never stored. No API key is in any part of the key.
- **Concurrency.** Rows fan out over a thread pool bounded per judge (``concurrency``, default
  from the provider).
- **Accounting.** Every call is counted (:class:`Usage`): cache hits, provider calls,
  retries, tokens, cost where the price table knows the model, latency, the model ids and
  system fingerprints the provider reported.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from pydantic import BaseModel

from mlflow_rag_eval.judges.base import (
    ClaimsItem,
    GeneratedQuestions,
    Judge,
    JudgeFailure,
    JudgeInfo,
    JudgeUnreachable,
    Outcome,
    RelevanceItem,
    Verdict,
    VerifyItem,
)
from mlflow_rag_eval.judges.cache import JudgeCache
from mlflow_rag_eval.judges.embedding import model_files_sha256, resolve_model_path
from mlflow_rag_eval.judges.chat import (
    CONNECTION_ERROR,
    RESPONSE_FORMATS,
    ChatBackend,
    ChatReply,
    ChatRequest,
    PermanentError,
    TransientError,
)
from mlflow_rag_eval.judges.parsing import ReplyParseError, extract_json, inline_refs, parse_reply
from mlflow_rag_eval.judges.prompts import PROMPTS, PROMPTS_VERSION, data_block, passages_block, render
from mlflow_rag_eval.judges.usage import Usage, load_price_table, token_count

__all__ = ["LLMJudge", "LLMSettings", "Usage", "load_price_table"]  # the last two from .usage

_logger = logging.getLogger(__name__)

#: The mode label of a backend with a single way of asking for a schema.
SCHEMA = "schema"
#: The mode label of prompt-and-parse: no structured output asked, the prompt shows the schema.
PROMPT = "prompt"
#: Longest error text kept for a row whose reply broke something unexpected.
_MESSAGE_CHARS = 300
#: Seconds a judge declared unreachable fails new calls at once, without a request: the rows
#: still queued when the evaluation stops cost nothing. After that quiet time one request
#: goes out again (a judge object reused once its server is back works without a restart).
UNREACHABLE_HOLD_S = 10.0

# (provider, base_url, model) -> the format a server was last found to accept: a new judge on
# the same server starts there instead of repeating the call that failed.
_FORMAT_MEMORY: dict[tuple[str, str, str], str] = {}
_FORMAT_MEMORY_LOCK = threading.Lock()


def _remembered_format(backend: ChatBackend) -> str | None:
    base_url = getattr(backend, "base_url", None)
    if not base_url:  # in-process backends: nothing to remember a server by
        return None
    with _FORMAT_MEMORY_LOCK:
        return _FORMAT_MEMORY.get((backend.provider, base_url, backend.model))


def _remember_format(backend: ChatBackend, mode: str) -> None:
    base_url = getattr(backend, "base_url", None)
    if base_url:
        with _FORMAT_MEMORY_LOCK:
            _FORMAT_MEMORY[(backend.provider, base_url, backend.model)] = mode


def _attempts(n: int) -> str:
    return f"{n} attempt" if n == 1 else f"{n} attempts"


@dataclass(frozen=True)
class LLMSettings:
    """Generation and fault-handling settings; generation ones are part of the fingerprint.

    Fault defaults, and why:

    - ``timeout`` 60 s is the *total* wall-clock time of one attempt (connect, wait, read),
      enforced while the reply streams by HTTP backends. A hosted model answers a judge prompt
      (at most ``max_tokens`` 1024 out) well within 30 s; 60 s leaves room for a slow moment.
      A CPU-only local server or a reasoning model needs more: raise it.
    - ``deadline`` 120 s bounds one judge call, retries and backoff included, and caps every
      attempt's budget: a row never waits longer than this on its judge (two full attempts,
      or many quick ones), so a server that hangs costs each row two minutes, not more.
    - ``max_retries`` 4 (five attempts): with ``backoff_base`` 0.5 s the waits grow 0.5, 1, 2,
      4 s (full jitter), enough to ride out a burst of 429s or a restart; a limit that
      persists past that is not a burst, and ``Retry-After`` is honoured within the deadline.
    - ``unreachable_after`` (fail-fast): after that many *consecutive connection failures*
      (refused, reset, host not found, no connection within the connect timeout), counted
      across all calls and threads of the judge and reset by any answer from the server, the
      judge raises :class:`JudgeUnreachable` and the evaluation stops with one error before
      anything is logged. None (the default) means twice the judge's concurrency, at least 8:
      the requests in flight can all fail together in one blip (a pooled connection dropped,
      a restart), so the count must also span their retries, i.e. the server stayed down
      through a round of backoff; a dead server is then declared in about a second and a few
      dozen calls. 0 turns fail-fast off. 5xx answers and read timeouts do not count: the
      server answered or accepted, and may be slow or failing on one row only; they stay
      bounded per row by ``max_retries`` and ``deadline``. An HTTP answer of any status
      resets the count (the server is reachable); a read timeout neither counts nor resets.
    """

    temperature: float = 0.0
    max_tokens: int = 1024
    seed: int | None = None
    #: total seconds for one attempt (wall clock, reply read in full)
    timeout: float = 60.0
    #: seconds for one judge call, all retries and backoff included
    deadline: float = 120.0
    max_retries: int = 4
    backoff_base: float = 0.5
    backoff_max: float = 30.0
    #: consecutive connection failures before JudgeUnreachable; None: 2 x concurrency, >= 8
    unreachable_after: int | None = None
    #: concurrent requests; None takes the provider's default
    concurrency: int | None = None
    #: fuse extract + verify into one call
    fuse: bool = True
    #: embedding model for similarity (answer relevancy); never sent to the provider
    embedding_model: str = "minilm-l6"

    def generation_params(self) -> dict[str, Any]:
        params: dict[str, Any] = {"temperature": self.temperature, "max_tokens": self.max_tokens}
        if self.seed is not None:
            params["seed"] = self.seed
        return params


class LLMJudge(Judge):
    """A judge that asks an LLM, through any :class:`ChatBackend`, for each primitive."""

    capabilities = frozenset(
        {
            "extract_claims", "verify", "extract_and_verify", "rate_relevance", "similarity",
            "generate_questions", "is_abstention", "grade",
            "complete",  # raw completions for adapters (ragas, deepeval)
        }
    )

    #: metrics run side by side: the judge waits on the network, not the CPU
    parallel_metrics = True

    def __init__(
        self,
        backend: ChatBackend,
        *,
        name: str | None = None,
        settings: LLMSettings | None = None,
        cache: JudgeCache | bool | None = True,
        **overrides: Any,
    ):
        self.backend = backend
        self.settings = settings or LLMSettings(**overrides)
        self.name = name or f"{backend.provider}:/{backend.model}"
        if cache is True:
            cache = JudgeCache()
        self.cache = cache if isinstance(cache, JudgeCache) else JudgeCache.disabled()
        self.usage_ = Usage()
        self._ladder = self._format_ladder()
        remembered = _remembered_format(backend)
        self._format = remembered if remembered in self._ladder else self._ladder[0]
        self._format_lock = threading.Lock()
        self._connection_failures = 0
        self._last_connection_failure: tuple[float, str] = (0.0, "")
        self._health_lock = threading.Lock()
        self._embedder = None
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self._prices = load_price_table()

    # -- identity ---------------------------------------------------------------------------
    @property
    def calls(self) -> int:
        return self.usage_.provider_calls

    @property
    def _use_schema(self) -> bool:
        """Whether structured output is asked for now (part of the cache key)."""
        return self._format != PROMPT

    @property
    def response_format(self) -> str:
        """How the judge asks for a schema now: ``json_schema``, ``json_object``, ``schema``
        (the backend's only way) or ``prompt`` (prompt-and-parse, after a fallback)."""
        return self._format

    def usage(self) -> dict[str, Any]:
        return self.usage_.as_dict()

    def info(self) -> JudgeInfo:
        identity = self.backend.identity()
        params = {**self.settings.generation_params(), "fuse": self.settings.fuse}
        # Hashing the embedding model's files does not load it (and is cached per process).
        embed_sha = model_files_sha256(resolve_model_path(self.settings.embedding_model))
        blob = json.dumps(
            {
                "identity": identity,
                "params": params,
                "prompts": PROMPTS_VERSION,
                "embedding_model": self.settings.embedding_model,
                "embedding_sha256": embed_sha,
            },
            sort_keys=True,
            default=str,
        )
        return JudgeInfo(
            name=self.name,
            kind=self.backend.provider,
            model=self.backend.model,
            fingerprint=hashlib.sha256(blob.encode()).hexdigest()[:16],
            prompts_version=PROMPTS_VERSION,
            params={**params, **{k: v for k, v in identity.items() if k not in ("provider", "model")},
                    "embedding_model": self.settings.embedding_model, "embedding_sha256": embed_sha},
            model_files_sha256=identity.get("sha256"),
        )

    @property
    def embedder(self):
        if self._embedder is None:
            from mlflow_rag_eval.judges.embedding import Embedder

            self._embedder = Embedder(self.settings.embedding_model)
        return self._embedder

    # -- one call -----------------------------------------------------------------------------
    def _cache_key(self, template, messages, schema) -> str:
        return JudgeCache.make_key(
            backend=self.backend.identity(),
            base_url=self.backend.base_url,
            params=self.settings.generation_params(),
            template=template.ref,
            template_sha256=template.sha256,
            messages=messages,
            schema=schema,
            structured=self._use_schema,
        )

    def _send(self, request: ChatRequest, deadline: float) -> ChatReply:
        """One reply, retrying transient errors with backoff under the deadline.

        Each attempt gets ``min(timeout, time left)`` as its total budget, so no attempt can
        outlive the call's deadline. Raises JudgeFailure (retries spent, deadline passed),
        PermanentError, or JudgeUnreachable from the fail-fast count.
        """
        s = self.settings
        attempt = 0
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise JudgeFailure("DeadlineExceeded", f"no reply within {s.deadline:g} s")
            self._check_reachable()
            started = time.monotonic()
            try:
                self.usage_.add(provider_calls=1, response_formats=self._mode_of(request))
                reply = self.backend.complete(replace(request, timeout=min(s.timeout, remaining)))
            except TransientError as exc:
                self._note_transient(exc)
                attempt += 1
                if attempt > s.max_retries:
                    raise JudgeFailure(exc.kind, f"{exc.message} (gave up after {_attempts(attempt)})") from None
                if exc.retry_after is not None:
                    delay = exc.retry_after
                else:  # exponential backoff, full jitter
                    delay = random.uniform(0, min(s.backoff_max, s.backoff_base * 2 ** (attempt - 1)))
                if time.monotonic() + delay >= deadline:
                    raise JudgeFailure(exc.kind, f"{exc.message} (retry would pass the deadline)") from None
                self.usage_.add(retries=1)
                time.sleep(delay)
                continue
            except PermanentError:
                self._note_answer()  # the server answered: it is reachable
                raise
            except Exception as exc:  # a provider bug fails the row, not the run
                raise JudgeFailure(type(exc).__name__, str(exc)[:_MESSAGE_CHARS]) from None
            finally:
                self.usage_.add(latency_s=time.monotonic() - started)
            self._note_answer()
            self._account(reply)
            return reply

    # -- fail-fast ------------------------------------------------------------------------------
    def _unreachable_limit(self) -> int:
        if self.settings.unreachable_after is not None:
            return max(0, self.settings.unreachable_after)
        return max(8, 2 * self._concurrency())

    def _note_transient(self, exc: TransientError) -> None:
        """Count a connection failure (raising JudgeUnreachable at the limit); an HTTP answer
        (429, 5xx) resets the count; a timeout leaves it as it is."""
        if exc.kind != CONNECTION_ERROR:
            if exc.kind != "Timeout":
                self._note_answer()
            return
        with self._health_lock:
            self._connection_failures += 1
            self._last_connection_failure = (time.monotonic(), exc.message)
        self._check_reachable()

    def _check_reachable(self) -> None:
        """Raise JudgeUnreachable while the judge is declared unreachable (the limit reached,
        the last connection failure less than UNREACHABLE_HOLD_S ago)."""
        limit = self._unreachable_limit()
        with self._health_lock:
            count = self._connection_failures
            when, last = self._last_connection_failure
        if not limit or count < limit or time.monotonic() - when >= UNREACHABLE_HOLD_S:
            return
        raise JudgeUnreachable(
            f"judge {self.name!r} is unreachable: {count} consecutive connection failures, "
            f"the last: {last}. Check that the server is running and its address; the "
            f"evaluation stopped before logging anything (LLMSettings.unreachable_after={limit})"
        )

    def _note_answer(self) -> None:
        with self._health_lock:
            self._connection_failures = 0

    # -- accounting -----------------------------------------------------------------------------
    def _account(self, reply: ChatReply) -> None:
        """Add a reply's tokens and cost to the usage. Never raises: unreadable usage counts
        as unknown tokens (``usage_unknown``), not as the row's failure."""
        try:
            tin, tout = token_count(reply.tokens_in), token_count(reply.tokens_out)
            model = reply.model if isinstance(reply.model, str) and reply.model else None
            fingerprint = reply.system_fingerprint if isinstance(reply.system_fingerprint, str) else None
            models = self._prices.get("models", {})
            price = models.get(model or self.backend.model) or models.get(self.backend.model)
            cost = ((tin or 0) * price["input"] + (tout or 0) * price["output"]) / 1e6 if price else 0.0
            self.usage_.add(tokens_in=tin or 0, tokens_out=tout or 0, cost_usd=float(cost), models=model,
                            system_fingerprints=fingerprint or None,
                            usage_unknown=int(tin is None or tout is None))
        except Exception as exc:  # noqa: BLE001 - accounting must never cost a verdict
            _logger.warning("judge %s: reply usage not counted (%s: %s)", self.name, type(exc).__name__, exc)
            self.usage_.add(usage_unknown=1)

    def _ask(self, template_id: str, blocks: dict[str, str], variables: dict[str, Any],
             check: Callable[[Any], None] | None = None) -> Any:
        """A validated reply for one template, or a JudgeFailure (returned, not raised)."""
        template = PROMPTS[template_id]
        messages = render(template, **blocks)
        data = _data_texts(variables)  # JSON quoted from these is never the reply's
        schema = inline_refs(template.schema.model_json_schema())
        self.usage_.add(templates=template.ref)
        key = self._cache_key(template, messages, schema)
        cached = self.cache.get(key)
        if cached is not None and isinstance(cached.get("text"), str):
            try:
                parsed = self._validate(cached["text"], template.schema, check, data)
                self.usage_.add(cache_hits=1)
                return parsed
            except ReplyParseError:
                pass  # a stale or foreign entry: ask again
        deadline = time.monotonic() + self.settings.deadline
        request = ChatRequest(
            messages=messages,
            schema=schema,  # sent or not according to the judge's format at each attempt
            schema_name=template.id,
            params=self.settings.generation_params(),
            timeout=self.settings.timeout,
            template_id=template.id,
            variables=variables,
        )
        try:
            reply = self._reply(request, deadline)
            try:
                parsed = self._validate(reply.text, template.schema, check, data)
            except ReplyParseError as first:
                self.usage_.add(repair_retries=1)
                retry = replace(request, messages=messages + [
                    {"role": "assistant", "content": reply.text},
                    {"role": "user", "content": (
                        f"Your reply was not valid: {first.reason}. Reply again with only the JSON "
                        "object that matches the schema."
                    )},
                ])
                reply = self._reply(retry, deadline)
                try:
                    parsed = self._validate(reply.text, template.schema, check, data)
                except ReplyParseError as second:
                    raise JudgeFailure("ParseError", f"{second} (after one corrective retry)") from None
        except PermanentError as exc:
            failure = JudgeFailure(exc.kind, exc.message)
        except JudgeFailure as exc:
            failure = exc
        else:
            self._store(key, {"text": reply.text, "model": reply.model,
                              "system_fingerprint": reply.system_fingerprint,
                              "tokens_in": reply.tokens_in, "tokens_out": reply.tokens_out})
            return parsed
        self.usage_.add(errors=failure.kind)
        return failure

    def _store(self, key: str, entry: dict[str, Any]) -> None:
        """Cache a reply that parsed; a cache that cannot write costs the reuse, not the verdict."""
        try:
            self.cache.put(key, entry)
        except Exception as exc:  # noqa: BLE001
            _logger.warning("judge %s: reply not cached (%s: %s)", self.name, type(exc).__name__, exc)

    def _reply(self, request: ChatRequest, deadline: float) -> ChatReply:
        """A reply asked the way the judge asks now, falling back to the next way (once per
        judge) when the server refuses it as ``SchemaUnsupported``."""
        mode = self._format
        while True:
            try:
                reply = self._send(self._as_mode(request, mode), deadline)
                break
            except PermanentError as exc:
                if exc.kind != "SchemaUnsupported" or mode == PROMPT or request.schema is None:
                    raise
                mode = self._fall_back(mode, exc)
        if reply.refusal:
            raise JudgeFailure("Refusal", reply.refusal[:_MESSAGE_CHARS])
        return reply

    # -- structured-output fallback -----------------------------------------------------------------
    def _format_ladder(self) -> tuple[str, ...]:
        """The ways to ask for a schema, in fallback order, ending with prompt-and-parse.

        A backend that lists ``response_formats`` (the OpenAI-compatible one: ``json_schema``,
        ``json_object``) starts at its configured ``response_format``; one with a single way is
        ``schema``; without schema support there is only ``prompt``.
        """
        if not getattr(self.backend, "supports_schema", False):
            return (PROMPT,)
        ways = tuple(getattr(self.backend, "response_formats", ()) or (SCHEMA,))
        configured = getattr(self.backend, "response_format", ways[0])
        if configured in ways:
            ways = ways[ways.index(configured):]
        return (*ways, PROMPT)

    def _as_mode(self, request: ChatRequest, mode: str) -> ChatRequest:
        """``request`` as sent in ``mode``: the schema only when structured output is asked."""
        if mode == PROMPT or request.schema is None:
            return replace(request, schema=None, response_format=None)
        return replace(request, response_format=mode if mode in RESPONSE_FORMATS else None)

    @staticmethod
    def _mode_of(request: ChatRequest) -> str:
        if request.schema is None:
            return PROMPT
        return request.response_format or SCHEMA

    def _fall_back(self, refused: str, exc: PermanentError) -> str:
        """Move the judge past ``refused`` (only forward, once however many rows hit it at the
        same time), remember it for the server, and say so; returns the way to ask next."""
        ladder = self._ladder
        wanted = ladder[min(ladder.index(refused) + 1, len(ladder) - 1)]
        with self._format_lock:
            switched = ladder.index(self._format) < ladder.index(wanted)
            if switched:
                self._format = wanted
            current = self._format
        if switched:
            self.usage_.add(schema_fallbacks=f"{refused}->{wanted}")
            _remember_format(self.backend, wanted)
            _logger.warning("judge %s: the server refused response format %s (%s); asking with %s from now on",
                            self.name, refused, exc.message[:200], wanted)
        return current

    @staticmethod
    def _validate(text: str, schema: type[BaseModel], check, data: tuple[str, ...] = ()) -> Any:
        parsed = parse_reply(text, schema, data)
        if check is not None:
            check(parsed)
        return parsed

    def _map(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
        """``fn`` over items on the judge's bounded pool, results in order, each row contained:
        whatever one row's reply breaks is that row's named JudgeFailure. Only
        JudgeUnreachable goes through (pending rows are then cancelled)."""
        contained = functools.partial(self._contained, fn)
        if len(items) <= 1:
            return [contained(item) for item in items]
        return list(self._executor().map(contained, items))

    def _contained(self, fn: Callable[[Any], Any], item: Any) -> Any:
        try:
            return fn(item)
        except JudgeUnreachable:
            raise
        except JudgeFailure as exc:
            return exc
        except Exception as exc:  # noqa: BLE001 - one reply's surprise is one row's error
            _logger.warning("judge %s: a row failed: %s: %s", self.name, type(exc).__name__, exc)
            failure = JudgeFailure(type(exc).__name__, str(exc)[:_MESSAGE_CHARS])
            self.usage_.add(errors=failure.kind)
            return failure

    def _concurrency(self) -> int:
        return max(1, self.settings.concurrency or getattr(self.backend, "default_concurrency", 4))

    def _executor(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=self._concurrency(), thread_name_prefix="judge")
            return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    # -- raw completions for adapters (ragas, deepeval) -------------------------------------------
    def complete(
        self,
        messages: list[dict[str, str]],
        *,
        schema: dict[str, Any] | None = None,
        source: str = "external",
        validate: Callable[[str], None] | None = None,
    ) -> str:
        """A reply to another library's own prompt, through this judge's cache, retries,
        deadline, accounting and (via :meth:`acomplete`) concurrency limit.

        With a ``schema`` the reply must at least contain valid JSON; ``validate(text)`` may
        check more (raising ReplyParseError). Either failure gets one corrective retry, as for
        our own templates, and an invalid reply is never cached. Raises JudgeFailure.
        """
        ref = f"external:{source}"
        schema = inline_refs(schema) if schema is not None else None
        self.usage_.add(templates=ref)
        key = JudgeCache.make_key(
            backend=self.backend.identity(), base_url=self.backend.base_url,
            params=self.settings.generation_params(), template=ref, messages=messages,
            schema=schema, structured=self._use_schema,
        )
        cached = self.cache.get(key)
        if cached is not None and isinstance(cached.get("text"), str):  # else a foreign entry: ask again
            self.usage_.add(cache_hits=1)
            return cached["text"]
        deadline = time.monotonic() + self.settings.deadline
        request = ChatRequest(messages=list(messages), schema=schema,
                              schema_name=source, params=self.settings.generation_params(),
                              timeout=self.settings.timeout, template_id=ref)
        try:
            def check(text: str) -> None:
                if schema is not None:
                    extract_json(text)
                if validate is not None:
                    validate(text)

            reply = self._reply(request, deadline)
            if schema is not None or validate is not None:
                try:
                    check(reply.text)
                except ReplyParseError as first:
                    self.usage_.add(repair_retries=1)
                    reply = self._reply(replace(request, messages=list(messages) + [
                        {"role": "assistant", "content": reply.text},
                        {"role": "user", "content": f"Your reply was not valid: {first.reason}. Reply "
                                                    "again with only the JSON object."},
                    ]), deadline)
                    try:
                        check(reply.text)
                    except ReplyParseError as second:
                        raise JudgeFailure("ParseError", f"{second} (after one corrective retry)") from None
        except PermanentError as exc:
            self.usage_.add(errors=exc.kind)
            raise JudgeFailure(exc.kind, exc.message) from None
        except JudgeFailure as exc:
            self.usage_.add(errors=exc.kind)
            raise
        except JudgeUnreachable:
            raise
        except Exception as exc:  # noqa: BLE001 - e.g. a validate() that breaks: still a named failure
            self.usage_.add(errors=type(exc).__name__)
            raise JudgeFailure(type(exc).__name__, str(exc)[:_MESSAGE_CHARS]) from None
        self._store(key, {"text": reply.text, "model": reply.model})
        return reply.text

    async def acomplete(self, messages: list[dict[str, str]], **kwargs: Any) -> str:
        """:meth:`complete` on the judge's bounded pool, for async callers."""
        import asyncio
        import functools

        return await asyncio.get_running_loop().run_in_executor(
            self._executor(), functools.partial(self.complete, messages, **kwargs)
        )

    # -- primitives ---------------------------------------------------------------------------
    def extract_claims(self, texts: Sequence[str]) -> list[Outcome[list[str]]]:
        def one(text: str):
            reply = self._ask("extract_claims", {"text": data_block("text", text)}, {"text": text})
            return reply if isinstance(reply, JudgeFailure) else [c for c in reply.claims if c.strip()]

        return self._map(one, list(texts))

    def verify(self, items: Sequence[VerifyItem]) -> list[Outcome[list[Verdict]]]:
        def one(item: VerifyItem):
            claims = list(item.claims)
            if not claims:
                return []
            reply = self._ask(
                "verify",
                {"claims": "\n".join(data_block("claim", c, index=i) for i, c in enumerate(claims)),
                 "passages": passages_block(list(item.passages))},
                {"claims": claims, "passages": list(item.passages)},
                check=_indices_cover(len(claims), "claim"),
            )
            if isinstance(reply, JudgeFailure):
                return reply
            by_index = {v.index: v for v in reply.verdicts}
            return [Verdict(bool(by_index[i].verdict), by_index[i].reason) for i in range(len(claims))]

        return self._map(one, list(items))

    def extract_and_verify(self, items: Sequence[ClaimsItem]) -> list[Outcome[list[tuple[str, Verdict]]]]:
        if not self.settings.fuse:
            return super().extract_and_verify(items)

        def one(item: ClaimsItem):
            if not item.text.strip():
                return []
            passages = list(item.passages)
            reply = self._ask(
                "claims_verdicts",
                {"text": data_block("text", item.text), "passages": passages_block(passages)},
                {"text": item.text, "passages": passages},
            )
            if isinstance(reply, JudgeFailure):
                return reply
            return [
                (c.claim, Verdict(bool(c.supported), c.reason, evidence=c.evidence,
                                  source_index=c.passage if c.passage is not None and 0 <= c.passage < len(passages) else None))
                for c in reply.claims
                if c.claim.strip()
            ]

        return self._map(one, list(items))

    def rate_relevance(self, items: Sequence[RelevanceItem]) -> list[Outcome[list[Verdict]]]:
        def one(item: RelevanceItem):
            passages = list(item.passages)
            if not passages:
                return []
            reply = self._ask(
                "rate_relevance",
                {
                    "question": data_block("question", item.question),
                    "reference": data_block("reference", item.reference) if item.reference else "",
                    "reference_clause": " (the reference answer shows what a good answer needs)"
                    if item.reference else "",
                    "passages": passages_block(passages),
                },
                {"question": item.question, "reference": item.reference, "passages": passages},
                check=_indices_cover(len(passages), "passage"),
            )
            if isinstance(reply, JudgeFailure):
                return reply
            by_index = {v.index: v for v in reply.verdicts}
            return [
                Verdict(bool(by_index[i].verdict), by_index[i].reason, source_index=i)
                for i in range(len(passages))
            ]

        return self._map(one, list(items))

    def similarity(self, pairs: Sequence[tuple[str, str]]) -> list[Outcome[float]]:
        """Embedding cosine (clipped at 0); computed locally, never sent to the provider."""
        if not pairs:
            return []
        import numpy as np

        vectors = self.embedder.encode([a for a, _ in pairs] + [b for _, b in pairs])
        n = len(pairs)
        # Rounded like the local judge's: batch composition must not move a score.
        return [round(float(max(c, 0.0)), 6) for c in np.einsum("ij,ij->i", vectors[:n], vectors[n:])]

    def generate_questions(self, answers: Sequence[str], n: int) -> list[Outcome[GeneratedQuestions]]:
        def one(answer: str):
            reply = self._ask(
                "generate_questions", {"answer": data_block("answer", answer), "n": str(n)},
                {"answer": answer, "n": n},
            )
            if isinstance(reply, JudgeFailure):
                return reply
            return GeneratedQuestions([q for q in reply.questions if q.strip()][:n], reply.noncommittal)

        return self._map(one, list(answers))

    def is_abstention(self, items: Sequence[tuple[str, str]]) -> list[Outcome[Verdict]]:
        def one(item: tuple[str, str]):
            question, answer = item
            reply = self._ask(
                "is_abstention",
                {"question": data_block("question", question), "answer": data_block("answer", answer)},
                {"question": question, "answer": answer},
            )
            return reply if isinstance(reply, JudgeFailure) else Verdict(bool(reply.abstains), reply.reason)

        return self._map(one, list(items))

    def grade(self, rubric: Any, fields: Sequence[dict[str, str]]) -> list[Outcome[Verdict]]:
        """G-Eval style: ``rubric`` has criteria, steps, low, high. Verdict.score is normalised."""
        low, high = float(rubric.low), float(rubric.high)

        def in_range(reply) -> None:
            if not low <= reply.score <= high:
                raise ReplyParseError(f"score {reply.score:g} is outside {low:g}..{high:g}")

        def one(row: dict[str, str]):
            reply = self._ask(
                "grade",
                {
                    "criteria": rubric.criteria,
                    "steps": "\n".join(f"{i + 1}. {s}" for i, s in enumerate(rubric.steps)),
                    "low": f"{low:g}", "high": f"{high:g}",
                    "fields": "\n".join(data_block(k, v) for k, v in row.items()),
                },
                {"rubric": rubric.criteria, "fields": row, "low": low, "high": high},
                check=in_range,
            )
            if isinstance(reply, JudgeFailure):
                return reply
            normalised = (reply.score - low) / (high - low) if high > low else 0.0
            return Verdict(normalised >= 0.5, reply.reason, score=normalised, evidence="; ".join(reply.steps))

        return self._map(one, list(fields))


def _data_texts(variables: dict[str, Any]) -> tuple[str, ...]:
    """The texts under evaluation among a template's variables (strings, lists of strings)."""
    out: list[str] = []
    for value in variables.values():
        if isinstance(value, str):
            out.append(value)
        elif isinstance(value, (list, tuple)):
            out += [v for v in value if isinstance(v, str)]
    return tuple(out)


def _indices_cover(n: int, what: str) -> Callable[[Any], None]:
    """A check that the reply gives exactly one verdict for each index 0..n-1."""

    def check(reply) -> None:
        seen = [v.index for v in reply.verdicts]
        missing = sorted(set(range(n)) - set(seen))
        extra = sorted(set(seen) - set(range(n)))
        if missing or extra or len(seen) != n:
            raise ReplyParseError(
                f"expected one verdict for each {what} index 0..{n - 1}; "
                f"missing {missing}, unexpected {extra}, got {len(seen)} verdicts"
            )

    return check
