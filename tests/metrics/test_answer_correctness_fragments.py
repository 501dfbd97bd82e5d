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


@pytest.fixture(scope="module")
def rows(local_judge):
    assert len(CASES) >= 16 and all(is_fragment(c["reference"]) for c in CASES)
    records = [RagRecord(question=c["question"], answer=c[key], contexts=(Context(c["reference"]),),
                         reference=c["reference"]) for c in CASES for key in ("answer", "edited")]
    (metric,) = evaluate_records(records, ["answer_correctness"], local_judge).metrics
    return metric.rows


def test_a_full_sentence_answer_matches_a_fragment_reference(rows):
    scores = [row.value for row in rows[0::2]]
    assert all(row.error is None for row in rows)
    passed = [c["answer"] for c, s in zip(CASES, scores) if s < 0.5]
    assert not passed, passed
    assert all("read with its question" in row.justification for row in rows[0::2])


@pytest.mark.xfail(strict=True, reason="issue 43: the support model alone lets most one-word edits through; the "
                   "cross-encoder veto that fails them waits for the support model rebuilt over the shipped "
                   "cross-encoder")
def test_one_changed_word_fails_against_a_fragment_reference(rows):
    scores = [row.value for row in rows[1::2]]
    let_through = [c["edited"] for c, s in zip(CASES, scores) if s >= 0.5]
    assert not let_through, let_through
