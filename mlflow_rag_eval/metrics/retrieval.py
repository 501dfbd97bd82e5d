"""Retrieval metrics over ids (hit, precision, recall, MRR, MAP, nDCG) as registered metrics.

Thin units over the vectorised kernels in :mod:`mlflow_rag_eval.metrics.ranking`, whose
docstring holds the semantics (trec_eval's, for the given rank order). Rows whose
``relevant_ids`` are missing, empty or all graded 0 are not applicable; they are counted in
``n_skipped``, never as a score of 0 and never as an error. A NaN from a kernel on any other
row is an error (``NonFiniteScore``): a kernel bug must not hide as skipped rows. No judge is
involved.

**Two grains.** Retrieved contexts are often chunks of larger documents, and a question is
answered once the right *document* is found, whichever chunk of it. Each metric therefore has
a parent-grain twin named with a ``parent_`` prefix (``parent_hit@5``, ``parent_mrr``,
``parent_ndcg@10``...): a prefix, not a suffix such as ``hit@5/parent``, because ``/``
separates a metric key from its statistic in MLflow (``<key>/mean``) and ``@k`` must end the
name for the name parser and the key round trip (``parent_ndcg_at_10`` -> ``parent_ndcg@10``).

At the parent grain:

* a context's parent is its ``parent_id``, else everything before the last ``/`` of its id
  (``docs/a.md/3`` -> ``docs/a.md``), else the id itself (:attr:`Context.parent`);
* the ranking is the contexts' parents, each kept at its *first* occurrence only (a parent's
  rank is the rank of its best chunk), so later chunks of it take no slot;
* a relevant id names a child or a parent: it maps to the parent of the retrieved context with
  that id in the row (which honours ``parent_id``), else to itself when it is the parent of a
  retrieved context in the row, else by the ``/`` rule; a parent's grade is the highest grade
  of the relevant ids mapped to it.

This is what trec_eval computes on the run and qrels collapsed the same way (tested so). An
unretrieved relevant id is mapped by the ``/`` rule alone, as nothing else is known of it: give
parent-level relevant ids without ``/`` (or retrieve them) when document ids contain one.

:class:`Pollution` (``pollution@k``) measures how much of the top k the collapse removes: the
share of retrieved slots taken by a chunk of a parent seen higher up. It needs no relevant ids.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from mlflow_rag_eval.metrics import ranking as kernels
from mlflow_rag_eval.metrics.base import Metric, memoized, register_metric
from mlflow_rag_eval.records import ColumnMapping, RagRecord, RecordError, parent_of
from mlflow_rag_eval.results import RowResult

__all__ = [
    "HitRate", "Precision", "Recall", "MRR", "MAP", "NDCG", "ranked_relevance",
    "ParentHitRate", "ParentPrecision", "ParentRecall", "ParentMRR", "ParentMAP", "ParentNDCG",
    "Pollution", "parent_ranked_relevance", "parent_view",
]


def ranked_relevance(records: Sequence[RagRecord]) -> kernels.RankedRelevance:
    """The padded relevance arrays of ``records``: built once per batch for the whole suite
    (the engine's batch memo; the batch's records do not change while it is scored), else
    every time — never reused across calls, where the records may have changed."""

    def build() -> kernels.RankedRelevance:
        return kernels.RankedRelevance.from_lists(
            [[c.id for c in r.contexts] for r in records],
            [r.relevant_ids for r in records],
        )

    return memoized(("ranked_relevance", id(records)), build)


def parent_view(record: RagRecord) -> tuple[list[str | None], dict[str, float] | None]:
    """The record at the parent grain: its ranked parents (each at its first occurrence) and
    the highest grade per parent (None when not judged), as the module docstring defines."""
    retrieved = list(dict.fromkeys(c.parent for c in record.contexts))  # keeps first occurrences
    relevant = record.relevant_ids
    if relevant is None:
        return retrieved, None
    if not isinstance(relevant, Mapping):
        relevant = dict.fromkeys(relevant, 1.0)
    # reversed: a repeated id keeps the parent of its first (best-ranked) occurrence
    of_id = {c.id: c.parent for c in reversed(record.contexts) if c.id is not None}
    parents = set(retrieved)
    grades: dict[str, float] = {}
    for rid, grade in relevant.items():
        parent = of_id.get(rid)
        if parent is None:
            parent = rid if rid in parents else parent_of(rid)
        grades[parent] = max(grades.get(parent, grade), grade)
    return retrieved, grades


def parent_ranked_relevance(records: Sequence[RagRecord]) -> kernels.RankedRelevance:
    """:func:`ranked_relevance` at the parent grain: the same kernels on collapsed lists."""

    def build() -> kernels.RankedRelevance:
        retrieved, relevant = zip(*map(parent_view, records)) if records else ((), ())
        return kernels.RankedRelevance.from_lists(list(retrieved), list(relevant))

    return memoized(("parent_ranked_relevance", id(records)), build)


def _refuse_bad_cutoff(metric: Metric) -> None:
    # hit@0 is not a metric with no relevant rank: it is a typo, refused before any row.
    k = getattr(metric, "k", None)
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
        raise ValueError(f"metric {metric.name}@{k}: the cut-off k must be an integer of at least 1")


def _refuse_missing_parents(metric: Metric, records: Sequence[RagRecord], mapping: ColumnMapping) -> None:
    """A parent comes from an id or a ``parent_id``: refuse applicable rows' contexts with neither."""
    for row, record in enumerate(records):
        if metric.not_applicable(record) is None and any(c.parent is None for c in record.contexts):
            raise RecordError(
                f"{metric.display_name} needs an id or a parent_id for every retrieved context "
                "(give contexts as dicts with an 'id' or a 'parent_id', or a context_ids column)",
                row=row,
                column=mapping.contexts,
            )


