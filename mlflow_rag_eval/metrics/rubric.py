"""Custom rubrics, G-Eval style: criteria, evaluation steps, a score range and a pass threshold.

Only judges that can grade (LLM judges) run them; the local judge is refused before any row is
judged. A rubric is built with :func:`rubric` and passed as a Metric object::

    politeness = rubric("politeness", criteria="The answer is polite and calm.",
                        steps=["Read the answer.", "Note any rude phrasing.", "Score 1-5."])
    mlflow.evaluate(..., evaluator_config={"metrics": ["faithfulness", politeness]})
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

from mlflow_rag_eval.judges.base import JudgeFailure
from mlflow_rag_eval.keys import display_name
from mlflow_rag_eval.metrics.base import Metric, each_applicable, registered_metrics
from mlflow_rag_eval.metrics.generation import failure_row, panel_votes
from mlflow_rag_eval.results import RowResult

__all__ = ["Rubric", "rubric"]

_FIELDS = {"question", "answer", "reference", "contexts"}
#: a rubric's name is its MLflow key, a path part of its artifacts and a column prefix: a word
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")


@dataclass(frozen=True)
class Rubric(Metric):
    """A G-Eval style rubric; the row value is the score scaled to [0, 1]."""

    name: ClassVar[str] = "rubric"
    primitives = ("grade",)
    rubric_name: str = "rubric"
    criteria: str = ""
    steps: tuple[str, ...] = ()
    low: float = 1.0
    high: float = 5.0
    threshold: float = 0.5
    fields: tuple[str, ...] = ("question", "answer")

    def __post_init__(self):
        if not isinstance(self.rubric_name, str) or not _NAME.fullmatch(self.rubric_name):
            raise ValueError(f"rubric name {self.rubric_name!r} must be a letter then up to 63 letters, digits, "
                             "'_' or '-' (it becomes the metric's MLflow key)")
        base = display_name(self.rubric_name).split("@")[0]  # ndcg_at_10 is ndcg@10's key
        if base in registered_metrics():
            raise ValueError(f"rubric name {self.rubric_name!r} is a built-in metric's name: a rubric's scores "
                             "must not pass for another metric's; choose another name")
        if not self.criteria.strip() or not self.steps:
            raise ValueError(f"rubric {self.rubric_name!r} needs criteria and at least one step")
        if not self.low < self.high:
            raise ValueError(f"rubric {self.rubric_name!r}: low must be below high")
        if not 0 <= self.threshold <= 1:
            raise ValueError(f"rubric {self.rubric_name!r}: threshold is on the 0..1 scale")
        unknown = set(self.fields) - _FIELDS
        if unknown:
            raise ValueError(f"rubric {self.rubric_name!r}: unknown fields {sorted(unknown)}")

    @property
    def display_name(self) -> str:
        return self.rubric_name

    @property
    def requires(self) -> tuple[str, ...]:  # type: ignore[override]
        return tuple(f for f in self.fields if f != "question")

    def spec(self):
        spec = super().spec()
        spec["params"].update(criteria=self.criteria, steps=list(self.steps))
        return spec

    def compute(self, records, judge):
        judge.require(*self.primitives, metric=self.display_name)

        def row_fields(record) -> dict[str, str]:
            values = {
                "question": record.question,
                "answer": record.answer,
                "reference": record.reference or "",
                "contexts": "\n\n".join(record.context_texts),
            }
            return {f: values[f] for f in self.fields}

        def score(rows):
            out = {}
            grades = judge.grade(self, [row_fields(records[i]) for i in rows])
            for i, verdict in zip(rows, grades):
                if isinstance(verdict, JudgeFailure):
                    out[i] = failure_row(verdict)
                    continue
                raw = self.low + verdict.score * (self.high - self.low)
                passed = verdict.score >= self.threshold
                out[i] = RowResult.scored(
                    verdict.score,
                    f"{raw:g} of {self.low:g}..{self.high:g} ({'pass' if passed else 'fail'}): {verdict.reason}",
                    raw_score=raw, passed=passed, steps=verdict.evidence, **panel_votes(verdict),
                )
            return out

        return each_applicable(self, records, score)


def rubric(name: str, criteria: str, steps, *, low: float = 1, high: float = 5,
           threshold: float = 0.5, fields=("question", "answer")) -> Rubric:
    """A custom rubric metric named ``name`` (its MLflow key is ``name``)."""
    return Rubric(rubric_name=name, criteria=criteria, steps=tuple(steps), low=float(low),
                  high=float(high), threshold=float(threshold), fields=tuple(fields))
