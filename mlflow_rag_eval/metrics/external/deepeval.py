"""deepeval's RAG metrics, scored through our judge: ``deepeval:faithfulness`` and friends.

A name ``deepeval:<metric>`` resolves to a :class:`DeepEvalMetric`: deepeval's own prompts and
scoring, but every completion goes through our :class:`~mlflow_rag_eval.judges.llm.judge.LLMJudge`
(cache, retries, deadline, accounting, bounded concurrency), so the same judge and the same
lineage cover our metrics and deepeval's side by side. deepeval never picks a model itself: we
always hand it ours, so it can never fall back to OpenAI.

What this adapter keeps away from the caller:

- **No global side effects.** deepeval is imported lazily, with telemetry, file writes and
  ``.env`` loading off unless the user set those variables; what it prints on import goes to
  the debug log, not stdout. ``deepeval.evaluate`` is never used (it patches asyncio, prints
  banners and writes files): each row is scored with the metric's own ``a_measure``.
- **No shared metric state.** deepeval metrics keep ``score``/``reason`` on the instance, so
  every row gets a fresh instance; rows run concurrently on an event loop this module owns.
- **One structured path.** A reply deepeval wants as a schema takes the judge's one
  structured-output path (:meth:`LLMJudge.complete_structured`): validated, with the row's
  texts as data (JSON quoted from them is never the reply), one corrective retry, then a
  ``ParseError``; at most two provider calls. Nothing here retries on top, and deepeval gets
  a schema instance back, so its own JSON re-parsing never runs.
- **Named failures, never NaN.** A row whose reply cannot be parsed (after one corrective
  retry), or that deepeval cannot score, is a named error row; the other rows are scored.
- **deepeval's definitions, not ours.** See the parity tests for where they coincide with
  ours and where they differ (e.g. faithfulness counts claims the context neither states nor
  contradicts as faithful).

deepeval's RAG metrics need no embedding model, so no embedding adapter is provided.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import functools
import io
import logging
import math
import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import PackageNotFoundError, version
from typing import Any, ClassVar

from mlflow_rag_eval.judges.base import Judge, JudgeCapabilityError, JudgeFailure, JudgeUnreachable
from mlflow_rag_eval.judges.llm.judge import LLMJudge
from mlflow_rag_eval.metrics.base import Metric, each_applicable
from mlflow_rag_eval.records import RagRecord
from mlflow_rag_eval.results import RowResult, metric_key

__all__ = ["DeepEvalMetric", "SUPPORTED_METRICS", "deepeval_metric", "deepeval_model"]

logger = logging.getLogger(__name__)

#: Set before deepeval is first imported, unless the user has set them.
ENV_DEFAULTS = {
    "DEEPEVAL_TELEMETRY_OPT_OUT": "1",
    "DEEPEVAL_FILE_SYSTEM": "READ_ONLY",
    "DEEPEVAL_DISABLE_DOTENV": "1",
}

#: The deepeval settings every metric is built with (part of the metric's spec).
#: ``eval_mode="llm"`` keeps every decision on our judge, whatever DEEPEVAL_EVAL_MODE says
#: (other modes send decisions to a third-party service).
METRIC_SETTINGS = {
    "strict_mode": False,
    "include_reason": True,
    "async_mode": True,
    "verbose_mode": False,
    "eval_mode": "llm",
}

#: The engine checks ``primitives`` before any row is judged. Raw completions are what deepeval
#: needs; until LLM judges list them as a capability ("complete"), ask for "grade", which only
#: LLM judges have, so the local judge is still refused up front.
_NEEDS: tuple[str, ...] = ("complete",) if "complete" in LLMJudge.capabilities else ("grade",)

_IMPORT_LOCK = threading.Lock()
_DEEPEVAL: Any = None
#: accounted as template "external:deepeval"
SOURCE = "deepeval"
#: The texts of the row being scored (each row runs in its own asyncio task and context): a
#: reply never takes its JSON from them.
_ROW_DATA: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("deepeval_row", default=())


def apply_env_defaults() -> None:
    """Turn deepeval's telemetry, file writes and dotenv loading off, where the user has not
    chosen otherwise."""
    for key, value in ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)


def _import_deepeval():
    """deepeval, imported once and quietly (it prints a notice on stdout in read-only mode).

    If deepeval was imported before (by the user, or by its own pytest plugin), its settings
    were read then: the defaults above apply only to a first import made here.
    """
    global _DEEPEVAL
    if _DEEPEVAL is not None:
        return _DEEPEVAL
    with _IMPORT_LOCK:
        if _DEEPEVAL is not None:
            return _DEEPEVAL
        apply_env_defaults()
        printed = io.StringIO()
        try:
            # redirect_stdout swaps sys.stdout for the whole process while it lasts; it lasts
            # only for this one import, made when a deepeval metric is first named.
            with contextlib.redirect_stdout(printed):
                import deepeval
                import deepeval.metrics  # noqa: F401
                import deepeval.models  # noqa: F401
                import deepeval.test_case  # noqa: F401
        except ImportError as exc:
            raise ModuleNotFoundError(
                "deepeval metrics need the optional package deepeval: "
                "pip install 'mlflow-rag-eval[deepeval]'"
            ) from exc
        if printed.getvalue().strip():
            logger.debug("deepeval printed on import: %s", printed.getvalue().strip())
        found = _deepeval_version()
        major = found.split(".")[0]
        if not major.isdigit() or int(major) < 4:
            raise ModuleNotFoundError(
                f"deepeval metrics need deepeval>=4 (this adapter follows its 4.x API), found "
                f"{found}: pip install 'mlflow-rag-eval[deepeval]'"
            )
        _DEEPEVAL = deepeval
    return _DEEPEVAL


def _deepeval_version() -> str:
    try:
        return version("deepeval")
    except PackageNotFoundError:
        return "not installed"


# -- deepeval's model interface on our judge -------------------------------------------------------

@functools.lru_cache(maxsize=1)
def _judge_llm_class() -> type:
    """The DeepEvalBaseLLM subclass (built on first use: deepeval is an optional import)."""
    deepeval = _import_deepeval()

    class JudgeLLM(deepeval.models.DeepEvalBaseLLM):
        """deepeval's LLM interface on one of our LLM judges.

        With a pydantic ``schema``, deepeval (4.x) takes an instance of it back from a custom
        model (native models return ``(result, cost)``; ours are not native, so no tuple) and
        without one, the reply text. With a schema every call is the judge's
        ``acomplete_structured`` (or ``complete_structured``), which validates, retries once
        with the validation error, then raises ``JudgeFailure("ParseError")``; without one,
        ``acomplete`` (or ``complete``).
        """

        def __init__(self, judge: LLMJudge):
            self.judge = judge
            super().__init__(model=getattr(judge, "name", None) or judge.info().name)

        def load_model(self, *args, **kwargs):
            return self.judge

        def get_model_name(self, *args, **kwargs) -> str:
            return self.name

        def generate(self, prompt: str, schema: Any = None):
            if schema is None:
                return self.judge.complete(_messages(prompt), source=SOURCE)
            return self.judge.complete_structured(_messages(prompt), schema, source=SOURCE,
                                                  data=_ROW_DATA.get())

        async def a_generate(self, prompt: str, schema: Any = None):
            if schema is None:
                return await self.judge.acomplete(_messages(prompt), source=SOURCE)
            return await self.judge.acomplete_structured(_messages(prompt), schema, source=SOURCE,
                                                         data=_ROW_DATA.get())

        # deepeval's own versions retry without the schema on *any* TypeError, which would
        # hide a bug and hand deepeval an unvalidated string.
        # No **kwargs: an argument we cannot honour (deepeval's ``audio``) is a TypeError, not
        # silently dropped.
        def generate_with_schema(self, prompt: str, schema: Any = None):
            return self.generate(prompt, schema=schema)

        async def a_generate_with_schema(self, prompt: str, schema: Any = None):
            return await self.a_generate(prompt, schema=schema)

    return JudgeLLM


def _messages(prompt: Any) -> list[dict[str, str]]:
    if not isinstance(prompt, str):
        # Multimodal prompts are lists of text and images; our judges take text.
        raise TypeError(f"the judge takes text prompts, got {type(prompt).__name__}")
    return [{"role": "user", "content": prompt}]


def _require_llm_judge(judge: Judge | None, metric: str) -> None:
    needed = ("complete", "acomplete", "complete_structured", "acomplete_structured")
    if not all(callable(getattr(judge, m, None)) for m in needed):
        name = judge.info().name if judge is not None else "none"
        raise JudgeCapabilityError(
            f"deepeval metrics need an LLM judge (openai:/..., bedrock:/..., endpoints:/..., "
            f"llamacpp:/... or scripted): {metric!r} sends deepeval's own prompts to the judge, "
            f"and judge {name!r} cannot complete a prompt"
        )


def deepeval_model(judge: LLMJudge):
    """deepeval's ``DeepEvalBaseLLM`` on our LLM judge, for any deepeval metric
    (``GEval(..., model=deepeval_model(judge))``)."""
    _require_llm_judge(judge, "deepeval")
    return _judge_llm_class()(judge)


# -- the metrics ----------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class DeepEvalMetric(Metric):
    """One deepeval metric, scored row by row with our judge as deepeval's model.

    Subclasses name the deepeval class and the record fields it reads; ``requires`` always
    includes what deepeval refuses to run without.
    """

    name: ClassVar[str] = "deepeval"
    #: the metric's name in deepeval's snake_case, as typed after ``deepeval:``
    deepeval_name: ClassVar[str]
    #: the class in ``deepeval.metrics``
    deepeval_class: ClassVar[str]
    primitives = _NEEDS

    @property
    def display_name(self) -> str:
        return f"deepeval:{self.deepeval_name}"

    @property
    def key(self) -> str:
        # MLflow on Windows refuses ":" in metric keys.
        return metric_key(self.display_name)

    def spec(self) -> dict[str, Any]:
        spec = super().spec()
        spec["library"] = {
            "name": "deepeval",
            "version": _deepeval_version(),
            "metric": self.deepeval_class,
            "settings": dict(METRIC_SETTINGS),
        }
        return spec

    def not_applicable(self, record: RagRecord) -> str | None:
        if "reference" in self.requires and not record.reference:
            return "no reference answer (deepeval's expected_output)"
        if "answer" in self.requires and not record.answer:
            # deepeval refuses an empty actual_output; it defines no score for it.
            return "empty answer (deepeval scores no empty actual_output)"
        return None

    def compute(self, records: Sequence[RagRecord], judge: Judge) -> list[RowResult]:
        _require_llm_judge(judge, self.display_name)
        deepeval = _import_deepeval()
        model = deepeval_model(judge)
        metric_cls = getattr(deepeval.metrics, self.deepeval_class)
        test_case_cls = deepeval.test_case.LLMTestCase

        async def one(record: RagRecord) -> RowResult:
            # This task's own context: the texts of this row only.
            _ROW_DATA.set((record.question, record.answer, *record.context_texts, record.reference or ""))
            try:
                # A fresh instance per row: deepeval keeps score, reason and verdicts on it.
                metric = metric_cls(model=model, **METRIC_SETTINGS)
                test_case = test_case_cls(
                    input=record.question,
                    actual_output=record.answer,
                    retrieval_context=record.context_texts,
                    expected_output=record.reference,
                )
                await metric.a_measure(test_case, _show_indicator=False)
            except JudgeFailure as exc:
                return RowResult.failed(f"{exc.kind}: {exc.message}")
            except JudgeUnreachable:  # no row can be judged: the evaluation stops
                raise
            except Exception as exc:  # one row's failure never stops the others
                return RowResult.failed(f"{type(exc).__name__}: {exc}")
            return _row(metric)

        def score(rows: list[int]) -> dict[int, RowResult]:
            async def every_row() -> list[RowResult]:
                return await asyncio.gather(*(one(records[i]) for i in rows))

            return dict(zip(rows, _run_own_loop(every_row)))

        return each_applicable(self, records, score)


def _row(metric: Any) -> RowResult:
    score = metric.score
    if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
        why = f" ({metric.error})" if getattr(metric, "error", None) else ""
        return RowResult.failed(f"NoScore: deepeval gave score {score!r}{why}")
    details = {
        name: _plain(getattr(metric, name))
        for name in ("truths", "claims", "statements", "verdicts", "verdicts_list")
        if getattr(metric, name, None) is not None
    }
    return RowResult.scored(float(score), str(metric.reason or ""), **details)


def _plain(value: Any) -> Any:
    """deepeval's intermediate results (pydantic models, enums) as JSON-ready values."""
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, str):
        return str(value)
    return value