@dataclass(frozen=True)
class _RetrievalMetric(Metric):
    requires: ClassVar[tuple[str, ...]] = ("contexts", "relevant_ids")

    def __post_init__(self):
        _refuse_bad_cutoff(self)

    def not_applicable(self, record):
        if not record.relevant_ids or not any(g > 0 for g in record.relevant_ids.values()):
            return "no relevant ids for this question"
        return None

    def validate(self, records: Sequence[RagRecord], mapping: ColumnMapping) -> None:
        """Ids are needed to match relevance: refuse contexts without them, up front."""
        for row, record in enumerate(records):
            if self.not_applicable(record) is None and any(c.id is None for c in record.contexts):
                raise RecordError(
                    f"{self.display_name} needs an id for every retrieved context "
                    "(give contexts as dicts with an 'id', or a context_ids column)",
                    row=row,
                    column=mapping.contexts,
                )

    def kernel(self, rr: kernels.RankedRelevance) -> np.ndarray:
        raise NotImplementedError

    def relevance(self, records: Sequence[RagRecord]) -> kernels.RankedRelevance:
        """The arrays the kernel reads: per id here, per parent at the parent grain."""
        return ranked_relevance(records)

    def describe(self, value: float, record: RagRecord) -> str:
        retrieved = [c.id for c in record.contexts]
        ranks = [i + 1 for i, cid in enumerate(retrieved) if (record.relevant_ids or {}).get(cid, 0) > 0]
        found = f"relevant at rank(s) {ranks}" if ranks else "no relevant id retrieved"
        return f"{self.display_name} = {value:.3f}: {found} of {len(retrieved)} retrieved"

    def compute(self, records, judge=None):
        values = self.kernel(self.relevance(records))
        out = []
        for record, value in zip(records, values):
            reason = self.not_applicable(record)
            if reason is not None:
                out.append(RowResult.not_applicable(reason))
            elif not np.isfinite(value):  # a kernel bug, never hidden as "not applicable"
                out.append(RowResult.failed(f"NonFiniteScore: the {self.display_name} kernel gave {value!r} "
                                            "for a row with relevant ids"))
            else:
                out.append(RowResult.scored(value, self.describe(value, record)))
        return out


@register_metric
@dataclass(frozen=True)
class HitRate(_RetrievalMetric):
    """1 if any relevant id is among the top k, else 0 (trec_eval ``success_k``)."""

    name = "hit"
    k: int = 5

    def kernel(self, rr):
        return kernels.hit_rate(rr, self.k)


@register_metric
@dataclass(frozen=True)
class Precision(_RetrievalMetric):
    """Relevant ids in the top k divided by k (trec_eval ``P_k``)."""

    name = "precision"
    k: int = 5

    def kernel(self, rr):
        return kernels.precision(rr, self.k)


@register_metric
@dataclass(frozen=True)
class Recall(_RetrievalMetric):
    """Relevant ids in the top k divided by all relevant ids (trec_eval ``recall_k``)."""

    name = "recall"
    k: int = 5

    def kernel(self, rr):
        return kernels.recall(rr, self.k)


@register_metric
@dataclass(frozen=True)
class MRR(_RetrievalMetric):
    """Reciprocal rank of the first relevant id, within the top k when k is given."""

    name = "mrr"
    k: int | None = None

    def kernel(self, rr):
        return kernels.reciprocal_rank(rr, self.k)


@register_metric
@dataclass(frozen=True)
class MAP(_RetrievalMetric):
    """Average precision (trec_eval ``map``; ``map_cut_k`` when k is given)."""

    name = "map"
    k: int | None = None

    def kernel(self, rr):
        return kernels.average_precision(rr, self.k)


