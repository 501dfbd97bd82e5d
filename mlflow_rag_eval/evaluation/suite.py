"""Which metrics an evaluation runs, decided before any record is judged.

Named metrics must all run: an unknown name, a metric the data cannot feed (a column it needs
is absent) or one the judge cannot perform stops the evaluation, naming the problem. The
default suite (no metric named) is everything the data can feed: every built-in metric whose
columns the data has, that the judge can perform, that applies to at least one row (a
citation metric when no answer cites anything, abstention when no row is marked unanswerable,
are left out) and whose own check the data passes (a retrieval metric when the contexts carry
no ids). What was left out, and why, is kept on the result and in the run's lineage.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from mlflow_rag_eval.judges import Judge, get_judge
from mlflow_rag_eval.metrics import Metric, resolve_metric
from mlflow_rag_eval.records import ColumnMapping, RagRecord, RecordError

__all__ = ["ALL_FIELDS", "DEFAULT_METRICS", "Suite", "fields_present", "prepare_suite"]

#: The default suite's candidates: every built-in metric (a rubric needs its own criteria),
#: retrieval at the usual cut-offs. Each runs when the data can feed it.
DEFAULT_METRICS = (
    "faithfulness",
    "answer_relevancy",
    "context_relevance",
    "context_precision",
    "context_recall",
    "answer_correctness",
    "abstention",
    "false_abstention",
    "citation_validity",
    "citation_support",
    "hit@5",
    "precision@5",
    "recall@5",
    "mrr",
    "map",
    "ndcg@10",
)

#: Every record field a metric may need: for routes that see the data row by row (genai
#: scorers, extra_metrics), where a metric is checked for the judge, not for columns.
ALL_FIELDS = frozenset({"answer", "contexts", "reference", "relevant_ids", "reference_contexts", "answerable"})

_FIELD_COLUMNS = {
    "answer": "answer",
    "contexts": "contexts",
    "reference": "reference",
    "relevant_ids": "relevant_ids",
    "reference_contexts": "reference_contexts",
    "answerable": "answerable",
}


@dataclass
class Suite:
    """The metrics to run, the judge they need, and (default suite) what was left out."""

    metrics: list[Metric]
    judge: Judge | None
    default: bool
    #: metric name -> why the default suite left it out
    left_out: dict[str, str] = field(default_factory=dict)

    def drop_inapplicable(self, records: Sequence[RagRecord]) -> None:
        """Default suite only: leave out metrics that apply to none of ``records``."""
        if not self.default or not records:
            return
        kept = []
        for metric in self.metrics:
            reasons = [metric.not_applicable(r) for r in records]
            if all(reason is not None for reason in reasons):
                self.left_out[metric.display_name] = f"applies to no row ({reasons[0]})"
            else:
                kept.append(metric)
        self.metrics = kept

    def validate(self, records: Sequence[RagRecord], mapping: ColumnMapping | None = None) -> None:
        """Each metric's own check of ``records`` (ids for retrieval metrics, ...), before any
        judge call. A named metric the data cannot feed stops the evaluation
        (:class:`RecordError`); the default suite, which promises what the data can feed,
        leaves it out, the reason kept in :attr:`left_out`."""
        mapping = mapping or ColumnMapping()
        kept = []
        for metric in self.metrics:
            try:
                metric.validate(records, mapping)
            except RecordError as exc:
                if not self.default:
                    raise
                self.left_out[metric.display_name] = f"the data cannot feed it ({exc})"
            else:
                kept.append(metric)
        self.metrics = kept


def prepare_suite(
    metrics: Iterable[str | Metric] | None,
    judge: str | Judge | None,
    available_fields: set[str],
    mapping: ColumnMapping | None = None,
) -> Suite:
    """The suite and its judge, checked before any record is seen (and, in the evaluator,
    before the pipeline runs: a wrong configuration costs no prediction)."""
    mapping = mapping or ColumnMapping()
    if isinstance(metrics, (str, Metric)):
        shown = metrics if isinstance(metrics, str) else metrics.display_name
        raise ValueError(f"metrics must be a list of metric names, got the single metric {shown!r}: "
                         f"write [{shown!r}]")
    default = metrics is None
    chosen: list[Metric] = []
    left_out: dict[str, str] = {}
    for metric in (resolve_metric(m) for m in (DEFAULT_METRICS if default else list(metrics))):
        missing = [f for f in metric.requires if f not in available_fields]
        if not missing:
            chosen.append(metric)
        elif default:
            left_out[metric.display_name] = f"the data has no {_FIELD_COLUMNS[missing[0]]!r} column"
        else:
            raise RecordError(f"metric {metric.display_name!r} needs this column, which the data lacks",
                              row=None, column=getattr(mapping, _FIELD_COLUMNS[missing[0]]))
    names = [m.display_name for m in chosen]
    duplicates = {n for n in names if names.count(n) > 1}
    if duplicates:
        raise ValueError(f"metric(s) named twice: {sorted(duplicates)}")
    judge_obj = get_judge(judge) if any(m.primitives for m in chosen) else None
    if judge_obj is not None:
        for metric in list(chosen):
            cannot = [p for p in metric.primitives if not judge_obj.supports(p)]
            if cannot and default:
                chosen.remove(metric)
                left_out[metric.display_name] = f"judge {judge_obj.info().name!r} cannot {', '.join(cannot)}"
            elif metric.primitives:
                judge_obj.require(*metric.primitives, metric=metric.display_name)
    return Suite(chosen, judge_obj, default, left_out)


def fields_present(records: Sequence[RagRecord]) -> set[str]:
    """The record fields ``records`` carry, when no column list says which the data has."""
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
