"""Every metric on hand-worked rows, with a scripted judge whose decisions are simple rules:

- a claim is supported iff its text (without the final period) appears in a passage;
- a passage is useful iff it contains a sentence of the reference (or, without a reference,
  the question's last word);
- an answer abstains iff it starts with "I don't know".

Expected values are written as the formula of the metric's definition.
"""

from __future__ import annotations

import pandas as pd
import pytest

from mlflow_rag_eval._util.text import split_sentences, strip_citations
from mlflow_rag_eval.evaluation.engine import evaluate_records
from mlflow_rag_eval.judges import JudgeCapabilityError
from mlflow_rag_eval.judges.llm.judge import LLMJudge
from mlflow_rag_eval.judges.providers.scripted import ScriptedBackend
from mlflow_rag_eval.metrics import resolve_metric, rubric
from mlflow_rag_eval.records import records_from_frame

P0 = "Bikes cost 5 euros on weekdays."
P1 = "Dogs travel free. Bikes too."
P2 = "Trains are green."


def _claims(text):
    return [s for s in split_sentences(strip_citations(text)) if not s.startswith("I don't know")]


def _in(claim, passages):
    return any(claim.rstrip(".").lower() in p.lower() for p in passages)


SCRIPT = {
    "claims_verdicts": lambda v: {"claims": [
        {"claim": c, "supported": _in(c, v["passages"]), "reason": "rule"} for c in _claims(v["text"])
    ]},
    "verify": lambda v: {"verdicts": [
        {"index": i, "verdict": _in(c, v["passages"]), "reason": "rule"} for i, c in enumerate(v["claims"])
    ]},
    "rate_relevance": lambda v: {"verdicts": [
        {"index": i, "reason": "rule", "verdict": (
            any(s.rstrip(".").lower() in p.lower() for s in split_sentences(v["reference"]))
            if v["reference"] else v["question"].rstrip("?").split()[-1].lower() in p.lower()
        )}
        for i, p in enumerate(v["passages"])
    ]},
    "is_abstention": lambda v: {"abstains": v["answer"].startswith("I don't know"), "reason": "rule"},
    "generate_questions": lambda v: {"questions": [f"What about {v['answer']}"],
                                     "noncommittal": v["answer"].startswith("I don't know")},
    "grade": lambda v: {"steps": ["read"], "score": 4, "reason": "mostly polite"},
}

ROWS = {
    "normal": dict(question="What do bikes cost?", answer="Bikes cost 5 euros. Dogs travel free. Cats fly.",
                   contexts=[P2, P0, P1], reference="Bikes cost 5 euros. Bikes too.", answerable=True),
    "empty-contexts": dict(question="What do bikes cost?", answer="Bikes cost 5 euros.", contexts=[],
                           reference="Bikes cost 5 euros.", answerable=True),
    "no-claims": dict(question="Can cats fly?", answer="I don't know.", contexts=[P2], reference=None,
                      answerable=False),
    "all-unsupported": dict(question="What do trains do?", answer="Cats fly. Trains swim.", contexts=[P0],
                            reference="Trains are green.", answerable=True),
    "duplicate-chunks": dict(question="What do bikes cost?", answer="Bikes cost 5 euros.", contexts=[P0, P0, P2],
                             reference="Bikes cost 5 euros.", answerable=True),
    "missing-citation": dict(question="What do bikes cost?", answer="Bikes cost 5 euros [1]. Dogs travel free [3].",
                             contexts=[P0, P1], reference="Bikes cost 5 euros.", answerable=True),
}