def _run_own_loop(main):
    """Run ``main()`` on a fresh event loop: here, or in a worker thread when this thread
    already runs one (a notebook, an async app), so deepeval never touches the caller's loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(main())
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="deepeval-loop") as pool:
        return pool.submit(lambda: asyncio.run(main())).result()


@dataclasses.dataclass(frozen=True)
class DeepEvalFaithfulness(DeepEvalMetric):
    deepeval_name = "faithfulness"
    deepeval_class = "FaithfulnessMetric"
    requires = ("answer", "contexts")


@dataclasses.dataclass(frozen=True)
class DeepEvalAnswerRelevancy(DeepEvalMetric):
    deepeval_name = "answer_relevancy"
    deepeval_class = "AnswerRelevancyMetric"
    requires = ("answer",)


@dataclasses.dataclass(frozen=True)
class DeepEvalContextualPrecision(DeepEvalMetric):
    deepeval_name = "contextual_precision"
    deepeval_class = "ContextualPrecisionMetric"
    requires = ("contexts", "reference")


@dataclasses.dataclass(frozen=True)
class DeepEvalContextualRecall(DeepEvalMetric):
    deepeval_name = "contextual_recall"
    deepeval_class = "ContextualRecallMetric"
    requires = ("contexts", "reference")


@dataclasses.dataclass(frozen=True)
class DeepEvalContextualRelevancy(DeepEvalMetric):
    deepeval_name = "contextual_relevancy"
    deepeval_class = "ContextualRelevancyMetric"
    requires = ("contexts",)


#: ``deepeval:<name>`` -> metric class
SUPPORTED_METRICS: dict[str, type[DeepEvalMetric]] = {
    cls.deepeval_name: cls
    for cls in (DeepEvalFaithfulness, DeepEvalAnswerRelevancy, DeepEvalContextualPrecision,
                DeepEvalContextualRecall, DeepEvalContextualRelevancy)
}


def deepeval_metric(name: str) -> DeepEvalMetric:
    """The metric for ``deepeval:<name>`` (``name`` in snake_case, e.g. ``faithfulness``).

    Imports deepeval (quietly, telemetry off) so a missing or too old package is reported when
    the suite is resolved, before any judge call.
    """
    key = name.strip().lower()
    if key not in SUPPORTED_METRICS:
        raise ValueError(
            f"unknown deepeval metric {name!r}; supported: "
            + ", ".join(f"deepeval:{n}" for n in SUPPORTED_METRICS)
        )
    _import_deepeval()
    return SUPPORTED_METRICS[key]()
