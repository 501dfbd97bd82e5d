"""Judge-graded metrics: faithfulness, answer relevancy, context relevance, context recall.

Each metric asks the judge for a batch of primitives over the applicable rows and keeps the
evidence (claims, verdicts, reasons) in the row's details, so a person can check a number.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from mlflow_rag_eval._util.text import split_sentences
from mlflow_rag_eval.judges.base import ClaimsItem, Judge, JudgeFailure, RelevanceItem
from mlflow_rag_eval.metrics.base import Metric, each_applicable, register_metric
from mlflow_rag_eval.metrics.phrase_reference import is_phrase, is_yes_no, match_phrases
from mlflow_rag_eval.records import RagRecord
from mlflow_rag_eval.results import RowResult

__all__ = ["Faithfulness", "AnswerRelevancy", "ContextRelevance", "ContextRecall"]


def failure_row(outcome: JudgeFailure) -> RowResult:
    """The failed row of a judge failure, with its details: a judge panel's votes on a row it
    could not decide (a tie), which the agreement and the disagreement rows count."""
    return RowResult.failed(f"{outcome.kind}: {outcome.message}", **getattr(outcome, "details", {}))


def panel_votes(outcome: object) -> dict[str, list]:
    """``{"votes": [...]}`` for a judge panel's verdict or score (the members' votes), else {}."""
    votes = getattr(outcome, "votes", None)
    return {"votes": list(votes)} if votes else {}


def _claim_support(
    judge: Judge, rows: list[int], texts: list[str], passages: list[Sequence[str]],
    *, no_claims: Callable[[], RowResult], what: str,
) -> dict[int, RowResult]:
    """The claims of each text, verified against the row's passages (one fused call for an
    LLM judge); score = supported / claims."""
    out: dict[int, RowResult] = {}
    outcomes = judge.extract_and_verify([ClaimsItem(t, p) for t, p in zip(texts, passages)])
    for row, outcome in zip(rows, outcomes):
        if isinstance(outcome, JudgeFailure):
            out[row] = failure_row(outcome)
            continue
        if not outcome:
            out[row] = no_claims()
            continue
        supported = sum(v.value for _, v in outcome)
        unsupported = [c for c, v in outcome if not v.value]
        why = f"{supported} of {len(outcome)} {what} supported by the contexts"
        if unsupported:
            why += f"; unsupported: {unsupported[0]!r}" + (
                f" and {len(unsupported) - 1} more" if len(unsupported) > 1 else ""
            )
        scores = [v.score for _, v in outcome]
        # The weakest claim's support: a continuous confidence that ranks rows the share cannot
        # (every one-claim answer scores 0 or 1), where the judge scores its verdicts.
        support = {"support": min(scores)} if all(x is not None for x in scores) else {}
        if support:
            why += f" (support {support['support']:.2f}, the weakest claim's)"
        out[row] = RowResult.scored(
            supported / len(outcome),
            why,
            claims=[{"claim": c, **v.as_dict()} for c, v in outcome],
            **support,
        )
    return out


def _rate_passages(
    judge: Judge, records, rows: list[int], reference_of: Callable[[RagRecord], str | None],
    score: Callable[[RagRecord, list], RowResult],
) -> dict[int, RowResult]:
    """Rate every passage of each row in one judge call per row; a row with no passage
    scores 0, a failed call is the row's named error, else ``score(record, verdicts)``."""
    out: dict[int, RowResult] = {}
    with_ctx = [i for i in rows if records[i].contexts]
    for i in rows:
        if not records[i].contexts:
            out[i] = RowResult.scored(0.0, "no contexts were retrieved", passages=[])
    rated = judge.rate_relevance(
        [RelevanceItem(records[i].question, records[i].context_texts, reference=reference_of(records[i]))
         for i in with_ctx]
    )
    for i, outcome in zip(with_ctx, rated):
        out[i] = failure_row(outcome) if isinstance(outcome, JudgeFailure) else score(records[i], outcome)
    return out


def reference_not_applicable(record: RagRecord) -> str | None:
    """Why a metric judged against the reference cannot score a row, or None."""
    if not record.reference:
        return "no reference answer"
    if not record.answerable:
        return "row is marked unanswerable"
    return None


@register_metric
@dataclass(frozen=True)
class Faithfulness(Metric):
    """Share of the answer's claims that the retrieved contexts support.

    An answer with no claims (an abstention, an empty answer) scores 1.0: it asserts nothing the
    contexts fail to support. Whether it *should* have answered is abstention's business.
    """

    name = "faithfulness"
    requires = ("answer", "contexts")
    primitives = ("extract_and_verify",)

    def compute(self, records, judge):
        judge.require(*self.primitives, metric=self.name)

        def score(rows):
            return _claim_support(
                judge, rows, [records[i].answer for i in rows],
                [records[i].context_texts for i in rows],
                no_claims=lambda: RowResult.scored(1.0, "the answer makes no claims", claims=[]),
                what="answer claims",
            )

        return each_applicable(self, records, score)