EXPECTED = {
    "faithfulness": {
        "normal": 2 / 3, "empty-contexts": 0.0, "no-claims": 1.0, "all-unsupported": 0 / 2,
        "duplicate-chunks": 1 / 1, "missing-citation": 2 / 2,
    },
    "context_recall": {
        "normal": 2 / 2, "empty-contexts": 0 / 1, "no-claims": None, "all-unsupported": 0 / 1,
        "duplicate-chunks": 1 / 1, "missing-citation": 1 / 1,
    },
    # v = usefulness by rank; sum_k precision@k * v_k / sum v
    "context_precision": {
        "normal": (0 + 1 / 2 + 2 / 3) / 2, "empty-contexts": 0.0, "no-claims": 0.0,
        "all-unsupported": 0.0, "duplicate-chunks": (1 / 1 + 2 / 2) / 2, "missing-citation": (1 / 1) / 1,
    },
    "context_relevance": {  # question's last word in the sentence ("cost" -> only P0); P1 has 2 sentences
        "normal": 1 / 4, "empty-contexts": 0.0, "no-claims": 0 / 1, "all-unsupported": 0 / 1,
        "duplicate-chunks": 2 / 3, "missing-citation": 1 / 3,
    },
    "answer_correctness": {  # F1 of precision = TP/(TP+FP), recall = covered/reference claims
        "normal": 2 * (1 / 3) * (1 / 2) / (1 / 3 + 1 / 2), "empty-contexts": 1.0, "no-claims": None,
        "all-unsupported": 0.0, "duplicate-chunks": 1.0, "missing-citation": 2 * (1 / 2) * 1 / (1 / 2 + 1),
    },
    "abstention": {"no-claims": 1.0},
    "false_abstention": {"normal": 0.0, "empty-contexts": 0.0, "all-unsupported": 0.0,
                         "duplicate-chunks": 0.0, "missing-citation": 0.0},
    "citation_validity": {"missing-citation": 1 / 2},
    "citation_support": {"missing-citation": 1 / 2},  # [3] was not retrieved: supports nothing
}


@pytest.fixture(scope="module")
def result():
    judge = LLMJudge(ScriptedBackend(SCRIPT), cache=False)
    df = pd.DataFrame(list(ROWS.values()))
    return evaluate_records(records_from_frame(df), list(EXPECTED) + ["answer_relevancy"], judge)


@pytest.mark.parametrize("metric", list(EXPECTED))
def test_metric_values_on_hand_worked_rows(result, metric):
    rows = dict(zip(ROWS, next(m for m in result.metrics if m.name == metric).rows))
    for case, row in rows.items():
        expected = EXPECTED[metric].get(case)
        assert row.error is None, (case, row.error)
        if expected is None:
            assert row.value is None and row.justification.startswith("not applicable"), case
        else:
            assert row.value == pytest.approx(expected, abs=1e-12), case


def test_evidence_is_kept_for_a_person_to_check(result):
    faith = next(m for m in result.metrics if m.name == "faithfulness").rows[0]
    assert [c["claim"] for c in faith.details["claims"]] == ["Bikes cost 5 euros.", "Dogs travel free.", "Cats fly."]
    assert [c["value"] for c in faith.details["claims"]] == [True, True, False]
    assert "unsupported: 'Cats fly.'" in faith.justification
    correctness = next(m for m in result.metrics if m.name == "answer_correctness").rows[0]
    assert (correctness.details["tp"], correctness.details["fp"], correctness.details["fn"]) == (1, 2, 1)
    support = next(m for m in result.metrics if m.name == "citation_support").rows[5]
    assert support.details["citations"][1]["reason"] == "cited source was not retrieved"


def test_noncommittal_answer_scores_zero_relevancy(result):
    relevancy = dict(zip(ROWS, next(m for m in result.metrics if m.name == "answer_relevancy").rows))
    assert relevancy["no-claims"].value == 0.0
    assert relevancy["normal"].value > 0.0


def test_summaries_count_scored_errors_and_skipped(result):
    summary = next(m for m in result.metrics if m.name == "context_recall").summary
    assert (summary.n_scored, summary.n_error, summary.n_skipped) == (5, 0, 1)
    assert summary.ci_low <= summary.mean <= summary.ci_high


def test_rubric_scales_the_grade_and_needs_an_llm_judge(local_judge):
    polite = rubric("politeness", "The answer is polite.", ["Read it.", "Score 1-5."], threshold=0.7)
    records = records_from_frame(pd.DataFrame([ROWS["normal"]]))
    (m,) = evaluate_records(records, [polite], LLMJudge(ScriptedBackend(SCRIPT), cache=False)).metrics
    assert m.key == "politeness"
    assert m.rows[0].value == pytest.approx((4 - 1) / (5 - 1))
    assert m.rows[0].details["passed"] is True and m.spec["params"]["criteria"] == "The answer is polite."
    with pytest.raises(JudgeCapabilityError, match="politeness"):
        evaluate_records(records, [polite], local_judge)


def test_bad_metric_parameters_are_refused():
    from mlflow_rag_eval.metrics.correctness import AnswerCorrectness

    with pytest.raises(ValueError, match="mode"):
        AnswerCorrectness(mode="accuracy")
    with pytest.raises(ValueError, match="needs criteria"):
        rubric("empty", "", [])


