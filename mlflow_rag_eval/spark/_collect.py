"""A Spark evaluation's figures, read from its scored rows without bringing the rows to the driver.

What comes to the driver: the score columns (8 bytes per row and metric, in row order, for the
statistics and the report's charts), counts per error kind and skip reason, the worst rows
(a bounded number per metric) and the dataset digest, streamed. The statistics are
:func:`~mlflow_rag_eval.results.summarize_values` of the same values in the same order as the
single-process route's, so the means, quantiles and seeded bootstrap CIs are the same numbers.
"""

from __future__ import annotations

import math
import operator
import pickle
from collections.abc import Sequence
from functools import partial, reduce

import numpy as np
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from mlflow_rag_eval.evaluation.slices import slice_table
from mlflow_rag_eval.metrics import Metric
from mlflow_rag_eval.records import RagRecord, digest_of_sorted_items
from mlflow_rag_eval.report.worst import WORST_ROWS_SCHEMA_VERSION, metric_entry, row_entry
from mlflow_rag_eval.results import (
    ERROR_KIND_PATTERN,
    UNNAMED_ERROR_KIND,
    MetricFigures,
    MetricResult,
    RowResult,
    summarize_values,
)
from mlflow_rag_eval.spark._worker import (
    RECORD_BLOBS_SCHEMA,
    Plan,
    equal_runs,
    item_chunks,
    metric_columns,
    record_blobs,
    row_result,
    slice_column,
)

__all__ = [
    "WORST_LIMIT", "check_rows", "digest", "metric_figures", "metric_results", "records", "score_arrays",
    "slice_members", "slice_summaries", "worst_rows",
]

#: worst rows, and errored rows, listed per metric when the rows are not held
WORST_LIMIT = 50


def _col(name: str) -> Column:
    """A column by its exact name (metric columns have ``/`` in them; a key may have ``.``)."""
    return F.col("`" + name.replace("`", "``") + "`")


def score_arrays(out: DataFrame, metrics: Sequence[Metric], n_rows: int) -> tuple[dict[str, np.ndarray],
                                                                                  dict[str, np.ndarray]]:
    """Per metric key, every row's score in row order, NaN where the row was not scored (a
    scored value is always finite, so NaN stands for nothing else); and whether each row failed
    (a row neither scored nor failed was not applicable). One ordered read of the output."""
    table = out.orderBy("row").select(
        "row", *[_col(metric_columns(m.key)["score"]) for m in metrics],
        *[_col(metric_columns(m.key)["error"]).isNotNull() for m in metrics]).toArrow()
    check_rows(table.column("row").to_numpy(), n_rows)
    scores = {m.key: np.asarray(table.column(1 + i).to_numpy(zero_copy_only=False), dtype=float)
              for i, m in enumerate(metrics)}
    errors = {m.key: np.asarray(table.column(1 + len(metrics) + i).to_numpy(zero_copy_only=False), dtype=bool)
              for i, m in enumerate(metrics)}
    return scores, errors


def slice_members(out: DataFrame, slice_by: Sequence[str], n_rows: int) -> dict[str, tuple[dict[str, np.ndarray], int]]:
    """:func:`mlflow_rag_eval.evaluation.slices.slice_members` from the output's ``slice/<field>`` columns:
    per field, value -> its rows in order (values sorted as text), and the rows with no value."""
    members = {}
    for field in slice_by:
        column = _col(slice_column(field))
        table = (out.select("row", F.explode(column).alias("label")).orderBy("label", "row").toArrow())
        labels = np.asarray(table.column("label").to_pylist(), dtype=object)
        rows = table.column("row").to_numpy()
        by_value = {}
        for start, end in equal_runs(labels):
            by_value[str(labels[start])] = rows[start:end]
        with_value = len(np.unique(rows)) if len(rows) else 0
        members[field] = ({v: by_value[v] for v in sorted(by_value)}, n_rows - with_value)
    return members


def slice_summaries(members: dict, figures: Sequence[MetricFigures], scores: dict[str, np.ndarray],
                    errors: dict[str, np.ndarray], n_rows: int, *, seed: int):
    """The :class:`~mlflow_rag_eval.evaluation.slices.SliceTable` of a run that is not held: each slice's
    summaries by :func:`~mlflow_rag_eval.results.summarize_values` of its rows' scores, in row
    order and in the metric's direction, as the single-process route summarizes the rows themselves."""
    directions = {m.key: m.greater_is_better for m in figures}

    def summarize_rows(key: str, rows: np.ndarray):
        column, failed = scores[key][rows], errors[key][rows]
        values = column[~np.isnan(column)]
        n_error = int(failed.sum())
        return summarize_values(values, n_error, len(rows) - len(values) - n_error,
                                greater_is_better=directions[key], seed=seed)

    return slice_table(list(members), members, n_rows, {m.key: (m.name, m.greater_is_better) for m in figures},
                       summarize_rows)


