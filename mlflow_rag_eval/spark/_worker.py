"""What runs in Spark's Python workers: batches of rows in, validation facts or scored rows out.

A batch is turned into records by :func:`~mlflow_rag_eval.records.records_from_frame`, the code
of the single-process route, and scored by :func:`~mlflow_rag_eval.evaluation.engine.score_records`, its
engine: a cell means the same thing and a row gets the same result on every route.

Batches come as Arrow (``mapInArrow``) and become pandas by pyarrow's own ``to_pandas``, the
conversion ``pandas.read_parquet`` makes, so the cells of a Parquet file are the objects the
single-process route reads from it (and the conversion is a quarter faster than
``mapInPandas``'s); maps become dicts, as Spark users expect of a ``MapType``.

A judge travels as its name and is built once per Python worker and evaluation
(:func:`judge_for`; Spark reuses workers across tasks), never pickled: a judge holds a model, a
cache, connections. The embedding model it loads is cached per process
(``judges.embedding.load_model``), so a worker loads it once, whatever it evaluates.

Rows are scored in the engine's blocks: the rows ``[k * BATCH_SIZE, (k + 1) * BATCH_SIZE)`` of
a partition go to the engine together, as the single-process engine batches them. What a
metric computes per batch (the local judge embeds a batch's texts in one call, and float32
results depend, in their last digits, on which texts share the call) then sees the same rows.
"""

from __future__ import annotations

import json
import numbers
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
from pyspark.accumulators import Accumulator, AccumulatorParam
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from mlflow_rag_eval.evaluation.engine import BATCH_SIZE, score_records
from mlflow_rag_eval.evaluation.slices import attach_columns, labels_of
from mlflow_rag_eval.evaluation.suite import Suite
from mlflow_rag_eval.judges import Judge, get_judge
from mlflow_rag_eval.metrics import Metric
from mlflow_rag_eval.records import ColumnMapping, RagRecord, RecordError, dataset_item, records_from_frame
from mlflow_rag_eval.report.worst import json_safe
from mlflow_rag_eval.results import RowResult
from mlflow_rag_eval.spark._index import ROW

__all__ = [
    "FACTS_SCHEMA", "Plan", "RECORD_BLOBS_SCHEMA", "SumParam", "item_chunks", "judge_for", "metric_columns",
    "output_schema", "record_blobs", "row_result", "score_batches", "slice_column", "validate_batches",
]

_NOT_APPLICABLE = "not applicable: "


@dataclass(frozen=True)
class Plan:
    """What every worker needs to read and score rows; small, and pickled with the functions."""

    metrics: tuple[Metric, ...]
    #: the judge's name, or None when no metric needs one
    judge: str | None
    mapping: ColumnMapping
    #: names this evaluation: its judge is not another evaluation's
    evaluation: str = ""
    #: the default suite: report, per metric, whether any row can be scored
    check_applicable: bool = False
    #: fields to slice by (:mod:`mlflow_rag_eval.evaluation.slices`): columns named here are copied into
    #: each record's metadata, and each row's labels are written as ``slice/<field>``
    slice_by: tuple[str, ...] = ()
    #: options every worker builds its judge with: the user's ``judge_options``, with the worker's
    #: share of the rate limit and concurrency (:func:`mlflow_rag_eval.spark._run.worker_share`)
    judge_options: tuple[tuple[str, Any], ...] = ()


_JUDGES: dict[tuple[str, str], Judge] = {}
_JUDGES_LOCK = threading.Lock()


def judge_for(name: str, evaluation: str = "", options: tuple[tuple[str, Any], ...] = ()) -> Judge:
    """The judge named ``name`` (built with ``options``), once per Python worker and evaluation.

    Fresh for each evaluation, as ``evaluate_records`` builds one: the embeddings a judge caches
    while scoring one evaluation never decide another's last digits. Only the latest
    evaluation's judges are kept (a worker serves one evaluation at a time).
    """
    key = (name, evaluation)
    with _JUDGES_LOCK:
        if key not in _JUDGES:
            for old in [k for k in _JUDGES if k[1] != evaluation]:
                del _JUDGES[old]
            _JUDGES[key] = get_judge(name, **dict(options))
        return _JUDGES[key]


