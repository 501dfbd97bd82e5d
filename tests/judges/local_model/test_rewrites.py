"""The cross-encoder's paired training data: faithful rewrites and one-word edits of a sentence."""

from __future__ import annotations

import random

import pytest

from mlflow_rag_eval.judges.local_model.rewrites import (
    EDITS,
    REWRITES,
    question_answer_pairs,
    rewrite_edit_pairs,
)


@pytest.mark.parametrize("kind, sentence, expected", [
    ("front_phrase", "Revenue rose 12% in the third quarter.", "In the third quarter, revenue rose 12%."),
    ("passive", "The committee accepted the proposal at its last meeting.",
     "The proposal was accepted by the committee at its last meeting."),
    ("reformat_date", "The shop reopens on 4 May.", {"The shop reopens on May 4.", "The shop reopens on May 4th."}),
    ("reorder_list", "The firm has offices in Frankfurt, Dublin and Toronto.", None),
])
def test_faithful_rewrites_say_the_same_in_other_words(kind, sentence, expected):
    out = REWRITES[kind](sentence, random.Random(0))
    assert out and out != sentence
    if isinstance(expected, str):  # the encoder is uncased: a capital that stays is no change
        assert out.lower() == expected.lower()
    elif expected:
        assert out in expected
    if kind == "reorder_list":  # the same names, another order
        assert sorted(out.replace(",", "").strip(".").split()) == sorted(sentence.replace(",", "").strip(".").split())


@pytest.mark.parametrize("kind, sentence, expected", [
    ("antonym", "Revenue rose 12% in the third quarter.", "Revenue fell 12% in the third quarter."),
    ("negation", "Pets are allowed in the rooms.", "Pets are not allowed in the rooms."),
    ("negation", "The hostel does not serve breakfast.", "The hostel does serve breakfast."),
    ("from_to", "The ferry sails from Calais to Dover.", "The ferry sails from Dover to Calais."),
    ("stronger", "Some employees work from home.", "All employees work from home."),
    ("stronger", "The council may raise fees.", "The council will raise fees."),
    ("unit", "The trail is 12 km long.", None),
    ("comparison_swap", "Berlin is larger than Munich.", "Munich is larger than Berlin."),
])
def test_one_word_edits_change_what_is_said(kind, sentence, expected):
    out = EDITS[kind](sentence, random.Random(0))
    assert out and out != sentence
    if expected:
        assert out == expected
    assert abs(len(out.split()) - len(sentence.split())) <= 1


def test_edits_that_do_not_apply_return_none():
    rng = random.Random(0)
    assert EDITS["from_to"]("The cat sat on the mat.", rng) is None
    assert EDITS["unit"]("The cat sat on the mat.", rng) is None
    # "a few" is not "few"; "about" before no number is no hedge; the month May is not "may"
    assert EDITS["stronger"]("A few people came about the job in May.", rng) is None
    # names that are only items of one list say the same in any order: no role swap
    assert EDITS["role_swap"]("The editors were Paul Williams and Jann Wenner.", rng) is None


def test_nothing_that_reverses_entailment_is_shortened_or_swapped_for_a_synonym():
    rng = random.Random(0)
    # "did not buy a car" does not entail "did not buy a vehicle"... the other way round it would
    assert REWRITES["synonym_swap"]("The man did not buy a car.", rng) is None
    assert REWRITES["shorten"]("No student passed the exam in May.", rng) is None


def test_pairs_are_deterministic_and_each_holds_a_rewrite_and_an_edit():
    passages = [["The bridge was opened to traffic in May after two years of work.",
                 "Revenue rose 12% in the third quarter.", "Pets are allowed in the hotel rooms."],
                ["The meeting is on Tuesday in Berlin."]]
    first, second = rewrite_edit_pairs(passages, seed=1), rewrite_edit_pairs(passages, seed=1)
    assert first == second and first
    for pair in first:
        assert pair.edit != pair.premise and pair.edit_kind in EDITS
        assert pair.rewrite_kind in REWRITES or pair.rewrite_kind == "same_sentence"
        assert pair.rewrite in pair.premise or pair.rewrite_kind != "same_sentence"


def test_question_answer_pairs_read_a_sentence_as_a_question_and_its_short_answer():
    (pair,) = question_answer_pairs([["The bridge opened in May."]], lambda w: w in {"open"}, seed=0)
    assert pair.premise in ("When did the bridge open? In May.", "When did the bridge open? May.")
    assert pair.rewrite == "The bridge opened in May." and pair.edit != pair.rewrite
    (pair,) = question_answer_pairs([["The meeting is on Tuesday."]], lambda w: False, seed=0)
    assert pair.premise.startswith("When is the meeting? ")
