"""Abstention: does the pipeline say "I don't know" exactly when it should?

Two rates, each over its own rows:
- ``abstention``: on rows marked unanswerable, the share where the answer abstains (higher is
  better);
- ``false_abstention``: on answerable rows, the share where the answer abstains anyway (lower
  is better).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from mlflow_rag_eval.judges.base import JudgeFailure
from mlflow_rag_eval.metrics.base import Metric, each_applicable, register_metric
from mlflow_rag_eval.metrics.generation import failure_row, panel_votes
from mlflow_rag_eval.results import RowResult

__all__ = ["Abstention", "FalseAbstention"]


@dataclass(frozen=True)
class _AbstentionRate(Metric):
    primitives = ("is_abstention",)
    #: which rows the rate is over: the unanswerable (True) or the answerable (False) ones
    over_unanswerable: ClassVar[bool]

    def not_applicable(self, record):
        if record.answerable == self.over_unanswerable:
            return "row is marked answerable" if self.over_unanswerable else "row is marked unanswerable"
        return None

    def compute(self, records, judge):
        judge.require(*self.primitives, metric=self.name)

        def score(rows):
            out = {}
            verdicts = judge.is_abstention([(records[i].question, records[i].answer) for i in rows])
            for i, verdict in zip(rows, verdicts):
                if isinstance(verdict, JudgeFailure):
                    out[i] = failure_row(verdict)
                else:
                    word = "abstains" if verdict.value else "answers"
                    reason = verdict.reason or ""
                    # A judge's reason may already open with its verdict: say it once.
                    why = reason if reason.lower().startswith(word) else f"{word}: {reason}"
                    out[i] = RowResult.scored(
                        1.0 if verdict.value else 0.0,
                        why,
                        **panel_votes(verdict),
                    )
            return out

        return each_applicable(self, records, score)


@register_metric
@dataclass(frozen=True)
class Abstention(_AbstentionRate):
    """On unanswerable rows: 1 when the answer abstains, else 0."""

    name = "abstention"
    requires = ("answer", "answerable")
    over_unanswerable = True


@register_metric
@dataclass(frozen=True)
class FalseAbstention(_AbstentionRate):
    """On answerable rows: 1 when the answer abstains anyway, else 0. Lower is better."""

    name = "false_abstention"
    requires = ("answer",)
    greater_is_better = False
    over_unanswerable = False
