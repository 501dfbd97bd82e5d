"""Retrieval metrics over ids (hit, precision, recall, MRR, MAP, nDCG) as registered metrics.

Thin units over the vectorised kernels in :mod:`mlflow_rag_eval.metrics.retrieval`, whose
docstring holds the semantics (trec_eval's, for the given rank order). Rows whose
``relevant_ids`` are missing, empty or all graded 0 are not applicable; they are counted in
``n_skipped``, never as a score of 0 and never as an error. A NaN from a kernel on any other
row is an error (``NonFiniteScore``): a kernel bug must not hide as skipped rows. No judge is
involved.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from mlflow_rag_eval.metrics import retrieval as kernels
from mlflow_rag_eval.metrics.base import Metric, memoized, register_metric
from mlflow_rag_eval.records import ColumnMapping, RagRecord, RecordError
from mlflow_rag_eval.results import RowResult

__all__ = ["HitRate", "Precision", "Recall", "MRR", "MAP", "NDCG", "ranked_relevance"]

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


@dataclass(frozen=True)
class _RetrievalMetric(Metric):
    requires: ClassVar[tuple[str, ...]] = ("contexts", "relevant_ids")

    def __post_init__(self):
        # hit@0 is not a metric with no relevant rank: it is a typo, refused before any row.
        k = getattr(self, "k", None)
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise ValueError(f"metric {self.name}@{k}: the cut-off k must be an integer of at least 1")

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

    def describe(self, value: float, record: RagRecord) -> str:
        retrieved = [c.id for c in record.contexts]
        ranks = [i + 1 for i, cid in enumerate(retrieved) if (record.relevant_ids or {}).get(cid, 0) > 0]
        found = f"relevant at rank(s) {ranks}" if ranks else "no relevant id retrieved"
        return f"{self.display_name} = {value:.3f}: {found} of {len(retrieved)} retrieved"

    def compute(self, records, judge=None):
        values = self.kernel(ranked_relevance(records))
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
