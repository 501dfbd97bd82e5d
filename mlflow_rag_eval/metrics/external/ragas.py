"""ragas metrics, run on our judge: ``ragas:faithfulness``, ``ragas:context_precision``, ...

ragas asks its own prompts; every one goes through the judge (cache, retries, deadline,
accounting as template ``external:ragas``, concurrency limit), like our own templates. A reply
ragas wants as a ``response_model`` takes the judge's one structured-output path
(:meth:`LLMJudge.acomplete_structured`, the row's texts as data): at most two provider calls,
nothing here or in ragas retries on top. ragas never builds a client of its own: we always
hand it our LLM and our embeddings, so it cannot fall back to OpenAI.

Scoring uses ragas' collections API (``ragas.metrics.collections``: typed pydantic replies, no
analytics events, not deprecated), one ``await metric.ascore(...)`` per row on an event loop
this module owns. Never ``ragas.evaluate``: it patches asyncio globally, prints and writes files.
A failed row (judge failure, reply that does not parse twice, exception inside ragas) and a NaN
from ragas (its way of saying "could not score") both become named row errors, never scores; so
does a row where ragas caught a judge failure itself and scored from what was left.

The legacy interfaces (``BaseRagasLLM``, ``BaseRagasEmbeddings``) are implemented too, for users
who run ragas' deprecated ``ragas.metrics.X`` classes or their own ragas code on our judge.
ragas is imported lazily (it is an optional extra), with telemetry off unless the user set it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import inspect
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Any, NamedTuple

from mlflow_rag_eval.judges.base import Judge, JudgeCapabilityError, JudgeFailure, JudgeUnreachable
from mlflow_rag_eval.metrics.base import Metric, each_applicable
from mlflow_rag_eval.records import RagRecord
from mlflow_rag_eval.results import RowResult

__all__ = [
    "RAGAS_METRICS", "RagasMetric", "ragas_embeddings", "ragas_legacy_embeddings",
    "ragas_legacy_llm", "ragas_llm", "ragas_metric",
]

SOURCE = "ragas"  # accounted as template "external:ragas"


class _Spec(NamedTuple):
    cls: str  # class in ragas.metrics.collections
    fields: tuple[str, ...]  # the ascore arguments, all taken from the record
    greater_is_better: bool = True
    #: constructor defaults we change (the user's params win)
    defaults: tuple[tuple[str, Any], ...] = ()


# The NV metrics re-ask the same prompt up to 5 times on a failure or an off-scale rating: on top
# of the judge's corrective retry, up to 10 calls for one reply (and a cached judge repeats itself).
_ONE_TRY = (("max_retries", 1),)


#: Supported names -> the ragas collections class and the sample fields it reads.
RAGAS_METRICS: dict[str, _Spec] = {
    "faithfulness": _Spec("Faithfulness", ("user_input", "response", "retrieved_contexts")),
    "context_precision": _Spec("ContextPrecisionWithReference", ("user_input", "reference", "retrieved_contexts")),
    "context_utilization": _Spec("ContextUtilization", ("user_input", "response", "retrieved_contexts")),
    "context_recall": _Spec("ContextRecall", ("user_input", "retrieved_contexts", "reference")),
    "context_entity_recall": _Spec("ContextEntityRecall", ("reference", "retrieved_contexts")),
    "context_relevance": _Spec("ContextRelevance", ("user_input", "retrieved_contexts"), defaults=_ONE_TRY),
    "answer_relevancy": _Spec("AnswerRelevancy", ("user_input", "response")),
    "answer_correctness": _Spec("AnswerCorrectness", ("user_input", "response", "reference")),
    "answer_accuracy": _Spec("AnswerAccuracy", ("user_input", "response", "reference"), defaults=_ONE_TRY),
    "factual_correctness": _Spec("FactualCorrectness", ("response", "reference")),
    "noise_sensitivity": _Spec(
        "NoiseSensitivity", ("user_input", "response", "reference", "retrieved_contexts"), greater_is_better=False
    ),
    "response_groundedness": _Spec("ResponseGroundedness", ("response", "retrieved_contexts"), defaults=_ONE_TRY),
    "semantic_similarity": _Spec("SemanticSimilarity", ("reference", "response")),
}

#: ragas class names (collections and legacy ``ragas.metrics``) accepted as names.
_ALIASES = {
    **{spec.cls: name for name, spec in RAGAS_METRICS.items()},
    "ContextPrecision": "context_precision",
    "LLMContextPrecisionWithReference": "context_precision",
    "context_precision_with_reference": "context_precision",
    "LLMContextPrecisionWithoutReference": "context_utilization",
    "ContextPrecisionWithoutReference": "context_utilization",
    "context_precision_without_reference": "context_utilization",
    "LLMContextRecall": "context_recall",
    "ResponseRelevancy": "answer_relevancy",
    "response_relevancy": "answer_relevancy",
}

#: ragas sample field -> (our record field named in ``requires``, what a row lacks without it)
_FIELDS = {
    "user_input": (None, "an empty question"),
    "response": ("answer", "an empty answer"),
    "retrieved_contexts": ("contexts", "no retrieved contexts"),
    "reference": ("reference", "no reference answer"),
}


def _ragas_version() -> str:
    try:
        return version("ragas")
    except PackageNotFoundError:
        return "not installed"


def import_ragas():
    """Import ragas with telemetry off unless the user chose otherwise."""
    os.environ.setdefault("RAGAS_DO_NOT_TRACK", "true")
    try:
        import ragas
        import ragas.metrics.collections  # noqa: F401
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ModuleNotFoundError(
            f"ragas metrics need the ragas extra: pip install 'mlflow-rag-eval[ragas]' ({exc})"
        ) from exc
    return ragas


def _require_llm_judge(judge: Judge | None, metric: str) -> Any:
    """ragas asks its own free-form prompts: only a judge with raw completions can answer."""
    if judge is None or not hasattr(judge, "embedder") or not all(
            callable(getattr(judge, m, None)) for m in ("acomplete", "acomplete_structured")):
        name = judge.info().name if judge is not None else "none"
        raise JudgeCapabilityError(
            f"ragas metrics need an LLM judge (openai:/..., bedrock:/..., endpoints:/..., "
            f"llamacpp:/..., scripted): {metric!r} sends ragas' own prompts through the judge's "
            f"complete(), which judge {name!r} does not have"
        )
    return judge


# -- the LLM and embedding adapters ---------------------------------------------------------------

@dataclass
class _RowLog:
    """What the judge said while one row was scored: parsed replies, and failures (some ragas
    metrics catch an exception and score from what is left; we must still see it); the row's
    texts, which a reply never takes its JSON from."""

    replies: list = field(default_factory=list)
    failures: list = field(default_factory=list)
    data: tuple[str, ...] = ()


#: The log of the row being scored (each row runs in its own asyncio task, with its own context).
_ROW: contextvars.ContextVar[_RowLog | None] = contextvars.ContextVar("ragas_row", default=None)

def _record_failure(exc: JudgeFailure) -> None:
    log = _ROW.get()
    if log is not None:
        log.failures.append(exc)


async def _ask(judge: Any, messages: list[dict[str, str]]) -> str:
    """A text reply (ragas parses it): no schema, so no validation and no retry here."""
    try:
        return await judge.acomplete(messages, source=SOURCE)
    except JudgeFailure as exc:
        _record_failure(exc)
        raise


async def _structured(judge: Any, prompt: str, response_model: type) -> Any:
    """``prompt``'s reply validated as ``response_model`` by the judge's one structured path
    (one corrective retry, then a JudgeFailure ``ParseError``, never a default). No retry
    here: the judge's is the only one."""
    log = _ROW.get()
    try:
        parsed = await judge.acomplete_structured(
            [{"role": "user", "content": prompt}], response_model, source=SOURCE,
            data=log.data if log is not None else ())
    except JudgeFailure as exc:
        _record_failure(exc)
        raise
    if log is not None:
        log.replies.append({"model": response_model.__name__, "reply": parsed.model_dump()})
    return parsed


