"""The synthetic-corruption generator: each transformation on fixed sentences."""

import random

from mlflow_rag_eval.judges.local_model.corruptions import (
    CORRUPTIONS,
    answer_corruptions,
    clause_deletion,
    date_change,
    entity_swap,
    negation,
    number_change,
    other_passage,
    role_swap,
    synthetic_examples,
)

SENTENCE = "In 2019 Northwind Rail bought 12 trains from Alstom for the Hull line."


def rng():
    return random.Random(0)


def test_entity_swap_replaces_one_name_with_another_of_the_collection():
    out = entity_swap(SENTENCE, rng(), names=["Siemens", "Alstom"])
    assert out == SENTENCE.replace("Alstom", "Siemens") or out == SENTENCE.replace("Northwind Rail", "Siemens") \
        or out == SENTENCE.replace("Hull", "Siemens")
    assert out != SENTENCE and "Siemens" in out
    assert entity_swap("the trains were late again today.", rng(), names=["Siemens"]) is None  # no name
    assert entity_swap(SENTENCE, rng(), names=["Alstom", "Hull"]) is None  # nothing new to swap in


def test_number_change_changes_one_number_to_a_new_value():
    out = number_change("The company bought 12 trains.", rng())
    assert out is not None and out != "The company bought 12 trains."
    new = out.split()[3]
    assert new.isdigit() and new != "12" and int(new) > 0
    year = number_change("It opened in 1994.", rng())
    assert 1989 <= int(year.split()[-1].rstrip(".")) <= 1999 and "1994" not in year  # years move by 1-5
    assert number_change("No number here.", rng()) is None


def test_date_change_swaps_a_month_or_weekday_for_another_of_its_kind():
    out = date_change("Works start in March and end on a Friday.", rng())
    assert out != "Works start in March and end on a Friday."
    months = ["January", "February", "April", "May", "June", "July", "August", "September", "October",
              "November", "December"]
    assert ("Friday" in out and any(m in out for m in months)) or ("March" in out and "Friday" not in out)
    assert date_change("Works start soon.", rng()) is None


def test_negation_inserts_not_after_the_first_auxiliary():
    assert negation("The line was closed in 2004.", rng()) == "The line was not closed in 2004."
    assert negation("Bikes can travel free.", rng()) == "Bikes can not travel free."
    assert negation("The line is not open.", rng()) is None  # negated already, no other auxiliary
    assert negation("Trains run hourly.", rng()) is None


def test_role_swap_exchanges_two_names():
    out = role_swap("The final saw Leeds beat Hull after extra time.", rng())
    assert out == "The final saw Hull beat Leeds after extra time."
    assert role_swap("The final saw Leeds win.", rng()) is None


def test_other_passage_takes_a_sentence_from_the_pool():
    assert other_passage("A.", rng(), pool=["B is here.", "A."]) == "B is here."
    assert other_passage("A.", rng(), pool=[]) is None


def test_clause_deletion_keeps_a_supported_shorter_sentence():
    out = clause_deletion("The depot opened in 1994, which doubled capacity, and it still runs today.", rng())
    assert out in ("The depot opened in 1994, and it still runs today.",
                   "The depot opened in 1994, which doubled capacity.")
    assert clause_deletion("The depot opened in 1994.", rng()) is None


def test_synthetic_examples_are_labelled_deterministic_and_never_unchanged():
    passages = [
        "Northwind Rail was founded in 1994 by three councils. Its head office is in Hull, which is on the coast.",
        "In March the company ordered 12 trains from Alstom. The trains were delivered on a Friday in Leeds.",
    ]
    a = synthetic_examples(passages, seed=3, per_passage=2)
    assert a == synthetic_examples(passages, seed=3, per_passage=2)
    kinds = {e.kind for e in a}
    assert {"sentence", "negation", "number_change", "other_passage"} <= kinds
    assert kinds <= {"sentence", "clause_deletion", *CORRUPTIONS}
    originals = {e.claim for e in a if e.kind == "sentence"}
    for e in a:
        assert e.label == (1 if e.kind in ("sentence", "clause_deletion") else 0)
        if e.label == 0:
            assert e.claim not in originals or e.kind == "other_passage"
            assert e.claim not in e.passage  # a corrupted claim is never the passage's own text


def test_answer_corruptions_change_one_fact_of_a_faithful_answer_against_its_own_context():
    context = ("Northwind Rail ordered 12 trains from Alstom in March. Siemens had offered a cheaper bid. "
               "The trains run between Hull and Leeds.")
    answer = "In March, Northwind Rail has bought 12 trains from Alstom."  # a paraphrase, not a copy
    out = answer_corruptions([(answer, context)], seed=0)
    assert out == answer_corruptions([(answer, context)], seed=0)
    by_kind = {e.kind: e for e in out}
    assert set(by_kind) == {"entity_swap", "number_change", "date_change", "negation", "role_swap"}
    assert all(e.label == 0 and e.passage == context and e.claim != answer for e in out)
    swapped = by_kind["entity_swap"].claim  # a name of the context the answer does not use
    assert any(swapped == answer.replace(old, new) for old in ("Northwind Rail", "Alstom", "March")
               for new in ("Siemens", "Hull", "Leeds"))
    assert by_kind["date_change"].claim.startswith("In ") and "March" not in by_kind["date_change"].claim
    assert "12" not in by_kind["number_change"].claim
    assert by_kind["negation"].claim == "In March, Northwind Rail has not bought 12 trains from Alstom."
    assert by_kind["role_swap"].claim == "In March, Alstom has bought 12 trains from Northwind Rail."
    # a sentence no corruption applies to yields nothing (never an unchanged claim labelled 0)
    assert answer_corruptions([("the weather turned fine", context)]) == []
