"""Runs a metric suite over records: up-front checks, batches, per-row isolation, a summary.

Order of work, so that bad input never costs a judge call:
1. the suite (:mod:`mlflow_rag_eval.suite`): named metrics checked, the default suite made of
   what the data can feed, the judge checked for every primitive;
2. each metric validates the records (errors name row and column);
3. score in batches; an exception inside a metric fails that batch's rows of that metric with a
   named error and the run goes on, except :class:`JudgeUnreachable`, which stops it;
4. :meth:`EvaluationResult.summary_text` says, per metric, what was scored, what failed and
   why, what did not apply: every route prints it.
"""

from __future__ import annotations

import contextvars
import dataclasses
import logging
import sys
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from mlflow_rag_eval.judges import Judge, JudgeInfo, JudgeUnreachable
from mlflow_rag_eval.metrics import Metric
from mlflow_rag_eval.metrics.base import batch_memo
from mlflow_rag_eval.records import ColumnMapping, RagRecord, dataset_digest
from mlflow_rag_eval.results import MetricFigures, MetricResult, RowResult
from mlflow_rag_eval.stats import SEED
from mlflow_rag_eval.suite import DEFAULT_METRICS, Suite, fields_present, prepare_suite

__all__ = [
    "DEFAULT_METRICS", "EvaluationContext", "EvaluationFigures", "EvaluationResult", "evaluate_records", "no_judge",
    "prepare_suite", "score_records",
]

_logger = logging.getLogger(__name__)

BATCH_SIZE = 1024


@dataclass(kw_only=True)
class EvaluationContext:
    """What an evaluation knows besides its metrics: the judge, the dataset, the suite, what
    it cost. Shared by :class:`EvaluationResult` (with the rows) and :class:`EvaluationFigures`
    (without), so both carry the same facts under the same names (keyword-only fields)."""

    judge: JudgeInfo
    dataset_digest: str
    timings: dict[str, float] = field(default_factory=dict)
    judge_usage: dict[str, Any] = field(default_factory=dict)
    #: the record fields the data provided (``reference``, ``relevant_ids``, ...)
    fields: frozenset[str] = frozenset({"answer", "contexts"})
    #: no metric was named: the suite is everything the data could feed
    default_suite: bool = False
    #: metric name -> why the default suite left it out
    left_out: dict[str, str] = field(default_factory=dict)
    #: judge-graded metric key -> the judge's calibration run on it, or None (no record); filled
    #: when the evaluation is logged (the tracking store holds the calibrations)
    calibration: dict[str, str | None] = field(default_factory=dict)

    def context(self) -> dict[str, Any]:
        """The context fields by name (the same dicts, not copies)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(EvaluationContext)}


@dataclass
class EvaluationFigures(EvaluationContext):
    """An evaluation's outcome without its rows: per-metric figures, the judge, the dataset.

    What a run's metrics, params, tags, lineage and printed summary are made of. The
    single-process route derives it from an :class:`EvaluationResult`
    (:meth:`EvaluationResult.figures`); the Spark route aggregates it from score columns and
    never holds the rows. One type for both, so both log and print the same things.
    """

    n_rows: int
    metrics: list[MetricFigures]

    def summary_text(self) -> str:
        """Per metric: rows scored, failed (the most common error kinds, one example each) and
        not applicable (why); what the default suite left out. Printed at the end of every
        evaluation, so a metric that failed is never found only by looking."""
        width = max([len(m.name) for m in self.metrics] + [6])
        lines = [f"rag eval summary: {self.n_rows} rows, judge {self.judge.name}"]
        for m in self.metrics:
            s = m.summary
            mean = f"mean {s.mean:.3f}" if s.mean is not None else "no score"
            lines.append(f"  {m.name:<{width}}  {s.n_scored:>6} scored  {s.n_error:>5} failed  "
                         f"{s.n_skipped:>5} not applicable  {mean}")
            for kind, n, example in m.failures()[:3]:
                lines.append(f"  {'':<{width}}    failed {n}x {kind}, e.g. {_clip(example)}")
            for reason, n in m.skip_reasons()[:2]:
                lines.append(f"  {'':<{width}}    not applicable {n}x: {_clip(reason)}")
        if self.left_out:
            lines.append("  left out of the default suite: "
                         + "; ".join(f"{name} ({why})" for name, why in self.left_out.items()))
        lines += self.calibration_lines()
        return "\n".join(lines)

    def calibration_lines(self) -> list[str]:
        """What the summary says of the judge's calibration (nothing before it is looked up)."""
        from mlflow_rag_eval.gate.lookup import uncalibrated_warning

        warning = uncalibrated_warning(self.judge.name, self.calibration)
        lines = [f"  WARNING: {warning}"] if warning else []
        lines += [f"  calibrated: {key} by run {run_id}" for key, run_id in self.calibration.items() if run_id]
        return lines

    def failed_metrics(self, max_error_rate: float = 0.0) -> list[MetricFigures]:
        """The metrics whose error rate is above ``max_error_rate``."""
        return [m for m in self.metrics if m.error_rate > max_error_rate]

    def aggregates(self) -> dict[str, float]:
        """Flat MLflow metrics: ``<key>/mean``, ``/median``, ``/p10``, ``/n_scored``, ...
        (``/panel_alpha``... too when a judge panel judged the metric)."""
        out: dict[str, float] = {}
        for m in self.metrics:
            out.update(m.aggregate_metrics())
        return out