def _prompt_messages(prompt: Any) -> list[dict[str, str]]:
    """A LangChain PromptValue (what legacy ragas passes) as chat messages."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    roles = {"human": "user", "ai": "assistant", "system": "system"}
    return [{"role": roles.get(m.type, "user"), "content": str(m.content)} for m in prompt.to_messages()]


def _no_retry(run_config: Any = None) -> Any:
    """``run_config`` with one attempt: our judge already retries transient errors under a
    deadline; ragas' tenacity layer (10 attempts, 60 s waits by default) would retry a row's
    JudgeFailure on top of it."""
    from ragas.run_config import RunConfig

    base = run_config or RunConfig()
    return RunConfig(timeout=base.timeout, max_retries=1, max_wait=base.max_wait,
                     max_workers=base.max_workers, seed=base.seed)


# The adapter classes are built on first use, so that importing this module never imports ragas.

@functools.cache
def _llm_classes() -> dict[str, type]:
    import_ragas()
    from langchain_core.outputs import Generation, LLMResult
    from ragas.llms.base import BaseRagasLLM, InstructorBaseRagasLLM

    class JudgeInstructorLLM(InstructorBaseRagasLLM):
        """ragas' structured-output LLM (``generate/agenerate(prompt, response_model)``) on a
        judge: the judge's one structured path validates replies against ``response_model``."""

        #: read by ragas' PydanticPrompt when a legacy metric is given this LLM: use agenerate
        is_async = True

        def __init__(self, judge: Any):
            self.judge = judge

        def __repr__(self) -> str:
            return f"JudgeInstructorLLM({self.judge.info().name})"

        def generate(self, prompt: str, response_model):
            return _run(_structured(self.judge, prompt, response_model))

        async def agenerate(self, prompt: str, response_model):
            return await _structured(self.judge, prompt, response_model)

    class JudgeLegacyLLM(BaseRagasLLM, InstructorBaseRagasLLM):
        """ragas' legacy text LLM (``generate_text/agenerate_text -> LLMResult``) on a judge.

        Also a structured LLM, so ragas sends prompts with an output model (every legacy
        metric's) to ``agenerate``, the judge's one structured path, not to its text branch,
        which parses replies itself and re-asks with a fix-the-format prompt quoting the reply
        (4 calls for one bad reply). ragas' ``temperature`` and ``stop`` are ignored: the
        judge's settings decide. ``n`` > 1 repeats the judge's one reply.
        """

        #: read by ragas' PydanticPrompt: use agenerate, never the sync generate
        is_async = True

        def __init__(self, judge: Any):
            super().__init__(run_config=_no_retry(), multiple_completion_supported=True, cache=None)
            self.judge = judge

        def __repr__(self) -> str:
            return f"JudgeLegacyLLM({self.judge.info().name})"

        def set_run_config(self, run_config) -> None:
            super().set_run_config(_no_retry(run_config))

        def is_finished(self, response: LLMResult) -> bool:
            return True  # a truncated reply fails to parse, which ragas reports

        def generate_text(self, prompt, n=1, temperature=0.01, stop=None, callbacks=None) -> LLMResult:
            return _run(self.agenerate_text(prompt, n))

        async def agenerate_text(self, prompt, n=1, temperature=0.01, stop=None, callbacks=None) -> LLMResult:
            text = await _ask(self.judge, _prompt_messages(prompt))
            return LLMResult(generations=[[Generation(text=text) for _ in range(max(1, n))]])

        async def agenerate(self, prompt: str, response_model):
            return await _structured(self.judge, prompt, response_model)

    return {"llm": JudgeInstructorLLM, "legacy_llm": JudgeLegacyLLM}


