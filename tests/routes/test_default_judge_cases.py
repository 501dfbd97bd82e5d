"""What a new user meets first: the default (embedded) judge through mlflow.evaluate, on facts
stated in the negative, abstentions and short references."""

from __future__ import annotations

import mlflow
import pandas as pd
import pytest

LUMEN = "The Lumen X2 costs 49 euros. The price includes VAT."
WARRANTY = ("The Lumen X2 comes with a warranty of two years. The warranty covers manufacturing defects. "
            "Water damage is not covered by the warranty.")

ROWS = [
    # (name, question, answer, context, reference)
    ("negative clause", "How much is the Lumen X2?",
     "The Lumen X2 costs 99 euros and the price does not include VAT.", LUMEN, "The Lumen X2 costs 49 euros."),
    ("no clause", "How much is the Lumen X2?", "The Lumen X2 costs 99 euros.", LUMEN, "The Lumen X2 costs 49 euros."),
    ("negative reference", "Does the warranty cover water damage?",
     "The warranty does not cover water damage.", WARRANTY, "No, the warranty does not cover water damage."),
    ("price phrase", "How much is the Lumen X2?", "The Lumen X2 costs 49 euros.", LUMEN, "49 euros."),
    ("years phrase", "How long is the warranty?", "The Lumen X2 comes with a two-year warranty.", WARRANTY,
     "Two years."),
    ("wrong price phrase", "How much is the Lumen X2?", "The Lumen X2 costs 99 euros.", LUMEN, "€49"),
    ("abstains", "How much is the Lumen X2?", "The documents do not say how much it costs.", WARRANTY,
     "49 euros."),
    ("yes phrase", "Is VAT included?", "Yes, the price includes VAT.", LUMEN, "Yes."),
]


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("default_judge")
    # set_experiment exports MLFLOW_EXPERIMENT_ID: the later tests (and their subprocesses) get
    # the environment and tracking URI back as they were
    with pytest.MonkeyPatch.context() as env:
        env.setenv("MLFLOW_EXPERIMENT_ID", "")
        env.delenv("MLFLOW_EXPERIMENT_ID")
        previous = mlflow.get_tracking_uri()
        try:
            yield _evaluate(tmp)
        finally:
            mlflow.set_tracking_uri(previous)


def _evaluate(tmp):
    mlflow.set_tracking_uri(f"sqlite:///{tmp / 'mlflow.db'}")
    mlflow.set_experiment("default-judge")
    frame = pd.DataFrame({
        "question": [r[1] for r in ROWS], "answer": [r[2] for r in ROWS],
        "contexts": [[{"id": f"d{k}", "text": r[3]}] for k, r in enumerate(ROWS)],
        "reference": [r[4] for r in ROWS],
    })
    with mlflow.start_run():
        result = mlflow.models.evaluate(data=frame, model_type="rag", evaluators="rag")
    out = result.tables["eval_results_table"]
    out.index = [r[0] for r in ROWS]
    return out


def test_a_fact_behind_a_negative_clause_is_still_checked(table):
    row = table.loc["negative clause"]
    assert row["faithfulness/score"] == 0.0, row["faithfulness/justification"]
    assert "makes no claims" not in row["faithfulness/justification"]
    assert row["false_abstention/score"] == 0.0
    assert table.loc["no clause", "faithfulness/score"] == 0.0


def test_a_negative_reference_states_a_fact(table):
    row = table.loc["negative reference"]
    for metric in ("context_recall", "answer_correctness"):
        assert not pd.isna(row[f"{metric}/score"]), row[f"{metric}/justification"]
        assert "makes no claims" not in str(row[f"{metric}/justification"])
    assert row["context_recall/score"] == 1.0, row["context_recall/justification"]


def test_an_abstention_is_still_recognised_and_said_once(table):
    row = table.loc["abstains"]
    assert row["false_abstention/score"] == 1.0
    assert row["faithfulness/justification"] == "the answer makes no claims"
    why = row["false_abstention/justification"]
    assert why.startswith("abstains: ") and why.count("abstains") == 1, why


@pytest.mark.parametrize("name, correct", [("price phrase", 1.0), ("years phrase", 1.0),
                                           ("wrong price phrase", 0.0), ("yes phrase", 1.0)])
def test_a_short_reference_is_read_as_the_answer(table, name, correct):
    row = table.loc[name]
    assert row["answer_correctness/score"] == correct, row["answer_correctness/justification"]
    assert "short reference" in row["answer_correctness/justification"]


def test_context_recall_finds_a_short_reference_in_the_contexts(table):
    assert table.loc["price phrase", "context_recall/score"] == 1.0
    assert table.loc["years phrase", "context_recall/score"] == 1.0
    assert table.loc["abstains", "context_recall/score"] == 0.0  # the warranty page has no price
    assert pd.isna(table.loc["yes phrase", "context_recall/score"])