@dataclass
class EvaluationResult(EvaluationContext):
    """Everything an evaluation produced, before any MLflow logging."""

    records: list[RagRecord]
    metrics: list[MetricResult]

    def figures(self) -> EvaluationFigures:
        """The outcome without the rows (it shares this result's ``calibration`` dict)."""
        return EvaluationFigures(n_rows=len(self.records), metrics=[m.figures() for m in self.metrics],
                                 **self.context())

    def summary_text(self) -> str:
        """See :meth:`EvaluationFigures.summary_text`."""
        return self.figures().summary_text()

    def calibration_lines(self) -> list[str]:
        """See :meth:`EvaluationFigures.calibration_lines`."""
        return self.figures().calibration_lines()

    def failed_metrics(self, max_error_rate: float = 0.0) -> list[MetricResult]:
        """The metrics whose error rate is above ``max_error_rate``."""
        return [m for m in self.metrics if m.error_rate > max_error_rate]

    def aggregates(self) -> dict[str, float]:
        """See :meth:`EvaluationFigures.aggregates`."""
        return self.figures().aggregates()

    def table(self, trace_ids: Sequence[str] | None = None) -> pd.DataFrame:
        """One row per record: inputs, outputs, ``<key>/score``, ``/justification``, ``/error``
        (``/traceback`` too when the metric itself raised; ``/support`` when the judge gave a
        support confidence), and the row's ``trace_id`` when its trace was logged."""
        data: dict[str, list[Any]] = {
            "question": [r.question for r in self.records],
            "answer": [r.answer for r in self.records],
            "contexts": [[c.text for c in r.contexts] for r in self.records],
            "context_ids": [[c.id for c in r.contexts] for r in self.records],
            "reference": [r.reference for r in self.records],
        }
        for m in self.metrics:
            data[f"{m.key}/score"] = [row.value for row in m.rows]
            data[f"{m.key}/justification"] = [row.justification for row in m.rows]
            data[f"{m.key}/error"] = [row.error for row in m.rows]
            if any(row.details.get("support") is not None for row in m.rows):  # ranks rows the score ties
                data[f"{m.key}/support"] = [row.details.get("support") for row in m.rows]
            if any(row.traceback for row in m.rows):  # an exception inside the metric: where from
                data[f"{m.key}/traceback"] = [row.traceback for row in m.rows]
        data["trace_id"] = list(trace_ids) if trace_ids is not None else [None] * len(self.records)
        return pd.DataFrame(data)


def evaluate_records(
    records: Sequence[RagRecord],
    metrics: Iterable[str | Metric] | None = None,
    judge: str | Judge | None = None,
    *,
    available_fields: set[str] | None = None,
    mapping: ColumnMapping | None = None,
    progress: bool | None = None,
    suite: Suite | None = None,
    seed: int = SEED,
) -> EvaluationResult:
    """Score ``records`` with a metric suite and a judge (default: the local MiniLM judge).

    Args:
        available_fields: record fields the data provides (e.g. ``{"answer", "contexts",
            "reference"}``); defaults to what the records themselves carry.
        progress: show a progress line on stderr (default: when stderr is a terminal).
        suite: a suite :func:`~mlflow_rag_eval.suite.prepare_suite` made already (the rag
            evaluator makes it before the pipeline runs); ``metrics`` and ``judge`` are then
            not used.
        seed: the bootstrap seed of the metrics' CIs.
    """
    records = list(records)
    mapping = mapping or ColumnMapping()
    if available_fields is None:
        available_fields = fields_present(records)
    if suite is None:
        suite = prepare_suite(metrics, judge, available_fields, mapping)
    suite.drop_inapplicable(records)
    for metric in suite.metrics:
        metric.validate(records, mapping)
    rows, timings = score_records(suite, records, progress=sys.stderr.isatty() if progress is None else progress)
    judge_obj = suite.judge
    results = [
        MetricResult(name=m.display_name, spec=m.spec(), rows=tuple(rows[m.display_name]),
                     greater_is_better=m.greater_is_better, judged=bool(m.primitives), seed=seed)
        for m in suite.metrics
    ]
    return EvaluationResult(
        records=records,
        metrics=results,
        judge=judge_obj.info() if judge_obj is not None else _NO_JUDGE,
        dataset_digest=dataset_digest(records),
        timings=timings,
        judge_usage=judge_obj.usage() if judge_obj is not None else {},
        fields=frozenset(available_fields),
        default_suite=suite.default,
        left_out=dict(suite.left_out),
    )