@functools.cache
def _embedding_classes() -> dict[str, type]:
    import_ragas()
    import numpy as np
    from ragas.embeddings.base import BaseRagasEmbedding, BaseRagasEmbeddings

    class JudgeEmbeddings(BaseRagasEmbedding):
        """ragas' embedding interface (``embed_text(s)``/``aembed_text(s)``) on the judge's
        embedder: local, never sent to the provider; unit-norm vectors."""

        def __init__(self, embedder: Any):
            super().__init__(cache=None)
            self.embedder = embedder

        def embed_text(self, text: str, **kwargs: Any) -> list[float]:
            return self.embedder.encode([text])[0].tolist()

        async def aembed_text(self, text: str, **kwargs: Any) -> list[float]:
            return await asyncio.to_thread(self.embed_text, text)

        def embed_texts(self, texts: list[str], **kwargs: Any) -> list[list[float]]:
            return np.asarray(self.embedder.encode(list(texts))).tolist() if texts else []

        async def aembed_texts(self, texts: list[str], **kwargs: Any) -> list[list[float]]:
            return await asyncio.to_thread(self.embed_texts, texts)

    class JudgeLegacyEmbeddings(BaseRagasEmbeddings):
        """ragas' legacy (LangChain) embedding interface on the judge's embedder."""

        def __init__(self, embedder: Any):
            super().__init__(cache=None)
            self.embedder = embedder
            self.run_config = _no_retry()

        def set_run_config(self, run_config) -> None:
            self.run_config = _no_retry(run_config)

        def embed_query(self, text: str) -> list[float]:
            return self.embedder.encode([text])[0].tolist()

        def embed_documents(self, texts: list[str]) -> list[list[float]]:
            return np.asarray(self.embedder.encode(list(texts))).tolist() if texts else []

        async def aembed_query(self, text: str) -> list[float]:
            return await asyncio.to_thread(self.embed_query, text)

        async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
            return await asyncio.to_thread(self.embed_documents, texts)

    return {"embeddings": JudgeEmbeddings, "legacy_embeddings": JudgeLegacyEmbeddings}