@register_metric
@dataclass(frozen=True)
class NDCG(_RetrievalMetric):
    """nDCG at k with graded relevance as linear gain (trec_eval ``ndcg_cut_k``)."""

    name = "ndcg"
    k: int = 10

    def kernel(self, rr):
        return kernels.ndcg(rr, self.k)


@dataclass(frozen=True)
class _ParentGrain(_RetrievalMetric):
    """The id-grain metric it is mixed into, on lists collapsed to parents (module docstring).

    Mixed in first (``class ParentHitRate(_ParentGrain, HitRate)``), so the kernel and its
    cut-off are the id grain's own and the two grains cannot drift apart.
    """

    def relevance(self, records):
        return parent_ranked_relevance(records)

    def validate(self, records: Sequence[RagRecord], mapping: ColumnMapping) -> None:
        """A context without an id can still be placed by its ``parent_id``."""
        _refuse_missing_parents(self, records, mapping)

    def describe(self, value: float, record: RagRecord) -> str:
        retrieved, grades = parent_view(record)
        ranks = [i + 1 for i, p in enumerate(retrieved) if (grades or {}).get(p, 0) > 0]
        found = f"relevant parent at parent rank(s) {ranks}" if ranks else "no relevant parent retrieved"
        return (f"{self.display_name} = {value:.3f}: {found} of {len(retrieved)} parents "
                f"({len(record.contexts)} contexts) retrieved")


@register_metric
@dataclass(frozen=True)
class ParentHitRate(_ParentGrain, HitRate):
    """``hit@k`` at the parent grain: a relevant parent among the top k distinct parents."""

    name = "parent_hit"


@register_metric
@dataclass(frozen=True)
class ParentPrecision(_ParentGrain, Precision):
    """``precision@k`` at the parent grain: relevant parents in the top k distinct parents, / k."""

    name = "parent_precision"


@register_metric
@dataclass(frozen=True)
class ParentRecall(_ParentGrain, Recall):
    """``recall@k`` at the parent grain: relevant parents in the top k / all relevant parents."""

    name = "parent_recall"


@register_metric
@dataclass(frozen=True)
class ParentMRR(_ParentGrain, MRR):
    """``mrr`` at the parent grain: 1 / the parent rank of the first relevant parent."""

    name = "parent_mrr"


@register_metric
@dataclass(frozen=True)
class ParentMAP(_ParentGrain, MAP):
    """``map`` at the parent grain, over distinct parents and the parents' grades."""

    name = "parent_map"


@register_metric
@dataclass(frozen=True)
class ParentNDCG(_ParentGrain, NDCG):
    """``ndcg@k`` at the parent grain: a parent's gain is the highest grade among its relevant
    ids, the ideal ranking is over relevant parents."""

    name = "parent_ndcg"


@register_metric
@dataclass(frozen=True)
class Pollution(Metric):
    """Share of the top-k retrieved slots whose context's parent already appeared higher up.

    ``(slots in the top k holding a repeated parent) / min(k, number retrieved)``: slots past
    the end of the list are not counted, so a short clean list scores 0, not less. Lower is
    better. Needs ids (or ``parent_id``) on the contexts, not relevant ids; a row with no
    retrieved context is not applicable (no slot to pollute).
    """

    name = "pollution"
    greater_is_better = False
    requires: ClassVar[tuple[str, ...]] = ("contexts",)
    k: int = 5

    def __post_init__(self):
        _refuse_bad_cutoff(self)

    def not_applicable(self, record):
        return None if record.contexts else "no retrieved contexts"

    def validate(self, records: Sequence[RagRecord], mapping: ColumnMapping) -> None:
        """Parents come from ids (or ``parent_id``): refuse contexts with neither, up front."""
        _refuse_missing_parents(self, records, mapping)

    def compute(self, records, judge=None):
        values = kernels.pollution([[c.parent for c in r.contexts] for r in records], self.k)
        out = []
        for record, value in zip(records, values):
            reason = self.not_applicable(record)
            if reason is not None:
                out.append(RowResult.not_applicable(reason))
            elif not np.isfinite(value):
                out.append(RowResult.failed(f"NonFiniteScore: the {self.display_name} kernel gave {value!r} "
                                            "for a row with retrieved contexts"))
            else:
                top = [c.parent for c in record.contexts[: self.k]]
                repeated = [i + 1 for i, p in enumerate(top) if p in top[:i]]
                shown = f"repeated parent at rank(s) {repeated}" if repeated else "no repeated parent"
                out.append(RowResult.scored(value, f"{self.display_name} = {value:.3f}: {shown} "
                                                   f"in the top {len(top)} retrieved"))
        return out
