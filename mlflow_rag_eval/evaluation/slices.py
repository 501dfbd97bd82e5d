"""Per-slice results: the statistics of the whole run, on the rows of one slice.

Teams read a run per tag, per difficulty, per question type: an overall mean of 0.8 can hide a
slice at 0.4. A *slice* is the rows whose value of a field is one value (field ``difficulty``,
value ``hard``); ``slice_by`` names the fields.

A field names a key of the row's ``metadata`` or a column of the evaluated data. Records keep
only the fields they know, so the routes that have the data frame (the ``rag`` evaluator) copy
the named columns into each record's metadata (:func:`attach_columns`): from there on, slicing
reads ``RagRecord.metadata`` only. A field that is both a column and a metadata key is refused
rather than one of them chosen. Slices describe the golden rows, so that two runs slice alike:
the fields are checked against the data before the pipeline runs, and a column the pipeline
outputs cannot be sliced on.

Which rows are in which slice:

- a value is a slice label as :func:`slice_label` writes it: a string as it is, a number or a
  bool as ``str`` writes it, except that an integral float is written as an int (``3.0`` ->
  ``3``), since pandas turns an int column with a gap into floats;
- a list (or tuple, set, array) puts the row in the slice of each of its distinct elements:
  a row tagged ``[billing, refunds]`` counts in both, so the slices of a list field overlap
  and their row counts may add up to more than the run's;
- a missing value (no such key, None, NaN, an empty string, an empty list) puts the row in no
  slice of that field; ``n_missing`` counts those rows. A dict is refused (no label);
- a field no row has is refused (a typo would otherwise give no slice, silently), and so is a
  field with more than :data:`MAX_SLICES_PER_FIELD` values (an id is not a slice: each value
  would log eight metrics per metric).

The statistics of a slice are :func:`mlflow_rag_eval.results.summarize` of the slice's rows:
the same function as the run's summary, so a slice's figures are those of an evaluation of its
rows alone (mean, median, p10, worst10_mean, the bootstrap CI, n_scored, n_error, n_skipped),
the worst rows of each metric by its own direction. As everywhere,
a statistic that cannot be computed (no scored row, a CI of one row) is left out, never NaN.

What the run holds (:mod:`~mlflow_rag_eval.tracking.run_logging`), only when
``slice_by`` was given: param ``rag_eval.slice_by`` (the fields, as JSON), metrics
``<key>/slice/<field>/<value>/<stat>`` (:mod:`mlflow_rag_eval.keys` makes the field and value
segments safe for MLflow), and ``rag_eval/slices.json`` (:meth:`SliceTable.as_dict`), which
maps each value to its key segment and is what compare and the gate read.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from mlflow_rag_eval.keys import AGGREGATES, SLICE, slice_prefix, slice_segments
from mlflow_rag_eval.records import RagRecord, RecordError, is_missing
from mlflow_rag_eval.results import (
    FAILED,
    SCORED,
    SKIPPED,
    MetricResult,
    MetricSummary,
    status_columns,
    summarize_values,
)

__all__ = [
    "FieldSlices", "MAX_SLICES_PER_FIELD", "SLICES_FILE", "SLICE_BY_PARAM", "Slice", "SliceTable",
    "attach_columns", "check_frame", "check_slice_by", "check_value_count", "compute_slices", "labels_of",
    "load_slices", "slice_label", "slice_members", "slice_table",
]

#: the run artifact holding the per-slice table
SLICES_FILE = "rag_eval/slices.json"
#: the run param naming the fields a run was sliced by (a JSON list)
SLICE_BY_PARAM = "rag_eval.slice_by"
#: the most values one field may have
MAX_SLICES_PER_FIELD = 100
_SCHEMA_VERSION = 1


# -- which rows are in which slice -------------------------------------------------------------
def check_slice_by(value: Any, where: str = "slice_by") -> tuple[str, ...]:
    """``slice_by`` as a tuple of field names (empty for None).

    Raises:
        ValueError: not a list of distinct non-empty strings; ``where`` names the setting.
    """
    if value is None:
        return ()
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise ValueError(f"{where} must be a list of field names, got {type(value).__name__} ({value!r})")
    for name in value:
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"{where} must be a list of field names (non-empty strings), got {name!r}")
    duplicated = sorted({n for n in value if list(value).count(n) > 1})
    if duplicated:
        raise ValueError(f"{where} names {duplicated[0]!r} twice")
    return tuple(value)


def slice_label(value: Any) -> str:
    """The label of one (non-missing, non-list) value: see the module docstring."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def labels_of(value: Any, *, row: int, field: str) -> list[str]:
    """The slices of ``field`` a row with ``value`` is in (none when missing).

    Raises:
        RecordError: a value that is no slice label (a dict), naming the row.
    """
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value, key=str) if isinstance(value, (set, frozenset)) else list(value)
    else:
        items = [value]
    labels = []
    for item in items:
        if is_missing(item) or (isinstance(item, str) and not item.strip()):
            continue
        if isinstance(item, np.generic):
            item = item.item()
        # A JSON scalar only: any other object's str() (a dict, an instance's repr with its
        # address) is no label, or one that changes from run to run.
        if not isinstance(item, (str, bool, int, float)):
            raise RecordError(f"slice_by field {field!r}: a {type(item).__name__} is not a slice value "
                              "(use a string, a number, a bool, or a list of them)", row=row, column=field)
        labels.append(slice_label(item))
    return list(dict.fromkeys(labels))