def ragas_llm(judge: Any):
    """A ragas ``InstructorBaseRagasLLM`` (what ``ragas.metrics.collections`` take) on ``judge``."""
    return _llm_classes()["llm"](_require_llm_judge(judge, "ragas"))


def ragas_legacy_llm(judge: Any):
    """A ragas ``BaseRagasLLM`` (what the deprecated ``ragas.metrics.X`` classes take) on ``judge``."""
    return _llm_classes()["legacy_llm"](_require_llm_judge(judge, "ragas"))


def ragas_embeddings(judge: Any):
    """A ragas ``BaseRagasEmbedding`` (collections metrics) on the judge's local embedder."""
    return _embedding_classes()["embeddings"](judge.embedder)


def ragas_legacy_embeddings(judge: Any):
    """A ragas ``BaseRagasEmbeddings`` (legacy metrics) on the judge's local embedder."""
    return _embedding_classes()["legacy_embeddings"](judge.embedder)


# -- the metric -------------------------------------------------------------------------------------

def _run(coro) -> Any:
    """Run ``coro`` on a fresh event loop we own; in a worker thread if this one has a loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    context = contextvars.copy_context()  # the row log travels with the call
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ragas-loop") as pool:
        return pool.submit(context.run, asyncio.run, coro).result()


def _error(exc: BaseException) -> str:
    if isinstance(exc, JudgeFailure):
        return f"{exc.kind}: {exc.message}"
    message = str(exc).strip() or repr(exc)
    return f"{type(exc).__name__}: {message}"


@dataclass(frozen=True)
class RagasMetric(Metric):
    """A ragas metric on our judge. Build with :func:`ragas_metric`.

    Attributes:
        ragas_name: the supported name (``faithfulness``, ``context_precision``, ...).
        params: extra constructor arguments for the ragas class, as sorted ``(name, value)``
            pairs (e.g. ``(("mode", "precision"),)`` for factual_correctness).
    """

    name = "ragas"
    version = 1
    #: a raw completion through the judge (LLMJudge.complete / acomplete)
    primitives = ("complete",)

    ragas_name: str
    params: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if self.ragas_name not in RAGAS_METRICS:
            raise ValueError(
                f"unknown ragas metric {self.ragas_name!r}; supported: {', '.join(sorted(RAGAS_METRICS))}"
            )

    @property
    def _spec(self) -> _Spec:
        return RAGAS_METRICS[self.ragas_name]

    @property
    def display_name(self) -> str:
        return f"ragas:{self.ragas_name}"

    @property
    def requires(self) -> tuple[str, ...]:  # type: ignore[override]
        return tuple(_FIELDS[f][0] for f in self._spec.fields if _FIELDS[f][0] is not None)

    @property
    def greater_is_better(self) -> bool:  # type: ignore[override]
        return self._spec.greater_is_better

    def spec(self) -> dict[str, Any]:
        return {
            "name": self.display_name, "version": self.version, "params": dict(self.params),
            "ragas_class": self._spec.cls, "ragas_params": {**dict(self._spec.defaults), **dict(self.params)},
            "ragas_version": _ragas_version(),
        }

    def not_applicable(self, record: RagRecord) -> str | None:
        # ragas raises on these inputs rather than scoring them: a data gap, not a judge failure.
        values = _sample(record)
        for f in self._spec.fields:
            if not values[f]:
                return f"{_FIELDS[f][1]} (ragas cannot score it)"
        return None

    def build(self, judge: Any):
        """A fresh ragas metric instance wired to ``judge`` (never a shared, mutated one)."""
        _require_llm_judge(judge, self.display_name)
        import_ragas()
        import ragas.metrics.collections as collections

        cls = getattr(collections, self._spec.cls)
        accepted = inspect.signature(cls.__init__).parameters
        kwargs: dict[str, Any] = {**dict(self._spec.defaults), **dict(self.params)}
        if "llm" in accepted:
            kwargs["llm"] = ragas_llm(judge)
        if "embeddings" in accepted:
            kwargs["embeddings"] = ragas_embeddings(judge)
        return cls(**kwargs)

    def compute(self, records: Sequence[RagRecord], judge: Any) -> list[RowResult]:
        _require_llm_judge(judge, self.display_name)  # before any row: a configuration error
        metric = self.build(judge)

        async def one(record: RagRecord) -> RowResult:
            values = _sample(record)
            log = _RowLog(data=(record.question, record.answer, *record.context_texts, record.reference or ""))
            _ROW.set(log)  # this task's own context: only this row's replies and failures
            try:
                result = await metric.ascore(**{f: values[f] for f in self._spec.fields})
                value = float("nan") if result.value is None else float(result.value)
            except JudgeUnreachable:  # no row can be judged: the evaluation stops
                raise
            except Exception as exc:  # one row's failure never touches the others
                return RowResult.failed(_error(exc), ragas_replies=log.replies)
            if log.failures:
                # ragas caught a judge failure and went on (NaN, or a score from what was left):
                # the row is not scored, and the error names the judge's failure.
                first = log.failures[0]
                what = "returned NaN" if not math.isfinite(value) else f"scored {value:.3f} from the rest"
                return RowResult.failed(
                    f"{first.kind}: {first.message} (ragas {self._spec.cls} caught it and {what})",
                    ragas_replies=log.replies,
                )
            if not math.isfinite(value):
                return RowResult.failed(
                    f"RagasNaN: ragas {self._spec.cls} returned {value!r} for this row (it does so "
                    "when it cannot score, e.g. no statements extracted)",
                    ragas_replies=log.replies,
                )
            reason = getattr(result, "reason", None)
            why = f"ragas {self._spec.cls} = {value:.3f} from {len(log.replies)} judge replies"
            return RowResult.scored(value, f"{why}: {reason}" if reason else why, ragas_replies=log.replies)

        def score(rows: list[int]) -> dict[int, RowResult]:
            async def all_rows() -> list[RowResult]:
                return await asyncio.gather(*(one(records[i]) for i in rows))

            return dict(zip(rows, _run(all_rows())))

        return each_applicable(self, records, score)


def _sample(record: RagRecord) -> dict[str, Any]:
    """A record as ragas' single-turn sample fields."""
    return {
        "user_input": record.question.strip() and record.question,
        "response": record.answer.strip() and record.answer,
        "retrieved_contexts": [c for c in record.context_texts if c.strip()],
        "reference": (record.reference or "").strip() and record.reference,
    }


_SNAKE = re.compile(r"(?<!^)(?=[A-Z])")


def ragas_metric(name: str, **params: Any) -> RagasMetric:
    """The ragas metric ``name`` (e.g. ``faithfulness`` or its ragas class name ``Faithfulness``)
    on our judge; ``params`` go to the ragas class (e.g. ``mode="precision"``)."""
    key = name.strip()
    canonical = None
    for candidate in (key, key.lower(), _SNAKE.sub("_", key).lower()):
        canonical = candidate if candidate in RAGAS_METRICS else _ALIASES.get(candidate)
        if canonical:
            break
    if canonical is None:
        raise ValueError(
            f"unknown ragas metric {name!r}; supported: {', '.join(sorted(RAGAS_METRICS))} "
            "(or their ragas class names, e.g. Faithfulness, LLMContextRecall, ResponseRelevancy)"
        )
    return RagasMetric(ragas_name=canonical, params=tuple(sorted(params.items())))