@pytest.mark.parametrize("name", ["../../evil", "a/b", "", " concise", "x" * 65, "ndcg@10", 7])
def test_a_rubric_name_that_is_no_plain_key_is_refused_when_it_is_made(name):
    """Its name is a metric key, an artifact path part and a column prefix: refused before any
    judge call or trace, not after."""
    with pytest.raises(ValueError, match="must be a letter"):
        rubric(name, "The answer is polite.", ["Read it."])


def test_the_name_rubric_says_how_a_rubric_is_made():
    with pytest.raises(ValueError, match=r"a rubric is made, not named: pass rubric\('politeness'"):
        resolve_metric("rubric")


@pytest.mark.parametrize("name", ["hit_at_5", "faithfulness", "mrr"])
def test_a_rubric_cannot_take_a_built_in_metrics_name(name):
    with pytest.raises(ValueError, match="is a built-in metric's name"):
        rubric(name, "The answer is polite.", ["Read it."])


# -- the local judge on small real texts ------------------------------------------------------------

REAL = pd.DataFrame([
    dict(question="How much does a bike ticket cost?", answer="A bike ticket costs 5 euros per journey [1].",
         contexts=[{"id": "p1", "text": "Bicycles travel for a flat fare of 5 euros per journey."},
                   {"id": "p2", "text": "Dogs travel free if kept on a lead."}],
         reference="A bike ticket costs 5 euros per journey.", answerable=True),
    dict(question="How much does a bike ticket cost?", answer="A bike ticket costs 40 euros and includes lunch [2].",
         contexts=[{"id": "p1", "text": "Bicycles travel for a flat fare of 5 euros per journey."},
                   {"id": "p2", "text": "Dogs travel free if kept on a lead."}],
         reference="A bike ticket costs 5 euros per journey.", answerable=True),
    dict(question="Can I bring my parrot?", answer="I don't know; the documents do not mention parrots.",
         contexts=[{"id": "p2", "text": "Dogs travel free if kept on a lead."}], reference=None, answerable=False),
])


def test_local_judge_tells_a_right_answer_from_a_wrong_one(local_judge):
    names = ["faithfulness", "answer_correctness", "citation_support", "citation_validity",
             "abstention", "false_abstention", "context_precision"]
    result = evaluate_records(records_from_frame(REAL), names, local_judge)
    by = {m.name: [r.value for r in m.rows] for m in result.metrics}
    assert by["faithfulness"][0] == 1.0 and by["faithfulness"][1] == 0.0
    assert by["answer_correctness"][0] > by["answer_correctness"][1]
    assert by["citation_support"][:2] == [1.0, 0.0]  # [2] is a dog passage
    assert by["citation_validity"][:2] == [1.0, 1.0] and by["citation_validity"][2] is None
    assert by["abstention"] == [None, None, 1.0]
    assert by["false_abstention"] == [0.0, 0.0, None]
    assert by["context_precision"][0] == 1.0  # the bike passage, ranked first, is useful


@pytest.mark.parametrize("answer, stated", [
    ("Yes, the price includes VAT.", True), ("The price includes VAT.", True),
    ("No, it does not.", False), ("The price does not include VAT.", False),
    ("I don't know.", False), ("The documents do not say.", False), ("", False),
])
def test_a_yes_reference_is_matched_by_the_answers_yes_not_by_an_abstention(answer, stated):
    from mlflow_rag_eval.metrics.phrase_reference import match_yes_no

    assert match_yes_no("Yes.", answer).stated is stated
    # an answer that does not know says no "no" either
    assert match_yes_no("No.", answer).stated is (answer in ("No, it does not.", "The price does not include VAT."))


def test_the_key_a_run_logs_names_the_same_metric_and_the_cut_offs_are_listed():
    """Issue 45: ``--metrics ndcg_at_10`` (the key runs log and policies accept) was unknown."""
    from mlflow_rag_eval.keys import metric_key

    for typed in ("ndcg_at_10", "NDCG@10", "ndcg@10"):
        assert metric_key(resolve_metric(typed).key) == "ndcg_at_10"
    with pytest.raises(ValueError, match=r"unknown metric 'ndgc@10' \(did you mean 'ndcg@10'\?\); known: .*ndcg@<k>"):
        resolve_metric("ndgc@10")