@register_metric
@dataclass(frozen=True)
class ContextRecall(Metric):
    """Share of the reference answer's claims that the retrieved contexts support.

    Not applicable to rows without a reference, or marked unanswerable. A reference that is a
    phrase ("49 euros.", "Two years.") scores 1.0 when a context sentence states it, else 0.0
    (:mod:`mlflow_rag_eval.metrics.phrase_reference`); a yes/no reference states no fact to
    find, and is not applicable.
    """

    name = "context_recall"
    requires = ("reference", "contexts")
    primitives = ("extract_and_verify",)

    def not_applicable(self, record):
        if record.reference and is_yes_no(record.reference) and is_phrase(record.reference):
            return "a yes/no reference states no fact to find in the contexts"
        return reference_not_applicable(record)

    def compute(self, records, judge):
        judge.require(*self.primitives, metric=self.name)

        def score(rows):
            phrases = [i for i in rows if is_phrase(records[i].reference)]
            matches = match_phrases(judge, [(records[i].reference, records[i].context_texts) for i in phrases])
            out: dict[int, RowResult] = {}
            for i, match in zip(phrases, matches):
                if isinstance(match, JudgeFailure):
                    out[i] = failure_row(match)
                    continue
                verb = "states" if match.stated else "states nowhere"
                out[i] = RowResult.scored(
                    1.0 if match.stated else 0.0,
                    f"the contexts {verb} the short reference {records[i].reference!r} ({match.how})",
                    reference_kind="phrase", match=match.as_dict(),
                )
            rows = [i for i in rows if i not in out]
            return out | _claim_support(
                judge, rows, [records[i].reference for i in rows],
                [records[i].context_texts for i in rows],
                no_claims=lambda: RowResult.not_applicable("the reference makes no claims"),
                what="reference claims",
            )

        return each_applicable(self, records, score)


def passage_sentences(passage: str) -> list[str]:
    """A passage's sentences as context relevance rates them (a passage without a sentence
    break is one sentence)."""
    return split_sentences(passage) or ([passage] if passage.strip() else [])


@register_metric
@dataclass(frozen=True)
class ContextRelevance(Metric):
    """Share of the retrieved text that is relevant to the question, sentence by sentence.

    Every sentence of every retrieved passage is rated (one judge call per row) and the score is
    relevant sentences / sentences, as ragas and deepeval measure it: a long passage with one
    on-topic sentence scores low, not 1.0. No passage (or no sentence): 0.
    """

    name = "context_relevance"
    requires = ("contexts",)
    primitives = ("rate_relevance",)

    def compute(self, records, judge):
        judge.require(*self.primitives, metric=self.name)
        return each_applicable(self, records, lambda rows: self._rate(records, judge, rows))

    def _rate(self, records, judge, rows) -> dict[int, RowResult]:
        out: dict[int, RowResult] = {}
        split = {i: [passage_sentences(c.text) for c in records[i].contexts] for i in rows}
        rated_rows = [i for i in rows if any(split[i])]
        for i in rows:
            if not any(split[i]):
                out[i] = RowResult.scored(0.0, "no contexts were retrieved", passages=[])
        rated = judge.rate_relevance(
            [RelevanceItem(records[i].question, [s for sents in split[i] for s in sents]) for i in rated_rows]
        )
        for i, outcome in zip(rated_rows, rated):
            if isinstance(outcome, JudgeFailure):
                out[i] = failure_row(outcome)
                continue
            verdicts, passages, start = list(outcome), [], 0
            for context, sents in zip(records[i].contexts, split[i]):
                own = verdicts[start : start + len(sents)]
                start += len(sents)
                passages.append({"id": context.id, "relevant_sentences": sum(v.value for v in own),
                                 "sentences": [{"sentence": t, **v.as_dict()} for t, v in zip(sents, own)]})
            n_rel = sum(v.value for v in verdicts)
            out[i] = RowResult.scored(
                n_rel / len(verdicts),
                f"{n_rel} of {len(verdicts)} sentences of the {len(passages)} retrieved passages are "
                "relevant to the question",
                passages=passages,
            )
        return out