def check_frame(frame, slice_by: Sequence[str], metadata_column: str) -> None:
    """Each field is a column of ``frame`` or a key of some row's metadata, not both: checked
    on the golden data before the pipeline runs.

    Raises:
        ValueError: naming the field, the columns and the metadata keys.
    """
    cells = frame[metadata_column] if metadata_column in frame.columns else []
    keys = {str(k) for cell in cells if isinstance(cell, Mapping) for k in cell}
    columns = [str(c) for c in frame.columns]
    for field in slice_by:
        if field in columns and field in keys:
            raise ValueError(f"slice_by field {field!r} is both a column and a metadata key; rename one")
        if field not in columns and field not in keys:
            raise ValueError(f"slice_by field {field!r} is neither a column (columns: {columns}) nor a metadata "
                             f"key (keys: {sorted(keys)})")


def attach_columns(records: Sequence[RagRecord], frame, slice_by: Sequence[str]) -> list[RagRecord]:
    """Records with the columns of ``frame`` named in ``slice_by`` copied into their metadata
    (row i of the frame is record i), so that slicing reads metadata only.

    Raises:
        ValueError: a field is both a column and a key of a record's metadata.
    """
    columns = [f for f in slice_by if f in frame.columns]
    if not columns:
        return list(records)
    if len(frame) != len(records):
        raise ValueError(f"{len(frame)} rows of data for {len(records)} records")
    for field in columns:
        if any(field in r.metadata for r in records):
            raise ValueError(f"slice_by field {field!r} is both a column and a metadata key; rename one")
    values = {field: frame[field].tolist() for field in columns}
    return [replace(r, metadata={**r.metadata, **{f: values[f][i] for f in columns}}) for i, r in enumerate(records)]


def slice_members(records: Sequence[RagRecord], slice_by: Sequence[str]) -> dict[str, tuple[dict[str, list[int]], int]]:
    """Per field: (value -> the rows in its slice, in order; the rows with no value).
    Values are sorted as text.

    Raises:
        ValueError: a field no record has, or more than :data:`MAX_SLICES_PER_FIELD` values.
        RecordError: a value that is no slice label (a dict), naming the row.
    """
    out: dict[str, tuple[dict[str, list[int]], int]] = {}
    for field in slice_by:
        if not any(field in r.metadata for r in records):
            known = sorted({str(k) for r in records for k in r.metadata})
            raise ValueError(f"slice_by field {field!r} is in no row's metadata (metadata keys: {known})")
        members: dict[str, list[int]] = {}
        missing = 0
        for row, record in enumerate(records):
            labels = labels_of(record.metadata.get(field), row=row, field=field)
            missing += not labels
            for label in labels:
                members.setdefault(label, []).append(row)
        check_value_count(field, len(members))
        out[field] = ({v: members[v] for v in sorted(members)}, missing)
    return out


