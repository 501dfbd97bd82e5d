"""Runs a metric suite over records: selection, up-front checks, batches, per-row isolation.

Order of work, so that bad input never costs a judge call:
1. resolve the metric names and drop (default suite) or refuse (named metrics) those the data
   cannot feed;
2. check the judge can perform every primitive the suite needs;
3. let each metric validate the records (errors name row and column);
4. score in batches; an exception inside a metric fails that batch's rows of that metric with a
   named error and the run goes on.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from mlflow_rag_eval.judges import Judge, JudgeInfo, JudgeUnreachable, get_judge
from mlflow_rag_eval.metrics import Metric, resolve_metric
from mlflow_rag_eval.records import ColumnMapping, RagRecord, RecordError, dataset_digest
from mlflow_rag_eval.results import MetricResult, RowResult

__all__ = [
    "DEFAULT_METRICS", "EvaluationResult", "evaluate_records", "no_judge", "prepare_suite", "select_metrics",
]

_logger = logging.getLogger(__name__)

#: The suite run when no metric is named; metrics the data cannot feed are left out.
DEFAULT_METRICS = (
    "faithfulness",
    "answer_relevancy",
    "context_relevance",
    "context_recall",
    "hit@5",
    "precision@5",
    "recall@5",
    "mrr",
    "map",
    "ndcg@10",
)

BATCH_SIZE = 1024


@dataclass
class EvaluationResult:
    """Everything an evaluation produced, before any MLflow logging."""

    records: list[RagRecord]
    metrics: list[MetricResult]
    judge: JudgeInfo
    dataset_digest: str
    timings: dict[str, float] = field(default_factory=dict)
    judge_usage: dict[str, Any] = field(default_factory=dict)
    #: the record fields the data provided (``reference``, ``relevant_ids``, ...)
    fields: frozenset[str] = frozenset({"answer", "contexts"})

    def aggregates(self) -> dict[str, float]:
        """Flat MLflow metrics: ``<key>/mean``, ``/median``, ``/p10``, ``/n_scored``, ..."""
        out: dict[str, float] = {}
        for m in self.metrics:
            out.update(m.summary.as_metrics(m.key))
        return out

    def table(self, trace_ids: Sequence[str] | None = None) -> pd.DataFrame:
        """One row per record: inputs, outputs, ``<key>/score``, ``/justification``, ``/error``,
        and the row's ``trace_id`` when its trace was logged."""
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
        data["trace_id"] = list(trace_ids) if trace_ids is not None else [None] * len(self.records)
        return pd.DataFrame(data)


_FIELD_COLUMNS = {
    "answer": "answer",
    "contexts": "contexts",
    "reference": "reference",
    "relevant_ids": "relevant_ids",
    "reference_contexts": "reference_contexts",
    "answerable": "answerable",
}


def select_metrics(
    requested: Iterable[str | Metric] | None,
    available_fields: set[str],
    mapping: ColumnMapping | None = None,
) -> list[Metric]:
    """Resolve the suite. Named metrics must be fed; the default suite takes what it can."""
    mapping = mapping or ColumnMapping()
    explicit = requested is not None
    metrics = [resolve_metric(m) for m in (requested if explicit else DEFAULT_METRICS)]
    chosen = []
    for metric in metrics:
        missing = [f for f in metric.requires if f not in available_fields]
        if not missing:
            chosen.append(metric)
        elif explicit:
            column = getattr(mapping, _FIELD_COLUMNS[missing[0]])
            raise RecordError(
                f"metric {metric.display_name!r} needs this column, which the data lacks",
                row=None,
                column=column,
            )
        else:
            _logger.info("leaving out %s: the data has no %s", metric.display_name, missing)
    names = [m.display_name for m in chosen]
    duplicates = {n for n in names if names.count(n) > 1}
    if duplicates:
        raise ValueError(f"metric(s) named twice: {sorted(duplicates)}")
    return chosen


def prepare_suite(
    metrics: Iterable[str | Metric] | None,
    judge: str | Judge | None,
    available_fields: set[str],
    mapping: ColumnMapping | None = None,
) -> tuple[list[Metric], Judge | None]:
    """The metric suite and the judge it needs, checked before any record is seen: every named
    metric known and fed by the data, the judge able to perform every primitive it asks for.
    Callers that run a pipeline first (the rag evaluator) call it before the pipeline, so a
    wrong configuration costs no prediction."""
    suite = select_metrics(metrics, available_fields, mapping)
    judge_obj = get_judge(judge) if any(m.primitives for m in suite) else None
    for metric in suite:
        if metric.primitives and judge_obj is not None:
            judge_obj.require(*metric.primitives, metric=metric.display_name)
    return suite, judge_obj


