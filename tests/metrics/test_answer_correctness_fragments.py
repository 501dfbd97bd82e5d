"""answer_correctness on references that are fragments ("Frankfurt, Dublin and Toronto."), read
with their question, and on the same answers with one changed word, with the default judge."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT

from mlflow_rag_eval.evaluation.engine import evaluate_records
from mlflow_rag_eval.metrics.phrase_reference import is_fragment, with_question
from mlflow_rag_eval.records import Context, RagRecord

CASES = [json.loads(line) for line in (ROOT / "bench" / "data" / "fragment_references.jsonl").read_text().splitlines()
         if line.strip()]


def test_fragments_are_told_from_statements_and_read_with_their_question():
    assert is_fragment("Every weekday except Monday.") and is_fragment("Lisbon, Porto and Faro.")
    assert not is_fragment("The office is open every weekday.")  # a statement of its own
    assert not is_fragment("49 euros.")  # a phrase: matched term by term
    assert not is_fragment("Frankfurt, Dublin and Toronto. Also Paris.")  # two sentences
    assert with_question("When is the office open", "Every weekday except Monday.") == (
        "When is the office open? Every weekday except Monday.")


VETO = "local:minilm-l6?entailment_threshold=0.705"
#: per judge: (correct answers allowed to fail, edits that must fail): what each reaches today
REACHED = {"local:minilm-l6": (0, 5), VETO: (2, 11)}


@pytest.fixture(scope="module", params=sorted(REACHED))
def judge_name(request):
    return request.param


@pytest.fixture(scope="module")
def rows(judge_name):
    from mlflow_rag_eval.judges import get_judge

    assert len(CASES) >= 16 and all(is_fragment(c["reference"]) for c in CASES)
    records = [RagRecord(question=c["question"], answer=c[key], contexts=(Context(c["reference"]),),
                         reference=c["reference"]) for c in CASES for key in ("answer", "edited")]
    (metric,) = evaluate_records(records, ["answer_correctness"], get_judge(judge_name), progress=False).metrics
    return metric.rows


def test_a_full_sentence_answer_matches_a_fragment_reference(rows, judge_name):
    """16 of 16 with the default judge; 14 with the veto: the cross-encoder does not read
    "rose 8%" in "Up 8% on the previous quarter.", nor the office's opening days."""
    scores = [row.value for row in rows[0::2]]
    assert all(row.error is None for row in rows)
    missed = [c["answer"] for c, s in zip(CASES, scores) if s < 0.5]
    assert len(missed) <= REACHED[judge_name][0], missed
    assert all("read with its question" in row.justification for row in rows[0::2])
    covered = [row for row, c in zip(rows[0::2], CASES) if c["answer"] not in missed]
    assert all(row.details["reference_claims"][0]["value"] for row in covered)


def test_one_changed_word_fails_against_a_fragment_reference(rows, judge_name):
    """With the veto at the cross-encoder's balanced threshold 11 (the edits still let through:
    an antonym, a sibling term, a name, a place and from/to); the default judge, whose veto is
    only where the cross-encoder is confident, 5 (before it had one, 1)."""
    scores = [row.value for row in rows[1::2]]
    caught = [c["edited"] for c, s in zip(CASES, scores) if s < 0.5]
    assert len(caught) >= REACHED[judge_name][1], caught


@pytest.mark.xfail(strict=True, reason="issue 43: 13 of 18 one-word edits pass the default judge against a "
                   "fragment reference, 7 of 18 pass the veto at 0.705, and that veto fails two correct answers")
def test_the_issues_target_every_answer_right_and_every_edit_failed(rows):
    assert all(row.value >= 0.5 for row in rows[0::2]) and all(row.value < 0.5 for row in rows[1::2])