def check_value_count(field: str, n_values: int) -> None:
    """Raises ValueError when ``field`` has more than :data:`MAX_SLICES_PER_FIELD` values."""
    if n_values > MAX_SLICES_PER_FIELD:
        raise ValueError(f"slice_by field {field!r} has {n_values} values, more than "
                         f"{MAX_SLICES_PER_FIELD}: slice by a field that groups rows (a tag, a difficulty)")


# -- the statistics of each slice --------------------------------------------------------------
@dataclass(frozen=True)
class Slice:
    """The rows of one value of one field, and each metric's summary on them."""

    field: str
    value: str
    #: the value's segment of the slice keys
    key: str
    rows: tuple[int, ...]
    #: metric key -> :func:`~mlflow_rag_eval.results.summarize` of the slice's rows
    summaries: Mapping[str, MetricSummary]


@dataclass(frozen=True)
class FieldSlices:
    """The slices of one field."""

    field: str
    #: the field's segment of the slice keys
    key: str
    slices: tuple[Slice, ...]
    #: rows in no slice of the field (no value)
    n_missing: int


@dataclass(frozen=True)
class SliceTable:
    """Every slice of every field of a run; :func:`compute_slices` makes it."""

    slice_by: tuple[str, ...]
    fields: tuple[FieldSlices, ...]
    n_rows: int
    #: metric key -> (display name, greater_is_better), in the run's order
    metrics: Mapping[str, tuple[str, bool]]

    def as_metrics(self) -> dict[str, float]:
        """``<key>/slice/<field>/<value>/<stat>`` MLflow metrics (statistics of no scored row
        left out, never NaN), as :meth:`MetricSummary.as_metrics` writes a run's."""
        out: dict[str, float] = {}
        for f in self.fields:
            for s in f.slices:
                for metric, summary in s.summaries.items():
                    out.update(summary.as_metrics(slice_prefix(metric, f.key, s.key)))
        return out

    def as_dict(self) -> dict[str, Any]:
        """What ``rag_eval/slices.json`` holds::

            {"schema_version": 1, "slice_by": [...], "n_rows": 40,
             "key_format": "<metric>/slice/<field>/<value>/<stat>",
             "metrics": {<metric key>: {"name", "greater_is_better"}},
             "fields": {<field>: {"key", "n_missing", "slices": {<value>: {"key", "n_rows",
                 "metrics": {<metric key>: {"mean", "median", "p10", "worst10_mean", "ci_low",
                                            "ci_high", "n_scored", "n_error", "n_skipped"}}}}}}}

        Statistics that cannot be computed are left out of a slice's metric, never null.
        """
        return {
            "schema_version": _SCHEMA_VERSION,
            "slice_by": list(self.slice_by),
            "n_rows": self.n_rows,
            "key_format": f"<metric>/{SLICE}/<field>/<value>/<stat>",
            "metrics": {k: {"name": name, "greater_is_better": gib} for k, (name, gib) in self.metrics.items()},
            "fields": {
                f.field: {
                    "key": f.key,
                    "n_missing": f.n_missing,
                    "slices": {
                        s.value: {"key": s.key, "n_rows": len(s.rows),
                                  "metrics": {k: _stats(summary) for k, summary in s.summaries.items()}}
                        for s in f.slices
                    },
                }
                for f in self.fields
            },
        }

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), ensure_ascii=False)