@register_metric
@dataclass(frozen=True)
class AnswerRelevancy(Metric):
    """How directly the answer addresses the question; noncommittal answers score 0.

    With a judge that can generate questions (an LLM), ``n_questions`` questions are generated
    from the answer and their mean similarity to the asked question is the score (the ragas
    definition). Otherwise (the local judge) the score is the similarity of question and answer.
    """

    name = "answer_relevancy"
    requires = ("answer",)
    primitives = ("similarity",)
    n_questions: int = 3

    def compute(self, records, judge):
        judge.require(*self.primitives, metric=self.name)
        if not (judge.supports("generate_questions") or judge.supports("is_abstention")):
            judge.require("generate_questions", metric=self.name)
        if judge.supports("generate_questions"):
            return each_applicable(self, records, lambda rows: self._generated(records, judge, rows))
        return each_applicable(self, records, lambda rows: self._direct(records, judge, rows))

    def _direct(self, records, judge, rows) -> dict[int, RowResult]:
        """Local judge: abstentions score 0, others the question-answer similarity."""
        out: dict[int, RowResult] = {}
        abstains = judge.is_abstention([(records[i].question, records[i].answer) for i in rows])
        committed = []
        for i, verdict in zip(rows, abstains):
            if isinstance(verdict, JudgeFailure):
                out[i] = failure_row(verdict)
            elif verdict.value:
                out[i] = RowResult.scored(0.0, f"noncommittal answer ({verdict.reason})",
                                          **({"abstention": panel_votes(verdict)} if panel_votes(verdict) else {}))
            else:
                committed.append(i)
        sims = judge.similarity([(records[i].question, records[i].answer) for i in committed])
        for i, sim in zip(committed, sims):
            out[i] = (
                failure_row(sim)
                if isinstance(sim, JudgeFailure)
                else RowResult.scored(sim, f"question-answer similarity {sim:.2f}",
                                      **({"similarity": {"value": float(sim), **panel_votes(sim)}} if panel_votes(sim) else {}))
            )
        return out

    def _generated(self, records, judge, rows) -> dict[int, RowResult]:
        """LLM judge: one call generates questions and flags noncommittal answers."""
        out: dict[int, RowResult] = {}
        encode_ahead = getattr(judge, "encode_ahead", None)
        if encode_ahead is not None:  # the questions' vectors, made while other metrics' calls are in flight
            encode_ahead([records[i].question for i in rows])
        generated = judge.generate_questions([records[i].answer for i in rows], self.n_questions)
        pairs, owners = [], []
        for i, gen in zip(rows, generated):
            if isinstance(gen, JudgeFailure):
                out[i] = failure_row(gen)
            elif gen.noncommittal:
                out[i] = RowResult.scored(0.0, "noncommittal answer (judged evasive or unknowing)")
            elif not gen.questions:
                out[i] = RowResult.failed("EmptyGeneration: the judge generated no questions")
            else:
                pairs.extend((records[i].question, q) for q in gen.questions)
                owners.extend([i] * len(gen.questions))
        sims = judge.similarity(pairs)
        by_row: dict[int, list] = {}
        for i, (_, q), sim in zip(owners, pairs, sims):
            by_row.setdefault(i, []).append((q, sim))
        for i, items in by_row.items():
            failure = next((s for _, s in items if isinstance(s, JudgeFailure)), None)
            if failure is not None:
                out[i] = failure_row(failure)
                continue
            value = float(np.mean([s for _, s in items]))
            out[i] = RowResult.scored(
                value,
                f"mean similarity {value:.2f} of {len(items)} questions generated from the answer",
                generated_questions=[{"question": q, "similarity": float(s), **panel_votes(s)} for q, s in items],
            )
        return out


@register_metric
@dataclass(frozen=True)
class ContextPrecision(Metric):
    """Rank-weighted precision of the useful passages (ragas' context precision).

    Each passage gets a verdict "useful for answering" in one judge call per row, judged
    against the reference answer when the row has one, else against the generated answer.
    Score = sum over ranks k of precision@k x v_k, divided by the number of useful passages;
    0 when no passage is useful or none was retrieved.
    """

    name = "context_precision"
    requires = ("contexts",)
    primitives = ("rate_relevance",)

    def compute(self, records, judge):
        judge.require(*self.primitives, metric=self.name)

        def precision(record, verdicts):
            useful = np.array([bool(v.value) for v in verdicts], dtype=float)
            hits = useful.sum()
            ranks = np.arange(1, len(useful) + 1)
            value = float((np.cumsum(useful) / ranks * useful).sum() / hits) if hits else 0.0
            positions = [k + 1 for k, u in enumerate(useful) if u]
            return RowResult.scored(
                value,
                f"useful passages at rank(s) {positions} of {len(useful)}" if positions
                else f"none of the {len(useful)} passages is useful",
                passages=[{"id": c.id, **v.as_dict()} for c, v in zip(record.contexts, verdicts)],
            )

        def reference_of(record):
            return record.reference or record.answer or None

        return each_applicable(
            self, records, lambda rows: _rate_passages(judge, records, rows, reference_of, precision)
        )
