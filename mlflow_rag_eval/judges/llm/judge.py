"""LLM judges: every judge primitive as a prompt, over any :class:`ChatBackend`.

Everything that makes a judge trustworthy lives once, for every provider, in three layers:

- :mod:`.transport` reaches the backend: transient errors retried with backoff under a
  deadline per call, fail-fast to :class:`JudgeUnreachable` when the provider cannot be
  reached at all, the structured-output format fallback (remembered per server), and the
  accounting of every attempt (:class:`Usage`).
- :mod:`.structured` is the one structured-output path: a cached reply, or one request,
  validated against a pydantic schema (JSON quoted from the texts under evaluation is never
  taken), one corrective retry that shows the validation error, then a named
  :class:`JudgeFailure` (``ParseError``). Never a default, never a NaN; at most two provider
  calls per reply. Our templates and other libraries' prompts (ragas, deepeval) share it.
- :mod:`.pool` fans rows out over a thread pool bounded per judge (``concurrency``), and
  contains them: anything that goes wrong with one reply is that row's named
  :class:`JudgeFailure`, never the batch's.
- :mod:`.spend` holds an evaluation's cap call by call: each provider call reserves what it
  may cost before it is sent (:meth:`LLMJudge.metered`) and settles with its usage.
- This module: :class:`LLMJudge`, its primitives as prompts (:mod:`.prompts`), and the
  cache keys.

Cache: a reply that parsed is stored under a key covering provider, model, base_url, backend
identity, generation parameters, template id/version/sha256, rendered messages, output schema
and the way the schema was asked for when the reply came. Errors and refusals are never stored.
No API key is in any part of the key.

Fingerprint: what can change a verdict, including what only the replies tell: the way the schema
was asked for (a JSON schema, ``json_object``, or prompt-and-parse, as configured or settled by a
fallback) and the model the server reported. A judge read before its first call has only its
configuration to go by; the fingerprint logged with a run is read after the calls. A judge
answered the configured way by the model asked keeps the fingerprint it had before any call.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
from collections.abc import Callable, Iterator, Sequence
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
from mlflow_rag_eval.judges.batch_independent import EncodedAhead
from mlflow_rag_eval.judges.cache import JudgeCache, UnusableCachePath
from mlflow_rag_eval.judges.llm import _structured as structured
from mlflow_rag_eval.judges.llm._parsing import ReplyParseError, extract_json, inline_refs
from mlflow_rag_eval.judges.llm._pool import RowPool
from mlflow_rag_eval.judges.llm._settings import LLMSettings
from mlflow_rag_eval.judges.llm.chat import ChatBackend, ChatRequest
from mlflow_rag_eval.judges.llm.spend import CostLedger
from mlflow_rag_eval.judges.llm.transport import PROMPT, Transport, preferred_format
from mlflow_rag_eval.judges.llm.usage import Usage, load_price_table
from mlflow_rag_eval.judges.local_model.embedding import model_files_sha256, resolve_model_path
from mlflow_rag_eval.judges.prompts import (
    PROMPTS,
    PROMPTS_VERSION,
    PromptTemplate,
    data_block,
    passages_block,
    render,
)

__all__ = ["LLMJudge", "LLMSettings", "Usage", "load_price_table"]  # the last three re-exported


_logger = logging.getLogger(__name__)


def _default_cache(judge: str) -> JudgeCache | None:
    """The cache at its default place, or None (no cache) with a warning when that place cannot
    hold one (a read-only home): the user chose no path, so the run goes on uncached, whereas a
    path the user gives that cannot be a cache is refused (``UnusableCachePath``)."""
    try:
        return JudgeCache()
    except UnusableCachePath as exc:
        _logger.warning("judge %s: no reply cache: %s (set MLFLOW_RAG_EVAL_CACHE_DIR to a writable folder)",
                        judge, exc)
        return None


class LLMJudge(Judge):
    """A judge that asks an LLM, through any :class:`ChatBackend`, for each primitive."""

    capabilities = frozenset(
        {
            "extract_claims", "verify", "extract_and_verify", "rate_relevance", "similarity",
            "generate_questions", "is_abstention", "grade",
            "complete",  # raw and structured completions for adapters (ragas, deepeval)
            "fill",  # templates outside the judge's own set (golden-set synthesis)
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
            cache = _default_cache(self.name)
        self.cache = cache if isinstance(cache, JudgeCache) else JudgeCache.disabled()
        self.usage_ = Usage()
        self._transport = Transport(backend, self.settings, self.usage_, name=self.name,
                                    concurrency=self._concurrency())
        self._rows = RowPool(self.name, self.usage_, self._concurrency())
        self._embedder = None
        self._encoded_ahead = EncodedAhead()
        self._embedding_sha: tuple[str | None] | None = None

    # -- identity ---------------------------------------------------------------------------
    @property
    def calls(self) -> int:
        return self.usage_.provider_calls

    @property
    def response_format(self) -> str:
        """How the judge asks for a schema now: ``json_schema``, ``json_object``, ``schema``
        (the backend's only way) or ``prompt`` (prompt-and-parse, after a fallback)."""
        return self._transport.response_format

    @property
    def concurrency(self) -> int:
        """The most requests this judge has in flight at once."""
        return self._concurrency()

    @property
    def rate_limit(self) -> float | None:
        """The most request starts per second (None: no limit)."""
        return self._transport.rate_limit

    def usage(self) -> dict[str, Any]:
        return self.usage_.as_dict()

    def stopped(self) -> str | None:
        return self._transport.stopped

    def restart(self) -> None:
        self._transport.restart()

    def info(self) -> JudgeInfo:
        identity = self.backend.identity()
        params = {**self.settings.generation_params(), "fuse": self.settings.fuse}
        embed_sha = self._embedding_sha256()
        differs, answered = self._what_answered()
        blob = json.dumps(
            {
                "identity": identity,
                "params": params,
                "prompts": PROMPTS_VERSION,
                "embedding_model": self.settings.embedding_model,
                "embedding_sha256": embed_sha,
                **differs,
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
                    "embedding_model": self.settings.embedding_model, "embedding_sha256": embed_sha,
                    **answered,
                    # lineage only, never the fingerprint: a rate limit changes when, not what
                    "rate_limit": self._transport.rate_limit},
            model_files_sha256=identity.get("sha256"),
        )

    def _what_answered(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """What the verdicts came from, as ``(for the fingerprint, for the lineage)``.

        The ways the replies used were asked for (before any call: the way the judge asks now)
        and the models their server reported. The lineage gets both; the fingerprint only what
        differs from a judge asking its backend's preferred way and answered by the model it
        asked for: a server that answers as another model, or replies got by prompt-and-parse
        (configured, or after a fallback), make another judge, while every judge answered as
        configured keeps the fingerprint it always had.
        """
        usage = self.usage_.as_dict()
        ways = sorted(usage["reply_formats"]) or [self._transport.response_format]
        models = usage["reported_models"]
        differs: dict[str, Any] = {}
        if ways != [preferred_format(self.backend)]:
            differs["structured_output"] = ways
        if models and sorted(models) != [self.backend.model]:
            differs["reported_models"] = sorted(models)
        return differs, {"structured_output": ways, "reported_models": models}

    def _embedding_sha256(self) -> str | None:
        """The embedding model's files' sha256, hashed once per judge (hashing does not load the
        model). info() is asked for on every row of the genai route, where resolving and
        stat-ing the model's files each time cost more than the row's own work."""
        if self._embedding_sha is None:
            self._embedding_sha = (model_files_sha256(resolve_model_path(self.settings.embedding_model)),)
        return self._embedding_sha[0]

    @property
    def embedder(self):
        if self._embedder is None:
            from mlflow_rag_eval.judges.local_model.embedding import Embedder

            self._embedder = Embedder(self.settings.embedding_model)
        return self._embedder

    def _unreachable_limit(self) -> int:
        return self._transport.unreachable_limit()

    # -- rows on the judge's bounded pool -------------------------------------------------------
    def _map(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
        """``fn`` over items on the judge's pool, in order, each row contained (:mod:`.pool`)."""
        return self._rows.map(fn, items)

    def _concurrency(self) -> int:
        return max(1, self.settings.concurrency or getattr(self.backend, "default_concurrency", 4))

    def close(self) -> None:
        self._rows.close()

    @contextlib.contextmanager
    def metered(self, ledger: CostLedger) -> Iterator[None]:
        """Within it, every provider call of this judge first reserves what it may cost on
        ``ledger`` (an evaluation's cap) and is refused (``BudgetExhausted``, a row's named
        failure) when that does not fit; the reply's usage settles it (:mod:`.spend`)."""
        before, self._transport.ledger = self._transport.ledger, ledger
        try:
            yield
        finally:
            self._transport.ledger = before

    @contextlib.contextmanager
    def cache_probe(self) -> Iterator[None]:
        """Within it, a call the cache cannot answer fails at once (``NotCached``) instead of
        asking the provider, and nothing it did is left in the usage: what an estimate asks to
        count only the calls a run will pay for. Not for use while the judge scores elsewhere."""
        usage, reported = self.usage_.snapshot(), list(self._transport._reported)
        self._transport.cache_only = True
        try:
            yield
        finally:
            self._transport.cache_only = False
            self.usage_.restore(usage)
            with self._transport._reported_lock:
                self._transport._reported[:] = reported

    # -- structured calls: our templates and other libraries' prompts -------------------------------
    def _key_for(self, ref: str, messages: list[dict[str, str]], schema: dict[str, Any] | None,
                 **extra: Any) -> Callable[[str], str]:
        """The cache key of this request's reply as a function of the way the schema is asked for
        (:func:`.structured.ask` stores a reply under the way it was actually asked)."""
        parts = dict(backend=self.backend.identity(), base_url=self.backend.base_url,
                     params=self.settings.generation_params(), template=ref, **extra,
                     messages=messages, schema=schema)
        preferred = preferred_format(self.backend)

        def key(mode: str) -> str:
            # The backend's preferred way is implied by its identity (keys from before ways were
            # named stay valid); another structured way (json_object after a fallback) is named.
            way = {} if mode in (PROMPT, preferred) else {"response_format": mode}
            return JudgeCache.make_key(**parts, structured=mode != PROMPT, **way)

        return key

    def _ask(self, template_id: str | PromptTemplate, blocks: dict[str, str], variables: dict[str, Any],
             check: Callable[[Any], None] | None = None) -> Any:
        """A validated reply for one template, or a JudgeFailure (returned, not raised)."""
        template = PROMPTS[template_id] if isinstance(template_id, str) else template_id
        messages = render(template, **blocks)
        schema = _request_schema(template)
        self.usage_.add(templates=template.ref)
        request = ChatRequest(
            messages=messages,
            schema=schema,  # sent or not according to the judge's format at each attempt
            schema_name=template.id, params=self.settings.generation_params(),
            timeout=self.settings.timeout, template_id=template.id, variables=variables,
        )
        key_for = self._key_for(template.ref, messages, schema, template_sha256=template.sha256)
        # JSON quoted from the texts under evaluation is never the reply's.
        validate = structured.schema_validator(template.schema, _data_texts(variables), check)
        try:
            return structured.ask(self._transport, self.cache, key_for, request, validate)
        except JudgeFailure as failure:
            return failure

    def _external(self, messages: list[dict[str, str]], schema: dict[str, Any] | None, source: str,
                  validate: Callable[[str], Any]) -> Any:
        """Another library's prompt through the one structured path (template ``external:<source>``)."""
        ref = f"external:{source}"
        schema = inline_refs(schema) if schema is not None else None
        self.usage_.add(templates=ref)
        request = ChatRequest(messages=list(messages), schema=schema, schema_name=source,
                              params=self.settings.generation_params(),
                              timeout=self.settings.timeout, template_id=ref)
        key_for = self._key_for(ref, list(messages), schema)
        return structured.ask(self._transport, self.cache, key_for, request, validate)

    def complete_structured(self, messages: list[dict[str, str]], schema: type[BaseModel], *,
                            source: str = "external", data: Sequence[str] = ()) -> BaseModel:
        """Another library's prompt, its reply validated as ``schema``: the path our own
        templates take (cache, transport retries, deadline, accounting, one corrective retry).

        ``data``: the texts under evaluation in the prompt; JSON quoted from them is never
        taken for the reply. Raises JudgeFailure (``ParseError`` once the corrective retry
        is spent) or JudgeUnreachable; never retry on top of it.
        """
        validate = structured.schema_validator(schema, tuple(data))
        return self._external(messages, schema.model_json_schema(), source, validate)

    async def acomplete_structured(self, messages: list[dict[str, str]], schema: type[BaseModel],
                                   **kwargs: Any) -> BaseModel:
        """:meth:`complete_structured` on the judge's bounded pool, for async callers."""
        return await self._rows.run(self.complete_structured, messages, schema, **kwargs)

    def complete(
        self,
        messages: list[dict[str, str]],
        *,
        schema: dict[str, Any] | None = None,
        source: str = "external",
        validate: Callable[[str], None] | None = None,
    ) -> str:
        """A reply's text for another library's own prompt, through the same path.

        With a JSON ``schema`` (a dict) the reply must at least contain valid JSON;
        ``validate(text)`` may check more (raising ReplyParseError). Either failure gets the
        one corrective retry; an invalid reply is never cached. Without either, the text is
        returned as it came (the caller parses it). Raises JudgeFailure.
        """

        def check(text: str) -> str:
            if schema is not None:
                extract_json(text)
            if validate is not None:
                validate(text)
            return text

        return self._external(messages, schema, source, check)

    async def acomplete(self, messages: list[dict[str, str]], **kwargs: Any) -> str:
        """:meth:`complete` on the judge's bounded pool, for async callers."""
        return await self._rows.run(self.complete, messages, **kwargs)

    def fill(self, template: PromptTemplate,
             items: Sequence[tuple[dict[str, str], dict[str, Any]]]) -> list[Outcome[BaseModel]]:
        """One validated reply of ``template.schema`` per ``(blocks, variables)`` item, for a
        template outside the judge's own set (golden-set synthesis, :mod:`mlflow_rag_eval.golden`).

        The same path as every primitive: cache keyed on the template's id, version and sha256,
        transport retries, one corrective retry, each row contained. Such templates are not part
        of :data:`PROMPTS_VERSION`: they never change a verdict, so they must not move the
        fingerprint that calibration records and the gate pair on.
        """
        return self._map(lambda item: self._ask(template, item[0], item[1]), list(items))

    # -- primitives ---------------------------------------------------------------------------
    def extract_claims(self, texts: Sequence[str]) -> list[Outcome[list[str]]]:
        def one(text: str):
            reply = self._ask("extract_claims", {"text": data_block("text", text)}, {"text": text})
            if isinstance(reply, JudgeFailure):
                return reply
            return [c for c in reply.claims if c.strip()] or self._claimless(text)

        return self._map(one, list(texts))

    def _claimless(self, text: str) -> Outcome[list]:
        """No claims for ``text`` (blank ones already dropped): ``[]`` when the text is blank or
        the judge calls it an abstention, else JudgeFailure ``NoClaims``.

        The prompts tell the judge to skip statements that the answer is unknown, so "I don't
        know." legitimately has no claims, and faithfulness scores it 1.0 (it asserts nothing).
        A reply of no claims for a text that states something would score the same 1.0 for an
        answer nobody checked; the judge is asked whether the text abstains (one more call, on
        claimless rows only) and a text that does not is no verdict. Runs on the row's own pool
        thread, so it asks directly rather than through :meth:`is_abstention`'s pool.
        """
        if not text.strip():
            return []
        reply = self._ask("is_abstention", {"question": data_block("question", ""), "answer": data_block("answer", text)},
                          {"question": "", "answer": text})
        if isinstance(reply, JudgeFailure):
            return reply
        if reply.abstains:
            return []
        return JudgeFailure("NoClaims", "the judge's reply lists no claim for a text that states something (it does "
                                        "not call it an abstention); not scored as a text without claims")

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
            ] or self._claimless(item.text)

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

        vectors = self._encoded_ahead.encode(self.embedder, [a for a, _ in pairs] + [b for _, b in pairs])
        n = len(pairs)
        # Rounded like the local judge's: batch composition must not move a score.
        return [round(float(max(c, 0.0)), 6) for c in np.einsum("ij,ij->i", vectors[:n], vectors[n:])]

    def encode_ahead(self, texts: Sequence[str]) -> None:
        """Encode ``texts`` now, for a :meth:`similarity` call to come (a metric's own texts, known
        before its judge calls: encoded while other metrics' calls wait on the network, not after
        the last reply). Only a head start: a failure here is raised again by similarity()."""
        try:
            self._encoded_ahead.add(self.embedder, texts)
        except Exception:  # noqa: BLE001
            pass

    def generate_questions(self, answers: Sequence[str], n: int) -> list[Outcome[GeneratedQuestions]]:
        def one(answer: str):
            reply = self._ask(
                "generate_questions", {"answer": data_block("answer", answer), "n": str(n)},
                {"answer": answer, "n": n},
            )
            if isinstance(reply, JudgeFailure):
                return reply
            generated = GeneratedQuestions([q for q in reply.questions if q.strip()][:n], reply.noncommittal)
            # What similarity() will be asked for next, encoded here while other rows wait on the
            # network rather than after the last reply (same vectors: see EncodedAhead).
            self.encode_ahead(generated.questions)
            return generated

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


@functools.lru_cache(maxsize=256)
def _request_schema(template: PromptTemplate) -> dict[str, Any]:
    """The schema a request of ``template`` sends (references inlined), made once per template
    rather than on every call; shared by every request, which only read it."""
    return inline_refs(template.json_schema)
