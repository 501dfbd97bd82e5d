"""Citations in the answer: do they point at retrieved sources, and do those sources support
the sentence that cites them?

Markers are found with ``pattern`` (default: ``[1]``, ``[[1]]``, ``[1, 3]``, ``[doc-7]``); its
first group holds one or more comma-separated targets. A target of digits is a position in the
retrieved contexts (1-based by default, ``index_base``); anything else is a context id. An answer
without citations is not applicable to either metric.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mlflow_rag_eval._util.text import split_sentences
from mlflow_rag_eval.judges.base import JudgeFailure, VerifyItem
from mlflow_rag_eval.metrics.base import Metric, each_applicable, register_metric
from mlflow_rag_eval.metrics.generation import failure_row, panel_votes
from mlflow_rag_eval.records import RagRecord
from mlflow_rag_eval.results import RowResult

__all__ = ["CitationSupport", "CitationValidity", "DEFAULT_CITATION_PATTERN", "find_citations"]

DEFAULT_CITATION_PATTERN = r"\[\[?\s*([A-Za-z0-9_.:\-]+(?:\s*,\s*[A-Za-z0-9_.:\-]+)*)\s*\]?\]"


@dataclass(frozen=True)
class Citation:
    sentence: str  # the citing sentence, markers removed
    target: str  # as written
    context_index: int | None  # the retrieved context it resolves to, None if it does not


def find_citations(record: RagRecord, pattern: str = DEFAULT_CITATION_PATTERN, index_base: int = 1) -> list[Citation]:
    """Every citation target in the answer, with its sentence and resolved context."""
    regex = re.compile(pattern)
    ids = {c.id: k for k, c in enumerate(record.contexts) if c.id is not None}
    out = []
    for sentence in split_sentences(record.answer):
        markers = list(regex.finditer(sentence))
        if not markers:
            continue
        plain = regex.sub("", sentence).strip()
        for marker in markers:
            for target in (t.strip() for t in marker.group(1).split(",")):
                if target in ids:
                    index = ids[target]
                elif target.isdigit() and 0 <= int(target) - index_base < len(record.contexts):
                    index = int(target) - index_base
                else:
                    index = None
                out.append(Citation(plain, target, index))
    return out


@dataclass(frozen=True)
class _CitationMetric(Metric):
    requires = ("answer", "contexts")
    pattern: str = DEFAULT_CITATION_PATTERN
    index_base: int = 1

    def not_applicable(self, record):
        return None if find_citations(record, self.pattern, self.index_base) else "the answer cites nothing"


@register_metric
@dataclass(frozen=True)
class CitationValidity(_CitationMetric):
    """Share of citation targets that exist among the retrieved contexts (no judge needed)."""

    name = "citation_validity"

    def compute(self, records, judge=None):
        def score(rows):
            out = {}
            for i in rows:
                cites = find_citations(records[i], self.pattern, self.index_base)
                invalid = [c.target for c in cites if c.context_index is None]
                out[i] = RowResult.scored(
                    1 - len(invalid) / len(cites),
                    f"{len(cites) - len(invalid)} of {len(cites)} citations point at a retrieved context"
                    + (f"; not found: {invalid}" if invalid else ""),
                    invalid=invalid,
                )
            return out

        return each_applicable(self, records, score)


@register_metric
@dataclass(frozen=True)
class CitationSupport(_CitationMetric):
    """Share of citations whose cited context supports the citing sentence; a citation to a
    missing source supports nothing."""

    name = "citation_support"
    primitives = ("verify",)

    def compute(self, records, judge):
        judge.require(*self.primitives, metric=self.name)

        def score(rows):
            out = {}
            per_row = {i: find_citations(records[i], self.pattern, self.index_base) for i in rows}
            checks = [
                (i, k, c) for i in rows for k, c in enumerate(per_row[i]) if c.context_index is not None
            ]
            verdicts = judge.verify(
                [VerifyItem([records[i].contexts[c.context_index].text], [c.sentence]) for i, _, c in checks]
            )
            found: dict[tuple[int, int], object] = {
                (i, k): v for (i, k, _), v in zip(checks, verdicts)
            }
            for i in rows:
                cites = per_row[i]
                failure = next(
                    (v for k in range(len(cites)) if isinstance(v := found.get((i, k)), JudgeFailure)), None
                )
                if failure is not None:
                    out[i] = failure_row(failure)
                    continue
                details, supported = [], 0
                for k, c in enumerate(cites):
                    verdict = found.get((i, k))
                    ok = bool(verdict is not None and verdict[0].value)
                    supported += ok
                    details.append({
                        "sentence": c.sentence, "target": c.target, "supported": ok,
                        "reason": verdict[0].reason if verdict is not None else "cited source was not retrieved",
                        **(panel_votes(verdict[0]) if verdict is not None else {}),
                    })
                out[i] = RowResult.scored(
                    supported / len(cites),
                    f"{supported} of {len(cites)} citations are supported by the cited context",
                    citations=details,
                )
            return out

        return each_applicable(self, records, score)
