"""LLM judges: every judge primitive as a prompt, over any :class:`ChatBackend`.

Everything that makes a judge trustworthy lives here, once, for every provider:
- **Structured output.** Each reply is validated against the template's pydantic schema. On
  failure: safe repairs (:mod:`.parsing`), then one retry that shows the model the validation
  error, then a named :class:`JudgeFailure` (``ParseError``) for that row. Never a default,
  never a NaN.
- **Faults.** Transient errors (timeouts, 429, 5xx, refused connections) are retried with
  exponential backoff and full jitter, honouring ``Retry-After``, under a total deadline per
  call. Permanent errors and refusals fail the row at once.
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

import hashlib
import json
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
    Outcome,
    RelevanceItem,
    Verdict,
    VerifyItem,
)
from mlflow_rag_eval.judges.cache import JudgeCache
from mlflow_rag_eval.judges.embedding import model_files_sha256, resolve_model_path
from mlflow_rag_eval.judges.chat import ChatBackend, ChatReply, ChatRequest, PermanentError, TransientError
from mlflow_rag_eval.judges.parsing import ReplyParseError, extract_json, inline_refs, parse_reply
from mlflow_rag_eval.judges.prompts import PROMPTS, PROMPTS_VERSION, data_block, passages_block, render
from mlflow_rag_eval.judges.usage import Usage, load_price_table

__all__ = ["LLMJudge", "LLMSettings", "Usage", "load_price_table"]  # the last two from .usage


@dataclass(frozen=True)
class LLMSettings:
    """Generation and fault-handling settings; generation ones are part of the fingerprint."""

    temperature: float = 0.0
    max_tokens: int = 1024
    seed: int | None = None
    #: seconds for one attempt
    timeout: float = 60.0
    #: seconds for one judge call, all retries included
    deadline: float = 300.0
    max_retries: int = 6
    backoff_base: float = 0.5
    backoff_max: float = 30.0
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
        self._use_schema = bool(getattr(backend, "supports_schema", False))
        self._embedder = None
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self._prices = load_price_table()

    # -- identity ---------------------------------------------------------------------------
    @property
    def calls(self) -> int:
        return self.usage_.provider_calls

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
        """One reply, retrying transient errors with backoff under the deadline."""
        s = self.settings
        attempt = 0
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise JudgeFailure("DeadlineExceeded", f"no reply within {s.deadline:.0f} s")
            started = time.monotonic()
            try:
                self.usage_.add(provider_calls=1)
                reply = self.backend.complete(replace(request, timeout=min(s.timeout, remaining)))
            except TransientError as exc:
                attempt += 1
                if attempt > s.max_retries:
                    raise JudgeFailure(exc.kind, f"{exc} (gave up after {attempt} attempts)") from None
                if exc.retry_after is not None:
                    delay = exc.retry_after
                else:  # exponential backoff, full jitter
                    delay = random.uniform(0, min(s.backoff_max, s.backoff_base * 2 ** (attempt - 1)))
                if time.monotonic() + delay >= deadline:
                    raise JudgeFailure(exc.kind, f"{exc} (retry would pass the deadline)") from None
                self.usage_.add(retries=1)
                time.sleep(delay)
                continue
            except PermanentError:
                raise
            except Exception as exc:  # a provider bug fails the row, not the run
                raise JudgeFailure(type(exc).__name__, str(exc)) from None
            finally:
                self.usage_.add(latency_s=time.monotonic() - started)
            self._account(reply)
            return reply

    def _account(self, reply: ChatReply) -> None:
        tin, tout = reply.tokens_in or 0, reply.tokens_out or 0
        price = self._prices["models"].get(reply.model or self.backend.model) or self._prices["models"].get(self.backend.model)
        cost = (tin * price["input"] + tout * price["output"]) / 1e6 if price else 0.0
        self.usage_.add(tokens_in=tin, tokens_out=tout, cost_usd=cost, models=reply.model or None,
                        system_fingerprints=reply.system_fingerprint or None)

    def _ask(self, template_id: str, blocks: dict[str, str], variables: dict[str, Any],
             check: Callable[[Any], None] | None = None) -> Any:
        """A validated reply for one template, or a JudgeFailure (returned, not raised)."""
        template = PROMPTS[template_id]
        messages = render(template, **blocks)
        schema = inline_refs(template.schema.model_json_schema())
        self.usage_.add(templates=template.ref)
        key = self._cache_key(template, messages, schema)
        cached = self.cache.get(key)
        if cached is not None:
            try:
                parsed = self._validate(cached["text"], template.schema, check)
                self.usage_.add(cache_hits=1)
                return parsed
            except ReplyParseError:
                pass  # a stale or foreign entry: ask again
        deadline = time.monotonic() + self.settings.deadline
        request = ChatRequest(
            messages=messages,
            schema=schema if self._use_schema else None,
            schema_name=template.id,
            params=self.settings.generation_params(),
            timeout=self.settings.timeout,
            template_id=template.id,
            variables=variables,
        )
        try:
            reply = self._reply(request, deadline)
            try:
                parsed = self._validate(reply.text, template.schema, check)
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
                    parsed = self._validate(reply.text, template.schema, check)
                except ReplyParseError as second:
                    raise JudgeFailure("ParseError", f"{second} (after one corrective retry)") from None
        except PermanentError as exc:
            failure = JudgeFailure(exc.kind, str(exc).split(": ", 1)[-1])
        except JudgeFailure as exc:
            failure = exc
        else:
            self.cache.put(key, {"text": reply.text, "model": reply.model,
                                 "system_fingerprint": reply.system_fingerprint,
                                 "tokens_in": reply.tokens_in, "tokens_out": reply.tokens_out})
            return parsed
        self.usage_.add(errors=failure.kind)
        return failure

    def _reply(self, request: ChatRequest, deadline: float) -> ChatReply:
        try:
            reply = self._send(request, deadline)
        except PermanentError as exc:
            if exc.kind != "SchemaUnsupported" or request.schema is None:
                raise
            # The server rejects JSON-schema output: fall back to prompt-and-parse for good.
            self._use_schema = False
            reply = self._send(replace(request, schema=None), deadline)
        if reply.refusal:
            raise JudgeFailure("Refusal", reply.refusal[:300])
        return reply

    @staticmethod
    def _validate(text: str, schema: type[BaseModel], check) -> Any:
        parsed = parse_reply(text, schema)
        if check is not None:
            check(parsed)
        return parsed

    def _map(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
        """``fn`` over items on the judge's bounded pool, results in order."""
        if len(items) <= 1:
            return [fn(item) for item in items]
        return list(self._executor().map(fn, items))

    def _executor(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                workers = self.settings.concurrency or getattr(self.backend, "default_concurrency", 4)
                self._pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="judge")
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
        if cached is not None:
            self.usage_.add(cache_hits=1)
            return cached["text"]
        deadline = time.monotonic() + self.settings.deadline
        request = ChatRequest(messages=list(messages), schema=schema if self._use_schema else None,
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
            raise JudgeFailure(exc.kind, str(exc).split(": ", 1)[-1]) from None
        except JudgeFailure as exc:
            self.usage_.add(errors=exc.kind)
            raise
        self.cache.put(key, {"text": reply.text, "model": reply.model})
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
