"""What an evaluation returns: its rows and metrics (:class:`EvaluationResult`), the same
without the rows (:class:`EvaluationFigures`, what runs log and summaries print), and the facts
both share (:class:`EvaluationContext`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from mlflow_rag_eval.judges import JUDGE_STOPPED, JudgeInfo
from mlflow_rag_eval.records import RagRecord
from mlflow_rag_eval.results import MetricFigures, MetricResult

__all__ = ["EvaluationContext", "EvaluationFigures", "EvaluationResult", "uncalibrated_warning"]


def uncalibrated_warning(judge: str, calibration: dict[str, str | None]) -> str | None:
    """One line saying which metrics come from a judge without a calibration record, or None."""
    missing = [key for key, run_id in calibration.items() if run_id is None]
    if not missing:
        return None
    return (f"uncalibrated judge: {judge} has no calibration record for {', '.join(missing)}; these numbers "
            "rank rows but are not validated against human labels (mlflow-rag-eval calibrate)")


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

    @property
    def stopped(self) -> str | None:
        """Why the judge stopped before judging every row (an outage past its budget: those
        rows failed as ``JudgeStopped``), None when it did not. Read from the rows' errors, so
        every route (the Spark one aggregates figures) says it the same way."""
        for m in self.metrics:
            for kind, _, example in m.failures():
                if kind == JUDGE_STOPPED:
                    return example.removeprefix(f"{JUDGE_STOPPED}: not judged: ")
        return None

    @property
    def rows_not_judged(self) -> int:
        """Rows the judge stopped before (at least; per metric the most): 0 when it did not stop."""
        return max((n for m in self.metrics for kind, n, _ in m.failures() if kind == JUDGE_STOPPED), default=0)

    def summary_text(self) -> str:
        """Per metric: rows scored, failed (the most common error kinds, one example each) and
        not applicable (why); what the default suite left out. Printed at the end of every
        evaluation, so a metric that failed is never found only by looking."""
        width = max([len(m.name) for m in self.metrics] + [6])
        lines = [f"rag eval summary: {self.n_rows} rows, judge {self.judge.name}"]
        if self.stopped:
            lines.append(f"  STOPPED, {self.rows_not_judged} rows not judged (JudgeStopped): {self.stopped}")
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
        warning = uncalibrated_warning(self.judge.name, self.calibration)
        lines = [f"  WARNING: {warning}"] if warning else []
        lines += [f"  calibrated: {key} by run {run_id}" for key, run_id in self.calibration.items() if run_id]
        return lines

    def failed_metrics(self, max_error_rate: float = 0.0) -> list[MetricFigures]:
        """The metrics whose error rate is above ``max_error_rate``."""
        return [m for m in self.metrics if m.error_rate > max_error_rate]

    def aggregates(self) -> dict[str, float]:
        """Every statistic as a flat dict: ``<key>/mean``, ``/median``, ``/p10``, ``/worst10_mean``,
        ``/n_scored``, ... (``/panel_alpha``... too when a judge panel judged the metric)."""
        out: dict[str, float] = {}
        for m in self.metrics:
            out.update(m.aggregate_metrics())
        return out

    def run_metrics(self, run_metrics: str = "means") -> dict[str, float]:
        """What the run logs as MLflow metrics (:data:`~mlflow_rag_eval.keys.RUN_METRICS`): each
        metric's mean and CI bounds, or (``"all"``) :meth:`aggregates`."""
        out: dict[str, float] = {}
        for m in self.metrics:
            out.update(m.run_metrics(run_metrics))
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

    def run_metrics(self, run_metrics: str = "means") -> dict[str, float]:
        """See :meth:`EvaluationFigures.run_metrics`."""
        return self.figures().run_metrics(run_metrics)

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


def _clip(text: str, n: int = 160) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1] + "…"