def _stats(summary: MetricSummary) -> dict[str, float | int]:
    out: dict[str, float | int] = {
        stat: getattr(summary, stat) for stat in AGGREGATES if getattr(summary, stat) is not None
    }
    out.update(n_scored=summary.n_scored, n_error=summary.n_error, n_skipped=summary.n_skipped)
    return out


def compute_slices(result_or_records, slice_by: Sequence[str],
                   metrics: Iterable[MetricResult] | None = None) -> SliceTable:
    """The slices of ``slice_by`` with each metric's summary on them.

    Args:
        result_or_records: an :class:`~mlflow_rag_eval.evaluation.engine.EvaluationResult`, or the records
            (then ``metrics`` are the metric results, each with one row per record).
        slice_by: field names (metadata keys; columns must have been attached already, see
            :func:`attach_columns`).

    Raises:
        ValueError, RecordError: as :func:`slice_members`.
    """
    if metrics is None:
        records, metrics = result_or_records.records, result_or_records.metrics
    else:
        records = result_or_records
    records, metrics = list(records), list(metrics)
    slice_by = check_slice_by(list(slice_by))
    for m in metrics:
        if len(m.rows) != len(records):
            raise ValueError(f"metric {m.name} has {len(m.rows)} rows for {len(records)} records")
    # One walk of each metric's rows, not one per slice: past the first few thousand they are
    # read back from a temporary file (SpooledSequence), and a field can have hundreds of values.
    columns = {m.key: status_columns(m.rows) for m in metrics}
    direction = {m.key: m.greater_is_better for m in metrics}

    def summarize_rows(key: str, rows: Sequence[int]) -> MetricSummary:
        values, status = columns[key]
        at = np.asarray(rows, dtype=np.intp)
        picked = status[at]
        return summarize_values(values[at][picked == SCORED], int((picked == FAILED).sum()),
                                int((picked == SKIPPED).sum()), greater_is_better=direction[key])

    return slice_table(slice_by, slice_members(records, slice_by), len(records),
                       {m.key: (m.name, m.greater_is_better) for m in metrics}, summarize_rows)


def slice_table(slice_by: Sequence[str], members: Mapping[str, tuple[Mapping[str, Sequence[int]], int]], n_rows: int,
                metrics: Mapping[str, tuple[str, bool]],
                summarize_rows: Callable[[str, Sequence[int]], MetricSummary]) -> SliceTable:
    """The :class:`SliceTable` of ``members`` (as :func:`slice_members` gives them) whose
    slices' summaries ``summarize_rows(metric key, rows)`` computes: a route that does not hold
    the rows (Spark) summarizes from score columns, with the same function as the run's.

    Raises:
        ValueError: a key too long for MLflow, before anything is logged.
    """
    field_keys = slice_segments(slice_by)
    fields = []
    for field in slice_by:
        by_value, missing = members[field]
        value_keys = slice_segments(by_value)
        slices = tuple(
            Slice(field, value, value_keys[value], tuple(rows), {key: summarize_rows(key, rows) for key in metrics})
            for value, rows in by_value.items()
        )
        fields.append(FieldSlices(field, field_keys[field], slices, missing))
    table = SliceTable(tuple(slice_by), tuple(fields), n_rows, dict(metrics))
    table.as_metrics()  # every key fits MLflow's limit, or ValueError now, before anything is logged
    return table


def load_slices(run_id: str, client=None) -> dict[str, Any] | None:
    """The ``rag_eval/slices.json`` of a run (None when the run was not sliced: no
    ``rag_eval.slice_by`` param)."""

    import mlflow

    client = client or mlflow.MlflowClient()
    if SLICE_BY_PARAM not in client.get_run(run_id).data.params:
        return None
    from mlflow_rag_eval._util.mlflow_compat import read_run_artifact  # imports MLflow
    return json.loads(read_run_artifact(client, run_id, SLICES_FILE).decode("utf-8"))