def _pandas(batches: Iterator[pa.RecordBatch]) -> Iterator[pd.DataFrame]:
    for batch in batches:
        if batch.num_rows:
            yield batch.to_pandas(maps_as_pydicts="strict")


def _arrow(frame: pd.DataFrame, schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_pandas(frame, schema=schema, preserve_index=False)


def _records(plan: Plan, batch: pd.DataFrame, *, attach: bool = True) -> list[RagRecord]:
    """The batch's records, with the columns named in ``slice_by`` in their metadata (as the
    single-process route attaches them) unless ``attach`` is false."""
    frame = batch.drop(columns=[ROW]).reset_index(drop=True)
    records = records_from_frame(frame, plan.mapping)
    return attach_columns(records, frame, plan.slice_by) if plan.slice_by and attach else records


# -- validation -------------------------------------------------------------------------------
#: One row per fact a batch reports: ``batch`` (its first row and size), ``record_error`` (its
#: first bad cell), ``metric_error`` (a metric's first refusal of its rows), ``applies``
#: (default suite: whether the metric can score any of its rows, with its first row's reason).
FACTS_SCHEMA = StructType([
    StructField("kind", StringType()),
    StructField("metric", StringType()),
    StructField("row", LongType()),
    StructField("n", LongType()),
    StructField("column", StringType()),
    StructField("reason", StringType()),
    StructField("applies", BooleanType()),
])
_FACT_COLUMNS = [f.name for f in FACTS_SCHEMA.fields]


def validate_batches(plan: Plan, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Check every row as the single-process route does, calling no judge; yield facts.

    Rows arrive in index order within a partition, so the first error of a batch is its
    lowest row; past a partition's first bad cell nothing more of it is checked.
    """
    schema = to_arrow_schema(FACTS_SCHEMA)
    bad_record = False
    refused: set[str] = set()
    for batch in _pandas(batches):
        rows = batch[ROW].to_numpy()
        facts: list[tuple] = [("batch", None, int(rows[0]), len(batch), None, None, None)]
        if not bad_record:
            try:
                records = _records(plan, batch, attach=False)  # _slice_facts checks the columns
            except RecordError as exc:
                bad_record = True
                facts.append(("record_error", None, _global(rows, exc.row), None, exc.column, exc.reason, None))
            else:
                facts += _metric_facts(plan, records, rows, refused)
                facts += _slice_facts(plan, records, batch, rows)
        yield _arrow(pd.DataFrame(facts, columns=_FACT_COLUMNS).astype({"row": "Int64", "n": "Int64"}), schema)


def _metric_facts(plan: Plan, records: list[RagRecord], rows: np.ndarray, refused: set[str]) -> list[tuple]:
    facts = []
    for metric in plan.metrics:
        name = metric.display_name
        if plan.check_applicable:
            reasons = [metric.not_applicable(r) for r in records]
            applies = any(reason is None for reason in reasons)
            facts.append(("applies", name, int(rows[0]), None, None, reasons[0], applies))
        if name in refused:
            continue
        try:
            metric.validate(records, plan.mapping)
        except RecordError as exc:
            refused.add(name)
            facts.append(("metric_error", name, _global(rows, exc.row), None, exc.column, exc.reason, None))
    return facts


def _slice_facts(plan: Plan, records: list[RagRecord], batch: pd.DataFrame, rows: np.ndarray) -> list[tuple]:
    """Per slice field: ``slice`` (its distinct labels in the batch as a JSON list; ``applies``:
    whether a row's metadata has the field), or ``slice_error`` at the first value that is no
    label. ``records`` are read without the columns attached, so a field that is both a column
    and a metadata key shows as a column (the driver knows the columns) that ``applies``."""
    facts = []
    for field in plan.slice_by:
        if field in batch.columns:
            values = batch[field].tolist()
        else:
            values = [r.metadata.get(field) for r in records]
        labels: dict[str, None] = {}
        try:
            for i, value in enumerate(values):
                labels.update(dict.fromkeys(labels_of(value, row=int(rows[i]), field=field)))
        except RecordError as exc:
            facts.append(("slice_error", field, exc.row, None, exc.column, exc.reason, None))
            continue
        facts.append(("slice", field, int(rows[0]), None, None, json.dumps(list(labels), ensure_ascii=False),
                      any(field in r.metadata for r in records)))
    return facts


def _global(rows: np.ndarray, local: int | None) -> int | None:
    return None if local is None else int(rows[local])


# -- scoring ----------------------------------------------------------------------------------
_METRIC_FIELDS = (
    ("score", DoubleType()),
    ("justification", StringType()),
    ("error", StringType()),
    ("skip_reason", StringType()),
    ("support", DoubleType()),
    ("traceback", StringType()),
    ("details", StringType()),
)


def metric_columns(key: str) -> dict[str, str]:
    """A metric's output columns by field: ``<key>/score``, ``/justification``, ``/error``,
    ``/skip_reason``, ``/support``, ``/traceback``, ``/details`` (its evidence, as JSON)."""
    return {name: f"{key}/{name}" for name, _ in _METRIC_FIELDS}


def output_schema(plan: Plan) -> StructType:
    """``row`` (the global row index), ``question``, ``answer``, ``reference``,
    ``dataset_item`` (the row's share of the dataset digest: its question and expectations as
    JSON, the same for every version of a pipeline), then :func:`metric_columns` per metric."""
    fields = [StructField("row", LongType(), False)] + [
        StructField(name, StringType()) for name in ("question", "answer", "reference", "dataset_item")
    ]
    for metric in plan.metrics:
        for name, kind in _METRIC_FIELDS:
            fields.append(StructField(f"{metric.key}/{name}", kind))
    for field in plan.slice_by:
        fields.append(StructField(slice_column(field), ArrayType(StringType())))
    return StructType(fields)


def slice_column(field: str) -> str:
    """The output column of a slice field's labels per row (an empty list: no value)."""
    return f"slice/{field}"


class SumParam(AccumulatorParam):
    """Adds nested dicts of numbers (judge usage, timings); other values keep the first seen."""

    def zero(self, value: dict) -> dict:
        return {}

    def addInPlace(self, total: dict, more: dict) -> dict:
        for key, value in more.items():
            if isinstance(value, Mapping):
                total[key] = self.addInPlace(dict(total.get(key) or {}), value)
            elif isinstance(value, numbers.Number) and not isinstance(value, bool):
                total[key] = total.get(key, 0) + value
            else:
                total.setdefault(key, value)
        return total


def _delta(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """What a cumulative usage dict gained between two reads (a worker's judge serves many tasks)."""
    out: dict[str, Any] = {}
    for key, value in after.items():
        if isinstance(value, Mapping):
            out[key] = _delta(before.get(key) or {}, value)
        elif isinstance(value, numbers.Number) and not isinstance(value, bool):
            out[key] = value - (before.get(key) or 0)
        else:
            out[key] = value
    return out


def score_batches(plan: Plan, usage: Accumulator, timings: Accumulator,
                  batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Score each of the engine's blocks of rows; yield one output row per input row
    (:func:`output_schema`). Rows arrive in index order, so a block's rows are contiguous."""
    schema = to_arrow_schema(output_schema(plan))
    judge = judge_for(plan.judge, plan.evaluation, plan.judge_options) if plan.judge else None
    suite = Suite(list(plan.metrics), judge, default=False)
    for block in _blocks(_pandas(batches)):
        records = _records(plan, block)
        before = judge.usage() if judge is not None else {}
        rows, seconds = score_records(suite, records)
        if judge is not None:
            usage.add(_delta(before, judge.usage()))
        timings.add(seconds)
        yield _arrow(_output_frame(plan, block[ROW].to_numpy(), records, rows), schema)


def _blocks(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    """Spark's batches regrouped into the engine's blocks (``row // BATCH_SIZE``), one at a time."""
    pending: list[pd.DataFrame] = []
    current = None
    for batch in batches:
        block = batch[ROW].to_numpy() // BATCH_SIZE
        for start, end in equal_runs(block):
            if pending and block[start] != current:
                yield pd.concat(pending, ignore_index=True)
                pending = []
            current = block[start]
            pending.append(batch.iloc[start:end])
    if pending:
        yield pd.concat(pending, ignore_index=True)


def equal_runs(values: np.ndarray) -> list[tuple[int, int]]:
    """``(start, end)`` of each run of equal values."""
    if len(values) == 0:
        return []
    cuts = np.flatnonzero(values[1:] != values[:-1]) + 1
    edges = [0, *cuts.tolist(), len(values)]
    return list(zip(edges[:-1], edges[1:]))


def _output_frame(plan: Plan, index: np.ndarray, records: list[RagRecord],
                  rows: dict[str, list[RowResult]]) -> pd.DataFrame:
    data: dict[str, Any] = {
        "row": index.astype("int64"),
        "question": [r.question for r in records],
        "answer": [r.answer for r in records],
        "reference": [r.reference for r in records],
        "dataset_item": [dataset_item(r) for r in records],
    }
    for metric in plan.metrics:
        columns = metric_columns(metric.key)
        results = rows[metric.display_name]
        # nullable floats: a row that was not scored is null, never NaN
        data[columns["score"]] = pd.array([r.value if r.status == "scored" else None for r in results],
                                          dtype="Float64")
        data[columns["justification"]] = [r.justification for r in results]
        data[columns["error"]] = [r.error for r in results]
        data[columns["skip_reason"]] = [r.justification.removeprefix(_NOT_APPLICABLE) if r.status == "skipped"
                                        else None for r in results]
        data[columns["support"]] = pd.array([_support(r) for r in results], dtype="Float64")
        data[columns["traceback"]] = [r.traceback for r in results]
        data[columns["details"]] = [json.dumps(json_safe(r.details), ensure_ascii=False) if r.details else None
                                    for r in results]
    for field in plan.slice_by:
        data[slice_column(field)] = [labels_of(r.metadata.get(field), row=int(i), field=field)
                                     for i, r in zip(index, records)]
    return pd.DataFrame(data)


def _support(row: RowResult) -> float | None:
    support = row.details.get("support")
    return float(support) if isinstance(support, numbers.Real) and np.isfinite(support) else None


def row_result(score: float | None, justification: str | None, error: str | None, traceback: str | None,
               details: str | None) -> RowResult:
    """A row's :class:`RowResult` back from its output columns (evidence as JSON types)."""
    return RowResult(value=score if error is None else None, error=error, justification=justification or "",
                     details=json.loads(details) if details else {}, traceback=traceback)


# -- records for the driver (runs small enough for a per-row table) ---------------------------
RECORD_BLOBS_SCHEMA = StructType([StructField("row", LongType(), False), StructField("record", BinaryType())])


def record_blobs(plan: Plan, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Each row's record, pickled: the driver rebuilds the records of a small run from them, read
    by the same code from the same batches as when they were scored."""
    import pickle

    schema = to_arrow_schema(RECORD_BLOBS_SCHEMA)
    for batch in _pandas(batches):
        records = _records(plan, batch)
        yield _arrow(pd.DataFrame({"row": batch[ROW].to_numpy().astype("int64"),
                                   "record": [pickle.dumps(r, protocol=pickle.HIGHEST_PROTOCOL) for r in records]}),
                     schema)


def item_chunks(batches: Iterator[pa.RecordBatch], size: int = 8 << 20) -> Iterator[pa.RecordBatch]:
    """A partition of sorted ``dataset_item`` texts as a few strings of about ``size`` bytes,
    items joined by newlines: the driver hashes a chunk in one call (the digest's bytes are each
    item followed by a newline; an item, JSON, holds none) instead of one Python row per item."""
    schema = pa.schema([pa.field("chunk", pa.string())])
    pending: list[str] = []
    length = 0
    for batch in batches:
        for item in batch.column(0).to_pylist():
            pending.append(item)
            length += len(item) + 1
            if length >= size:
                yield pa.RecordBatch.from_pydict({"chunk": ["\n".join(pending)]}, schema=schema)
                pending, length = [], 0
    if pending:
        yield pa.RecordBatch.from_pydict({"chunk": ["\n".join(pending)]}, schema=schema)