def check_rows(rows: np.ndarray, n_rows: int) -> None:
    """The scored rows, in row order, are rows 0 to n - 1, each once: else the data's order
    changed between its reads (a DataFrame straight out of a shuffle) and row numbers, errors'
    included, would name other rows."""
    if len(rows) != n_rows or not np.array_equal(rows, np.arange(n_rows)):
        raise RuntimeError(
            f"the row index is not stable: {n_rows} rows were read, {len(rows)} scored, under other indices. "
            "The DataFrame's order changes between reads: sort it, or write it out and evaluate the Parquet path")


def metric_figures(out: DataFrame, metrics: Sequence[Metric], scores: dict[str, np.ndarray], n_rows: int,
                   *, seed: int) -> list[MetricFigures]:
    """Each metric's figures: statistics of its scores; its error kinds and skip reasons, with
    their rows and first example, counted by Spark in one job for every metric."""
    counted = _counted(out, metrics)
    figures = []
    for i, metric in enumerate(metrics):
        column = scores[metric.key]
        values = column[~np.isnan(column)]
        failures = counted.get((i, "error"), ())
        skips = counted.get((i, "skip"), ())
        n_error = sum(n for _, n, _ in failures)
        figures.append(MetricFigures(
            name=metric.display_name, spec=metric.spec(),
            summary=summarize_values(values, n_error, n_rows - len(values) - n_error,
                                     greater_is_better=metric.greater_is_better, seed=seed),
            greater_is_better=metric.greater_is_better, judged=bool(metric.primitives),
            failure_counts=failures, skip_counts=tuple((label, n) for label, n, _ in skips),
        ))
    return figures


def _counted(out: DataFrame, metrics: Sequence[Metric]) -> dict[tuple[int, str], tuple[tuple, ...]]:
    """Per (metric position, ``error`` | ``skip``): ``(label, rows, first example)`` per error kind
    or skip reason, the most frequent first, ties in order of first row: what
    ``Counter.most_common`` gives the single-process route (``MetricResult.failures``)."""
    facts = []
    for i, metric in enumerate(metrics):
        columns = metric_columns(metric.key)
        error = _col(columns["error"])
        kind = F.regexp_extract(error, ERROR_KIND_PATTERN, 1)
        facts.append(F.struct(F.lit(i).alias("m"), F.lit("error").alias("what"),
                              F.when(error.isNull(), None).when(kind == "", UNNAMED_ERROR_KIND).otherwise(kind)
                              .alias("label"), error.alias("example")))
        facts.append(F.struct(F.lit(i).alias("m"), F.lit("skip").alias("what"),
                              _col(columns["skip_reason"]).alias("label"), F.lit(None).cast("string").alias("example")))
    present = F.filter(F.array(*facts), lambda fact: fact["label"].isNotNull())
    # most rows are scored by every metric: only the others are exploded and grouped
    unscored = reduce(operator.or_, [_col(metric_columns(m.key)[f]).isNotNull()
                                     for m in metrics for f in ("error", "skip_reason")])
    found = (out.filter(unscored).select("row", F.explode(present).alias("f"))
             .groupBy("f.m", "f.what", "f.label")
             .agg(F.count(F.lit(1)).alias("n"), F.min("row").alias("first"),
                  F.min_by("f.example", "row").alias("example"))
             .collect())
    grouped: dict[tuple[int, str], list] = {}
    for r in found:
        grouped.setdefault((r["m"], r["what"]), []).append(r)
    return {key: tuple((r["label"], int(r["n"]), r["example"]) for r in sorted(rows, key=lambda r: (-r["n"], r["first"])))
            for key, rows in grouped.items()}


def digest(out: DataFrame) -> str:
    """:func:`~mlflow_rag_eval.records.dataset_digest` of the rows: their items sorted by Spark
    (binary string order, the same as Python's), joined into chunks in the executors
    (:func:`~mlflow_rag_eval.spark._worker.item_chunks`; the sort's partitions are in order) and
    streamed into the hash a partition at a time: constant memory on the driver."""
    sorted_items = out.select("dataset_item").orderBy("dataset_item")
    chunks = sorted_items.mapInArrow(item_chunks, "chunk string").toLocalIterator(prefetchPartitions=True)
    return digest_of_sorted_items(r[0] for r in chunks)