def score_records(suite: Suite, records: Sequence[RagRecord], *,
                  progress: bool = False) -> tuple[dict[str, list[RowResult]], dict[str, float]]:
    """Score records already validated for ``suite``: per metric name, one row result per
    record, and the seconds each metric took.

    The engine's batches and failure handling without the checks and the summary around them:
    a runner that validates the data itself (Spark, per partition, before any of it is
    scored) scores each share of the rows with this, so a row gets the same result on every
    route.
    """
    runner = _Runner(suite, len(records), progress)
    return runner.score(list(records)), runner.timings


class _Runner:
    """Runs a suite's metrics over batches of records and owns their failures: a metric that
    raises fails that batch's rows with the exception's kind, message and traceback, and the
    run goes on — except :class:`JudgeUnreachable`, which stops it."""

    def __init__(self, suite: Suite, n_records: int, progress: bool):
        self.suite, self.n_records, self.progress = suite, n_records, progress
        self.timings: dict[str, float] = {m.display_name: 0.0 for m in suite.metrics}
        self.errors = 0
        self.done_rows = 0
        self._lock = threading.Lock()

    def score(self, records: list[RagRecord]) -> dict[str, list[RowResult]]:
        metrics = self.suite.metrics
        rows: dict[str, list[RowResult]] = {m.display_name: [] for m in metrics}
        # An LLM judge waits on the network: its metrics run side by side, sharing the judge's
        # bounded pool, so one metric's local work (e.g. embeddings) overlaps the others' calls.
        # The local judge is CPU-bound: its metrics run one after another.
        parallel = bool(getattr(self.suite.judge, "parallel_metrics", False)) and len(metrics) > 1
        with ThreadPoolExecutor(max_workers=len(metrics) if parallel else 1) as pool:
            for start in range(0, len(records), BATCH_SIZE):
                batch = records[start : start + BATCH_SIZE]
                with batch_memo():  # what the batch's metrics share, dropped with the batch
                    # Each task runs in a copy of this context, which holds the batch's memo.
                    futures = [pool.submit(contextvars.copy_context().run, self.run, m, batch) for m in metrics]
                    outs = [f.result() for f in futures]
                for metric, out in zip(metrics, outs):
                    rows[metric.display_name].extend(out)
                self.done_rows += len(batch)
        if self.progress:
            print(file=sys.stderr)
        return rows

    def run(self, metric: Metric, batch: list[RagRecord]) -> list[RowResult]:
        start = time.perf_counter()
        try:
            out = metric.compute(batch, self.suite.judge)
            if len(out) != len(batch):
                raise RuntimeError(f"returned {len(out)} rows for {len(batch)}")
        except JudgeUnreachable:  # no row can be judged: stop, before anything is logged
            raise
        except Exception as exc:  # one metric's bug must not kill the run: it fails its rows
            _logger.warning("metric %s failed on a batch: %r", metric.display_name, exc)
            failure = RowResult.failed(f"MetricError: {type(exc).__name__}: {exc}",
                                       traceback=traceback.format_exc(limit=20))
            out = [failure] * len(batch)
        with self._lock:
            self.timings[metric.display_name] += time.perf_counter() - start
            self.errors += sum(r.status == "error" for r in out)
            if self.progress:
                judge = self.suite.judge
                hits = judge.usage().get("cache_hits", 0) if judge is not None else 0
                print(f"\rrag eval: {metric.display_name} done on rows up to "
                      f"{self.done_rows + len(batch)}/{self.n_records}, {self.errors} errors, {hits} cache hits",
                      end="", file=sys.stderr)
        return out


_NO_JUDGE = JudgeInfo(name="none", kind="none", model="", fingerprint="none", prompts_version="none")


def no_judge() -> JudgeInfo:
    """The judge identity of a suite that needs no judge (retrieval metrics only)."""
    return _NO_JUDGE


def _clip(text: str, n: int = 160) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1] + "…"
