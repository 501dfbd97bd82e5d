"""Per-row results and their summaries.

A row is scored (a finite value), failed (a named error: the judge could not decide) or not
applicable (the record lacks what the metric needs, e.g. no reference). Failures are counted
in ``n_error`` and never become a NaN in an aggregate; not-applicable rows are counted in
``n_skipped``.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

import numpy as np

from mlflow_rag_eval.keys import (  # metric_key re-exported: key naming lives in keys.py
    AGGREGATES,
    RUN_STATS,
    metric_key,
)
from mlflow_rag_eval.stats import SEED, mean_ci

__all__ = [
    "ERROR_KIND_PATTERN", "FAILED", "SCORED", "SKIPPED", "UNNAMED_ERROR_KIND", "ErrorRateExceeded", "MetricFigures", "MetricResult",
    "MetricSummary", "RowResult", "error_kind", "metric_key", "status_columns", "summarize", "summarize_values",
    "worst_decile_mean",
]

#: the kind an error string starts with, before a colon; a Java regex too (Spark SQL groups a
#: run's errors by it without bringing them to Python)
ERROR_KIND_PATTERN = r"^([A-Za-z][A-Za-z0-9_]*):"
#: the kind of an error that names none
UNNAMED_ERROR_KIND = "Error"
_KIND = re.compile(ERROR_KIND_PATTERN)


def error_kind(error: str) -> str:
    """The kind a row's error starts with (``ParseError: ...`` -> ``ParseError``)."""
    match = _KIND.match(error or "")
    return match.group(1) if match else UNNAMED_ERROR_KIND


class ErrorRateExceeded(RuntimeError):
    """More rows of a metric failed than the evaluation allows (``max_error_rate``)."""


@dataclass(frozen=True)
class RowResult:
    """One metric's outcome on one row.

    A failed row's ``error`` is ``"<Kind>: <message>"`` (``ParseError: ...``, ``Refusal: ...``,
    ``MetricError: ...``): :attr:`error_kind` and :attr:`error_message` are its parts, and
    ``traceback`` keeps where an exception inside a metric came from (the table shows it).
    """

    value: float | None = None
    error: str | None = None
    justification: str = ""
    details: Mapping[str, Any] = field(default_factory=dict)
    traceback: str | None = None

    @classmethod
    def scored(cls, value: float, justification: str = "", **details: Any) -> RowResult:
        value = float(value)
        if not math.isfinite(value):
            # A non-finite score is a bug upstream; refuse it here rather than average it.
            return cls(error=f"NonFiniteScore: metric produced {value!r}", details=details)
        return cls(value=value, justification=justification, details=details)

    @classmethod
    def failed(cls, error: str, *, traceback: str | None = None, **details: Any) -> RowResult:
        """A row the metric could not score: ``error`` is ``"<Kind>: <message>"``."""
        return cls(error=error, justification=error, details=details, traceback=traceback)

    @classmethod
    def not_applicable(cls, reason: str) -> RowResult:
        return cls(justification=f"not applicable: {reason}")

    @property
    def status(self) -> str:
        if self.error is not None:
            return "error"
        return "scored" if self.value is not None else "skipped"

    @property
    def error_kind(self) -> str | None:
        return error_kind(self.error) if self.error is not None else None

    @property
    def error_message(self) -> str | None:
        if self.error is None:
            return None
        kind = self.error_kind
        return self.error[len(kind) + 1 :].strip() if self.error.startswith(f"{kind}:") else self.error


@dataclass(frozen=True)
class MetricSummary:
    """Aggregates over the scored rows of one metric."""

    mean: float | None
    median: float | None
    #: the 10th percentile (``np.quantile(values, 0.1)``, interpolated): with 20 rows it lies
    #: between the 2nd and 3rd lowest, so it does not see the worst rows; see ``worst10_mean``
    p10: float | None
    n_scored: int
    n_error: int
    n_skipped: int
    #: seeded percentile bootstrap 95% CI of the mean (:func:`mlflow_rag_eval.stats.mean_ci`);
    #: None when not computable: fewer than two scored rows, or every scored row equal
    ci_low: float | None = None
    ci_high: float | None = None
    #: the mean of the worst decile of the scored rows (:func:`worst_decile_mean`): the lowest
    #: values of a greater-is-better metric, the highest of a lower-is-better one
    worst10_mean: float | None = None

    @property
    def error_rate(self) -> float:
        """Failed rows over the rows the metric applies to (0 when it applies to none)."""
        return self.n_error / (self.n_scored + self.n_error) if self.n_scored + self.n_error else 0.0

    def as_metrics(self, key: str) -> dict[str, float]:
        """MLflow metric entries; statistics of an all-failed metric are left out, not NaN."""
        out: dict[str, float] = {
            f"{key}/n_scored": float(self.n_scored),
            f"{key}/n_error": float(self.n_error),
        }
        for stat in AGGREGATES:
            value = getattr(self, stat)
            if value is not None:
                out[f"{key}/{stat}"] = float(value)
        return out