def evaluate_records(
    records: Sequence[RagRecord],
    metrics: Iterable[str | Metric] | None = None,
    judge: str | Judge | None = None,
    *,
    available_fields: set[str] | None = None,
    mapping: ColumnMapping | None = None,
    progress: bool | None = None,
) -> EvaluationResult:
    """Score ``records`` with a metric suite and a judge (default: the local MiniLM judge).

    Args:
        available_fields: record fields the data provides (e.g. ``{"answer", "contexts",
            "reference"}``); defaults to what the records themselves carry.
        progress: show a progress line on stderr (default: when stderr is a terminal).
    """
    records = list(records)
    mapping = mapping or ColumnMapping()
    if available_fields is None:
        available_fields = _fields_present(records)
    suite, judge_obj = prepare_suite(metrics, judge, available_fields, mapping)
    for metric in suite:
        metric.validate(records, mapping)
    info = judge_obj.info() if judge_obj is not None else _NO_JUDGE
    progress = sys.stderr.isatty() if progress is None else progress

    rows: dict[str, list[RowResult]] = {m.display_name: [] for m in suite}
    timings: dict[str, float] = {m.display_name: 0.0 for m in suite}
    lock = threading.Lock()
    done_rows = 0

    def run(metric: Metric, batch: list[RagRecord]) -> list[RowResult]:
        start = time.perf_counter()
        try:
            out = metric.compute(batch, judge_obj)
            if len(out) != len(batch):
                raise RuntimeError(f"returned {len(out)} rows for {len(batch)}")
        except JudgeUnreachable:  # no row can be judged: stop, before anything is logged
            raise
        except Exception as exc:  # one metric's bug must not kill the run
            _logger.warning("metric %s failed on a batch: %r", metric.display_name, exc)
            out = [RowResult.failed(f"MetricError: {type(exc).__name__}: {exc}")] * len(batch)
        with lock:
            timings[metric.display_name] += time.perf_counter() - start
            if progress:
                errors = sum(r.status == "error" for r in out) + sum(
                    r.status == "error" for rs in rows.values() for r in rs
                )
                hits = judge_obj.usage().get("cache_hits", 0) if judge_obj is not None else 0
                print(
                    f"\rrag eval: {metric.display_name} done on rows up to "
                    f"{done_rows + len(batch)}/{len(records)}, {errors} errors, {hits} cache hits",
                    end="", file=sys.stderr,
                )
        return out

    # An LLM judge waits on the network: its metrics run side by side, sharing the judge's
    # bounded pool, so one metric's local work (e.g. embeddings) overlaps the others' calls.
    # The local judge is CPU-bound: its metrics run one after another.
    parallel = bool(getattr(judge_obj, "parallel_metrics", False)) and len(suite) > 1
    batches = [records[i : i + BATCH_SIZE] for i in range(0, len(records), BATCH_SIZE)]
    with ThreadPoolExecutor(max_workers=len(suite) if parallel else 1) as pool:
        for batch in batches:
            outs = list(pool.map(lambda m: run(m, batch), suite))
            for metric, out in zip(suite, outs):
                rows[metric.display_name].extend(out)
            done_rows += len(batch)
    if progress:
        print(file=sys.stderr)
    results = [
        MetricResult(
            name=m.display_name,
            spec=m.spec(),
            rows=tuple(rows[m.display_name]),
            greater_is_better=m.greater_is_better,
            judged=bool(m.primitives),
        )
        for m in suite
    ]
    return EvaluationResult(
        records=records,
        metrics=results,
        judge=info,
        dataset_digest=dataset_digest(records),
        timings=timings,
        judge_usage=judge_obj.usage() if judge_obj is not None else {},
        fields=frozenset(available_fields),
    )


_NO_JUDGE = JudgeInfo(name="none", kind="none", model="", fingerprint="none", prompts_version="none")


def no_judge() -> JudgeInfo:
    """The judge identity of a suite that needs no judge (retrieval metrics only)."""
    return _NO_JUDGE


def _fields_present(records: Sequence[RagRecord]) -> set[str]:
    present = {"answer", "contexts"}
    if any(r.reference for r in records):
        present.add("reference")
    if any(r.relevant_ids is not None for r in records):
        present.add("relevant_ids")
    if any(r.reference_contexts is not None for r in records):
        present.add("reference_contexts")
    if any(not r.answerable for r in records):
        present.add("answerable")
    return present