def worst_rows(out: DataFrame, figures: Sequence[MetricFigures], scores: dict[str, np.ndarray], n_rows: int, *,
               fraction: float = 0.1, min_rows: int = 1, limit: int = WORST_LIMIT) -> dict:
    """``rag_eval/worst_rows.json`` for rows that are not held: per metric, the first ``limit``
    rows of the single-process list (:func:`mlflow_rag_eval.report.worst_rows`: the worst
    ``fraction`` of scored rows below the best score, every row tied at the cut-off, ordered by
    score, support, row) and the first ``limit`` errors. The document says so with ``limit``.

    The cut-off and the length of the full list come from the score columns on the driver;
    Spark finds the rows (a top-``limit`` per metric) and their texts (one filtered read).
    """
    chosen: dict[str, list[int]] = {}
    errored: dict[str, list[int]] = {}
    best: dict[str, float | None] = {}
    cutoff: dict[str, float | None] = {}
    for m in figures:
        columns = metric_columns(m.key)
        column = scores[m.key]
        sign = 1.0 if m.greater_is_better else -1.0
        signed = sign * column[~np.isnan(column)]  # the lower, the worse
        best[m.key] = float(sign * signed.max()) if len(signed) else None
        below = signed[signed < signed.max()] if len(signed) else signed
        k = min(len(below), max(min_rows, math.ceil(fraction * len(signed))))
        chosen[m.key], cutoff[m.key] = [], None
        if k:
            edge = np.partition(below, k - 1)[k - 1]
            cutoff[m.key] = float(sign * edge)
            listed = min(limit, int(np.count_nonzero(below <= edge)))  # ties at the cut-off are listed too
            score = _col(columns["score"])
            order = [F.lit(sign) * score, F.lit(sign) * F.coalesce(_col(columns["support"]), score), F.col("row")]
            chosen[m.key] = [r[0] for r in out.filter(F.lit(sign) * score < F.lit(float(signed.max())))
                             .orderBy(*order).select("row").limit(listed).collect()]
        errored[m.key] = [r[0] for r in out.filter(_col(columns["error"]).isNotNull()).orderBy("row")
                          .select("row").limit(limit).collect()] if m.summary.n_error else []
    wanted = sorted({i for rows in chosen.values() for i in rows} | {i for rows in errored.values() for i in rows})
    fields = ["score", "justification", "error", "traceback", "details"]
    texts = {}
    if wanted:
        picked = out.filter(F.col("row").isin(wanted)).select(
            "row", "question", "answer",
            *[_col(metric_columns(m.key)[f]).alias(f"{j}:{f}") for j, m in enumerate(figures) for f in fields])
        texts = {r["row"]: r for r in picked.collect()}

    def entry(j: int, i: int, *, error: bool) -> dict:
        r = texts[i]
        result = row_result(*(r[f"{j}:{f}"] for f in fields))
        return row_entry(i, r["question"], r["answer"], result, error=error)

    metrics = {}
    for j, m in enumerate(figures):
        metrics[m.key] = metric_entry(
            m, best=best[m.key], cutoff=cutoff[m.key], worst=[entry(j, i, error=False) for i in chosen[m.key]],
            errors=[entry(j, i, error=True) for i in errored[m.key]],
        )
    return {"schema_version": WORST_ROWS_SCHEMA_VERSION, "fraction": fraction, "min_rows": min_rows,
            "limit": limit, "n_rows": n_rows, "metrics": metrics}


# -- runs small enough to hold ----------------------------------------------------------------
def records(indexed: DataFrame, plan: Plan) -> list[RagRecord]:
    """The records of every row, in row order, read by the workers as when they were scored."""
    blobs = indexed.mapInArrow(partial(record_blobs, plan), RECORD_BLOBS_SCHEMA).orderBy("row").toArrow()
    return [pickle.loads(b) for b in blobs.column("record").to_pylist()]


def metric_results(out: DataFrame, metrics: Sequence[Metric], n_rows: int, *, seed: int) -> list[MetricResult]:
    """Every metric's row results, in row order, back from the output columns."""
    fields = ["score", "justification", "error", "traceback", "details"]
    table = out.orderBy("row").select(
        "row", *[_col(metric_columns(m.key)[f]).alias(f"{j}:{f}") for j, m in enumerate(metrics) for f in fields]
    ).toArrow()
    check_rows(table.column("row").to_numpy(), n_rows)
    table = table.to_pydict()
    results = []
    for j, m in enumerate(metrics):
        rows: tuple[RowResult, ...] = tuple(row_result(*cells) for cells in zip(*(table[f"{j}:{f}"] for f in fields)))
        results.append(MetricResult(name=m.display_name, spec=m.spec(), rows=rows, greater_is_better=m.greater_is_better,
                                    judged=bool(m.primitives), seed=seed))
    return results