def summarize(rows: Sequence[RowResult], *, greater_is_better: bool = True, seed: int = SEED) -> MetricSummary:
    """The summary of one metric's rows (:func:`summarize_values` of the scored values, in row
    order, with the failed and not-applicable rows counted); ``greater_is_better`` is the
    metric's direction, which decides which rows are its worst."""
    values, status = status_columns(rows)
    return summarize_values(values[status == SCORED], int((status == FAILED).sum()), int((status == SKIPPED).sum()),
                            greater_is_better=greater_is_better, seed=seed)


#: a row's codes in :func:`status_columns`
SCORED, FAILED, SKIPPED = 0, 1, 2


def status_columns(rows: Iterable[RowResult]) -> tuple[np.ndarray, np.ndarray]:
    """Per row, in one pass, its value (NaN unless scored) and whether it was scored, failed or
    not applicable (:data:`SCORED`, :data:`FAILED`, :data:`SKIPPED`): what a summary reads of
    a row, as columns that a subset of the rows (a slice) is summarized from by index."""
    values, status = [], []
    for r in rows:  # one pass: the rows past the first thousands are read back from a file
        if r.error is not None:
            values.append(math.nan)
            status.append(FAILED)
        elif r.value is None:
            values.append(math.nan)
            status.append(SKIPPED)
        else:
            values.append(r.value)
            status.append(SCORED)
    return np.asarray(values, dtype=float), np.asarray(status, dtype=np.int8)


