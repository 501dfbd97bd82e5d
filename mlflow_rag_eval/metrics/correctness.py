"""Answer correctness against the reference: claim-level precision, recall and F1."""

from __future__ import annotations

from dataclasses import dataclass

from mlflow_rag_eval.judges.base import ClaimsItem, JudgeFailure
from mlflow_rag_eval.metrics.base import Metric, each_applicable, register_metric
from mlflow_rag_eval.metrics.generation import failure_row, reference_not_applicable
from mlflow_rag_eval.results import RowResult

__all__ = ["AnswerCorrectness"]

MODES = ("f1", "precision", "recall")


@register_metric
@dataclass(frozen=True)
class AnswerCorrectness(Metric):
    """Factual overlap of answer and reference, counted over claims (ragas' factual correctness).

    TP: answer claims the reference supports; FP: answer claims it does not; FN: reference
    claims the answer does not support. precision = TP / (TP + FP), recall = (reference claims
    supported) / (reference claims), F1 their harmonic mean; ``mode`` picks the value logged
    (all three are in the row's details). An answer with no claims has precision 0 and recall 0.
    Not applicable without a reference, on rows marked unanswerable, or when the reference
    makes no claims.
    """

    name = "answer_correctness"
    requires = ("answer", "reference")
    primitives = ("extract_and_verify",)
    mode: str = "f1"

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"answer_correctness mode must be one of {MODES}, got {self.mode!r}")

    def not_applicable(self, record):
        return reference_not_applicable(record)

    def compute(self, records, judge):
        judge.require(*self.primitives, metric=self.name)

        def score(rows):
            out: dict[int, RowResult] = {}
            answer_side = judge.extract_and_verify(
                [ClaimsItem(records[i].answer, [records[i].reference]) for i in rows]
            )
            reference_side = judge.extract_and_verify(
                [ClaimsItem(records[i].reference, [records[i].answer]) for i in rows]
            )
            for i, a, r in zip(rows, answer_side, reference_side):
                failure = a if isinstance(a, JudgeFailure) else r if isinstance(r, JudgeFailure) else None
                if failure is not None:
                    out[i] = failure_row(failure)
                    continue
                if not r:
                    out[i] = RowResult.not_applicable("the reference makes no claims")
                    continue
                tp = sum(v.value for _, v in a)
                fp = len(a) - tp
                covered = sum(v.value for _, v in r)
                fn = len(r) - covered
                precision = tp / len(a) if a else 0.0
                recall = covered / len(r)
                f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
                value = {"f1": f1, "precision": precision, "recall": recall}[self.mode]
                out[i] = RowResult.scored(
                    value,
                    f"{self.mode} {value:.2f}: {tp} of {len(a)} answer claims backed by the reference, "
                    f"{covered} of {len(r)} reference claims covered by the answer",
                    tp=tp, fp=fp, fn=fn, precision=precision, recall=recall, f1=f1,
                    answer_claims=[{"claim": c, **v.as_dict()} for c, v in a],
                    reference_claims=[{"claim": c, **v.as_dict()} for c, v in r],
                )
            return out

        return each_applicable(self, records, score)
