"""The statistics table of a run: every statistic of every metric, over all rows and per slice.

A run logs as MLflow metrics only what a person compares across runs in the runs table (each
metric's mean and its CI bounds, :data:`~mlflow_rag_eval.keys.RUN_STATS`). The rest of what an
evaluation computed (the row counts, the median, p10, the worst decile's mean, and the same
figures on each slice of ``slice_by``) is this table: one row per (slice, metric), the whole
run first, logged as ``rag_eval/statistics.json`` in MLflow's table format (``columns`` and
``data``), which the run page's artifact viewer shows as a grid, and shown in the report.

It is a table to read: its figures are rounded to :data:`DIGITS` decimals. The figures a
decision needs are never read from it: the gate and ``compare`` recompute them from the rows
table, and read a slice's from ``rag_eval/slices.json`` (full precision, sealed).
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["ALL_ROWS", "COLUMNS", "DIGITS", "STATISTICS_FILE", "statistics_json", "statistics_rows"]

#: the run artifact holding the table
STATISTICS_FILE = "rag_eval/statistics.json"
#: the ``slice`` of the rows of the whole run
ALL_ROWS = "all rows"
#: decimals of the figures shown
DIGITS = 4
#: the table's columns, in order: the slice (``all rows``, or ``<field>=<value>``), the metric
#: key, the rows (of the run or the slice), the counts, the statistics, and the slice's field
#: and value apart (empty for the whole run)
COLUMNS = ("slice", "metric", "n_rows", "n_scored", "n_error", "n_skipped", "mean", "ci_low", "ci_high", "median",
           "p10", "worst10_mean", "field", "value")
#: :data:`~mlflow_rag_eval.keys.AGGREGATES`, the mean's first
_STATS = ("mean", "ci_low", "ci_high", "median", "p10", "worst10_mean")


def _row(where: str, metric: str, n_rows: int, summary, field: str | None, value: str | None) -> list[Any]:
    shown = [None if getattr(summary, s) is None else round(float(getattr(summary, s)), DIGITS) for s in _STATS]
    return [where, metric, n_rows, summary.n_scored, summary.n_error, summary.n_skipped, *shown, field, value]


def statistics_rows(figures, slices=None) -> list[list[Any]]:
    """The table's rows (in :data:`COLUMNS` order) of an evaluation's figures
    (:class:`~mlflow_rag_eval.evaluation.result.EvaluationFigures`) and, when it was sliced,
    its :class:`~mlflow_rag_eval.evaluation.slices.SliceTable`: the whole run's rows first, then
    each field's slices in the slice table's order, the metrics in the run's order."""
    rows = [_row(ALL_ROWS, m.key, figures.n_rows, m.summary, None, None) for m in figures.metrics]
    for f in (slices.fields if slices is not None else ()):
        for s in f.slices:
            rows += [_row(f"{f.field}={s.value}", key, len(s.rows), summary, f.field, s.value)
                     for key, summary in s.summaries.items()]
    return rows


def statistics_json(figures, slices=None) -> str:
    """``rag_eval/statistics.json``: :func:`statistics_rows` in MLflow's table format."""
    return json.dumps({"columns": list(COLUMNS), "data": statistics_rows(figures, slices)}, ensure_ascii=False)