def worst_decile_mean(values: np.ndarray, *, greater_is_better: bool) -> float:
    """The mean of the worst ``ceil(0.1 * n)`` of ``n`` values (at least one): the lowest of a
    greater-is-better metric, the highest of a lower-is-better one.

    Why beside p10: p10 interpolates between the sorted values, so one or two rows at 0 among
    twenty at 1 leave it near 1, and a floor on it does not guard the worst rows; this one
    moves with every row of the worst decile.
    """
    n_worst = max(1, -(-len(values) // 10))  # ceil(n / 10) in integers: 0.1 * 30 is 3.0000000000000004
    ordered = np.sort(values)
    worst = ordered[:n_worst] if greater_is_better else ordered[len(ordered) - n_worst:]
    return float(worst.mean())


def summarize_values(values: Sequence[float] | np.ndarray, n_error: int, n_skipped: int, *,
                     greater_is_better: bool = True, seed: int = SEED) -> MetricSummary:
    """Mean, median, p10 (the 10th percentile), the mean of the worst decile
    (:func:`worst_decile_mean`, by the metric's direction ``greater_is_better``) and a seeded
    bootstrap 95% CI of the mean (None when not computable: one scored row, or all equal; see
    :mod:`mlflow_rag_eval.stats`).

    The one home of a metric's statistics, on values rather than rows, so that a route that
    never holds the rows (Spark collects only the score columns) computes the same figures.
    ``values`` are the scored rows' values in row order: the mean's float sum follows it.
    """
    values = np.asarray(values, dtype=float)
    if len(values) == 0:
        return MetricSummary(None, None, None, 0, n_error, n_skipped)
    ci = mean_ci(values, seed=seed)
    low, high = ci if ci is not None else (None, None)
    return MetricSummary(
        mean=float(values.mean()),
        median=float(np.median(values)),
        p10=float(np.quantile(values, 0.1)),
        n_scored=len(values),
        n_error=n_error,
        n_skipped=n_skipped,
        ci_low=low,
        ci_high=high,
        worst10_mean=worst_decile_mean(values, greater_is_better=greater_is_better),
    )


@dataclass(frozen=True)
class MetricFigures:
    """One metric's outcome over a run without its rows: what the run's metrics, params,
    lineage and summary are made of.

    :meth:`MetricResult.figures` derives it from the rows; a route that never holds the rows
    (Spark) aggregates it from columns, so both log the same run from the same code.
    """

    name: str
    spec: Mapping[str, Any]
    summary: MetricSummary
    greater_is_better: bool = True
    judged: bool = False
    #: ``(kind, rows, first example)`` per error kind, the most frequent first
    failure_counts: tuple[tuple[str, int, str], ...] = ()
    #: ``(reason, rows)`` per reason a row was not applicable, the most frequent first
    skip_counts: tuple[tuple[str, int], ...] = ()
    #: a judge panel's agreement on the metric (:class:`~mlflow_rag_eval.stats.agreement.PanelAgreement`,
    #: without its per-row votes), None when no panel judged it or the rows were not held
    agreement: Any = None

    @property
    def key(self) -> str:
        return metric_key(self.name)

    @property
    def error_rate(self) -> float:
        return self.summary.error_rate

    def aggregate_metrics(self) -> dict[str, float]:
        """The metric's MLflow aggregates: the summary's, and a panel's agreement when one
        judged it (``<key>/panel_alpha``...)."""
        out = self.summary.as_metrics(self.key)
        if self.agreement is not None:
            out.update(self.agreement.as_metrics(self.key))
        return out

    def run_metrics(self, run_metrics: str = "means") -> dict[str, float]:
        """What a run logs of the metric as MLflow metrics (:data:`~mlflow_rag_eval.keys.RUN_METRICS`):
        its :data:`~mlflow_rag_eval.keys.RUN_STATS` (``"means"``), or every aggregate (``"all"``)."""
        every = self.aggregate_metrics()
        if run_metrics == "all":
            return every
        wanted = {f"{self.key}/{stat}" for stat in RUN_STATS}
        return {k: v for k, v in every.items() if k in wanted}

    def failures(self) -> list[tuple[str, int, str]]:
        return list(self.failure_counts)

    def skip_reasons(self) -> list[tuple[str, int]]:
        return list(self.skip_counts)


@dataclass(frozen=True)
class MetricResult:
    """All rows of one metric, with the metric's saved spec. ``rows`` is read like a tuple:
    the engine's keeps the rows past the first few thousand in a temporary file
    (:class:`~mlflow_rag_eval._util.spooled.SpooledSequence`)."""

    name: str
    spec: Mapping[str, Any]
    rows: Sequence[RowResult]
    greater_is_better: bool = True
    #: computed with a judge (its rows are the judge's verdicts), not from ids alone
    judged: bool = False
    #: the bootstrap seed of the summary's CI (every route uses :data:`~mlflow_rag_eval.stats.SEED`
    #: unless told otherwise)
    seed: int = SEED

    @property
    def key(self) -> str:
        return metric_key(self.name)

    @cached_property
    def summary(self) -> MetricSummary:
        return summarize(self.rows, greater_is_better=self.greater_is_better, seed=self.seed)

    @cached_property
    def agreement(self):
        """The judge panel's agreement on this metric
        (:class:`~mlflow_rag_eval.stats.agreement.PanelAgreement`), or None when no panel judged it."""
        from mlflow_rag_eval.stats.agreement import panel_agreement

        return panel_agreement(self.rows) if self.judged else None

    def aggregate_metrics(self) -> dict[str, float]:
        """See :meth:`MetricFigures.aggregate_metrics`."""
        return self.figures().aggregate_metrics()

    @property
    def error_rate(self) -> float:
        """Failed rows over the rows the metric applies to (0 when it applies to none)."""
        return self.summary.error_rate

    def figures(self) -> MetricFigures:
        """The metric's outcome without its rows."""
        agreement = self.agreement
        return MetricFigures(self.name, self.spec, self.summary, self.greater_is_better, self.judged,
                             tuple(self.failures()), tuple(self.skip_reasons()),
                             replace(agreement, row_units=()) if agreement is not None else None)

    def failures(self) -> list[tuple[str, int, str]]:
        """``(kind, rows, first example)`` per error kind, the most frequent first."""
        counts: Counter[str] = Counter()
        examples: dict[str, str] = {}
        for row in self.rows:
            if row.error is not None:
                kind = error_kind(row.error)
                counts[kind] += 1
                examples.setdefault(kind, row.error)
        return [(kind, n, examples[kind]) for kind, n in counts.most_common()]

    def skip_reasons(self) -> list[tuple[str, int]]:
        """``(reason, rows)`` for the rows the metric does not apply to, the most frequent first."""
        reasons = Counter(
            row.justification.removeprefix("not applicable: ") for row in self.rows if row.status == "skipped"
        )
        return reasons.most_common()
