"""Answer correctness against the reference: claim-level precision, recall and F1."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from mlflow_rag_eval.judges.base import ClaimsItem, JudgeFailure, Verdict
from mlflow_rag_eval.metrics.base import Metric, each_applicable, register_metric
from mlflow_rag_eval.metrics.generation import failure_row, reference_not_applicable
from mlflow_rag_eval.metrics.phrase_reference import (
    is_fragment,
    is_phrase,
    is_yes_no,
    match_phrases,
    match_yes_no,
    sentence_with_every_term,
    with_question,
)
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

    A reference that is a fragment, not a statement ("Lisbon, Porto and Faro.", "Every weekday
    except Monday.": :func:`~mlflow_rag_eval.metrics.phrase_reference.is_fragment`), is read
    with its question: the answer's claims are checked against "When is the office open? Every
    weekday except Monday.", and the fragment against the answer: it is covered outright when
    one answer sentence holds every term of it (a fragment is not a sentence an entailment
    model reads well as a claim), else the judge decides.

    A reference that is a phrase ("49 euros.", "Two years.", "Yes.") is the answer to the row's
    question, not a claim: the row scores 1.0 when the answer states it and 0.0 when it does not
    (every mode), the match in the details
    (:mod:`mlflow_rag_eval.metrics.phrase_reference`).
    """

    name = "answer_correctness"
    #: 2: a fragment reference is covered when one answer sentence holds every term of it
    version: ClassVar[int] = 2
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
            phrases = [i for i in rows if is_phrase(records[i].reference)]
            out = self._phrase_rows(records, judge, phrases)
            rows = [i for i in rows if i not in out]
            # a fragment reference ("Every weekday except Monday.") answers its question: the
            # answer's claims are checked against the two read together
            premises = {i: with_question(records[i].question, records[i].reference)
                        if is_fragment(records[i].reference) else records[i].reference for i in rows}
            answer_side = judge.extract_and_verify(
                [ClaimsItem(records[i].answer, [premises[i]]) for i in rows]
            )
            stated = {i: sentence_with_every_term(records[i].reference, records[i].answer) for i in rows
                      if premises[i] != records[i].reference}
            stated = {i: [(records[i].reference.strip(), Verdict(
                True, "an answer sentence holds every term of the fragment", evidence=s, score=1.0, source_index=0))]
                for i, s in stated.items() if s is not None}
            judged = iter(judge.extract_and_verify(
                [ClaimsItem(records[i].reference, [records[i].answer]) for i in rows if i not in stated]
            ))
            reference_side = [stated[i] if i in stated else next(judged) for i in rows]
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
                    f"{self.mode} {value:.2f}: {tp} of {len(a)} answer claims backed by the reference"
                    + (" (read with its question)" if premises[i] != records[i].reference else "") + ", "
                    f"{covered} of {len(r)} reference claims covered by the answer",
                    tp=tp, fp=fp, fn=fn, precision=precision, recall=recall, f1=f1,
                    answer_claims=[{"claim": c, **v.as_dict()} for c, v in a],
                    reference_claims=[{"claim": c, **v.as_dict()} for c, v in r],
                )
            return out

        return each_applicable(self, records, score)

    def _phrase_rows(self, records, judge, rows: list[int]) -> dict[int, RowResult]:
        """Rows whose reference is a phrase: does the answer state it?"""
        out: dict[int, RowResult] = {}
        yes_no = [i for i in rows if is_yes_no(records[i].reference)]
        matches = dict(zip(yes_no, (match_yes_no(records[i].reference, records[i].answer) for i in yes_no)))
        others = [i for i in rows if i not in matches]
        matches.update(zip(others, match_phrases(judge, [(records[i].reference, [records[i].answer]) for i in others])))
        for i in rows:
            match = matches[i]
            if isinstance(match, JudgeFailure):
                out[i] = failure_row(match)
                continue
            value = 1.0 if match.stated else 0.0
            verb = "states" if match.stated else "does not state"
            out[i] = RowResult.scored(
                value, f"{self.mode} {value:.2f}: the answer {verb} the short reference {records[i].reference!r} "
                f"({match.how})",
                reference_kind="phrase", match=match.as_dict(), precision=value, recall=value, f1=value,
            )
        return out
