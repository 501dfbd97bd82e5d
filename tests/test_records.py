"""Bad input stops the evaluation before any judge call, naming the row and the column, with
nothing half-logged to the run."""

from __future__ import annotations

import math

import mlflow
import pandas as pd
import pytest

from mlflow_rag_eval.records import (
    ColumnMapping,
    Context,
    RecordError,
    dataset_digest,
    predictions_to_frame,
    records_from_frame,
)


def good_frame() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "question": ["How much is a bike ticket?", "Can dogs travel?"],
            "answer": ["A bike ticket costs 5 euros.", "Dogs travel free."],
            "contexts": [
                [{"id": "p1", "text": "Bikes cost 5 euros."}, {"id": "p2", "text": "Dogs are free."}],
                [{"id": "p2", "text": "Dogs are free."}],
            ],
            "reference": ["5 euros.", "Yes, for free."],
            "relevant_ids": [{"p1": 2}, ["p2"]],
        }
    )


def test_good_frame_becomes_records():
    records = records_from_frame(good_frame())
    assert records[0].contexts == (Context("Bikes cost 5 euros.", "p1"), Context("Dogs are free.", "p2"))
    assert records[0].relevant_ids == {"p1": 2.0}
    assert records[1].relevant_ids == {"p2": 1.0}  # a list of ids means grade 1 each
    assert records[1].answerable is True


def test_string_contexts_with_separate_int_ids_and_column_mapping():
    df = pd.DataFrame(
        {"query": ["q?"], "response": ["a."], "docs": [["t1", "t2"]], "doc_ids": [[7, 8]]}
    )
    mapping = ColumnMapping.from_config(
        {"question": "query", "answer": "response", "contexts": "docs", "context_ids": "doc_ids"}
    )
    (record,) = records_from_frame(df, mapping)
    assert record.context_ids == ["7", "8"]  # ints are normalised to strings
    assert record.context_texts == ["t1", "t2"]


def test_unknown_mapping_key_is_refused():
    with pytest.raises(ValueError, match="unknown column mapping key"):
        ColumnMapping.from_config({"questions": "q"})


@pytest.mark.parametrize(
    "output",
    [
        [{"answer": "a", "contexts": ["c"]}, {"answer": "b", "contexts": []}],
        {"answer": ["a", "b"], "contexts": [["c"], []]},
        pd.DataFrame({"answer": ["a", "b"], "contexts": [["c"], []]}),
    ],
    ids=["list-of-dicts", "dict-of-columns", "dataframe"],
)
def test_model_output_shapes(output):
    frame = predictions_to_frame(output, 2)
    assert list(frame["answer"]) == ["a", "b"]
    assert list(frame["contexts"]) == [["c"], []]


def test_model_output_row_count_must_match():
    with pytest.raises(RecordError, match="returned 1 rows for 2 inputs"):
        predictions_to_frame([{"answer": "a", "contexts": []}], 2)


def test_digest_ignores_answers_and_contexts_but_not_expectations():
    a = records_from_frame(good_frame())
    changed_answer = good_frame().assign(answer=["other", "answers"], contexts=[[], []])
    changed_reference = good_frame().assign(reference=["6 euros.", "Yes, for free."])
    assert dataset_digest(a) == dataset_digest(records_from_frame(changed_answer))
    assert dataset_digest(a) != dataset_digest(records_from_frame(changed_reference))


def _break(df: pd.DataFrame, column: str, row: int, value) -> pd.DataFrame:
    df = df.copy()
    df[column] = df[column].astype(object)
    df.at[row, column] = value
    return df


BAD_INPUTS = {
    "missing-column": (lambda: good_frame().drop(columns=["contexts"]), None, "contexts", "required column is missing"),
    "wrong-type": (lambda: _break(good_frame(), "answer", 1, 42), 1, "answer", "must be a string"),
    "empty-question": (lambda: _break(good_frame(), "question", 1, "   "), 1, "question", "must not be empty"),
    "nan-cell": (lambda: _break(good_frame(), "answer", 1, math.nan), 1, "answer", "missing value"),
    "contexts-not-a-list": (lambda: _break(good_frame(), "contexts", 1, "Dogs are free."), 1, "contexts", "must be a list"),
    "context-id-not-str-or-int": (
        lambda: _break(good_frame(), "contexts", 1, [{"id": 2.5, "text": "Dogs are free."}]),
        1, "contexts", "ids must be strings or ints",
    ),
    "relevant-id-not-str-or-int": (
        lambda: _break(good_frame(), "relevant_ids", 0, [None]), 0, "relevant_ids", "ids must be strings or ints",
    ),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_names_row_and_column_and_logs_nothing(case, tracking_uri):
    make, row, column, message = BAD_INPUTS[case]
    with mlflow.start_run() as run:
        with pytest.raises(RecordError) as excinfo:
            mlflow.models.evaluate(data=make(), model_type="rag", evaluators="rag")
    err = excinfo.value
    assert (err.row, err.column) == (row, column)
    assert message in str(err)
    assert f"column {column!r}" in str(err)
    if row is not None:
        assert f"row {row}," in str(err)
    client = mlflow.MlflowClient()
    data = client.get_run(run.info.run_id).data
    assert data.metrics == {}
    assert not [k for k in data.params if k.startswith("rag_eval")]
    assert client.list_artifacts(run.info.run_id) == []


GRADED_FORMS = {
    "dict": ({"p1": 2, "p2": 1}, None),
    "id-grade-dicts": ([{"id": "p1", "grade": 2}, {"id": "p2", "grade": 1}], None),
    "pairs": ([["p1", 2], ["p2", 1]], None),
    "json-dict": ('{"p1": 2, "p2": 1}', None),
    "json-id-grade-dicts": ('[{"id": "p1", "grade": 2}, {"id": "p2", "grade": 1}]', None),
    "parallel-lists": (["p1", "p2"], [2, 1]),
}


@pytest.mark.parametrize("form", list(GRADED_FORMS))
def test_every_graded_relevance_form_reads_the_same_and_digests_the_same(form):
    value, grades = GRADED_FORMS[form]
    frame = good_frame().iloc[:1].assign(relevant_ids=[value])
    if grades is not None:
        frame["relevance_grades"] = [grades]
    (record,) = records_from_frame(frame)
    assert record.relevant_ids == {"p1": 2.0, "p2": 1.0}
    reference = records_from_frame(good_frame().iloc[:1].assign(relevant_ids=[{"p1": 2, "p2": 1}]))
    assert dataset_digest([record]) == dataset_digest(reference)


@pytest.mark.parametrize("value,grades,message", [
    (["p1", "p1"], None, None),  # the same id twice with one grade: harmless, read once
    ([["p1", 2], ["p1", 1]], None, "listed twice, with grades 2 and 1"),
    (["p1"], [1, 2], "1 relevant ids but 2 grades"),
    ([{"id": "p1"}], None, "exactly the keys 'id' and 'grade'"),
    ([["p1", 2, 3]], None, "an [id, grade] pair"),
    ('{"p1": ', None, "look like JSON but do not parse"),
    ({"p1": 2}, [1], "grades are given twice"),
    ([["p1", 2]], [1], "grades are given twice"),
    ([{"id": "p1", "grade": "high"}], None, "must be a number"),
])
def test_malformed_graded_relevance_is_refused_naming_the_row(value, grades, message):
    frame = good_frame().assign(relevant_ids=[["p9"], value])
    if grades is not None:
        frame["relevance_grades"] = [None, grades]
    if message is None:
        assert records_from_frame(frame)[1].relevant_ids == {"p1": 1.0}
        return
    with pytest.raises(RecordError, match=message.replace("[", r"\[")) as excinfo:
        records_from_frame(frame)
    assert excinfo.value.row == 1


def test_a_large_frame_of_dict_grades_is_warned_about(tracking_uri, monkeypatch):
    from mlflow_rag_eval.routes import evaluator as mlflow_evaluator

    monkeypatch.setattr(mlflow_evaluator, "DICT_GRADES_WARN_ROWS", 3)  # the frame, not the threshold, is tested
    frame = pd.concat([good_frame()] * 2, ignore_index=True)
    with mlflow.start_run(), pytest.warns(UserWarning, match=r"\{id: grade\} dicts.*linear time"):
        mlflow.models.evaluate(data=frame, model_type="rag", evaluators="rag", evaluator_config={"metrics": ["hit@5"]})
    frame["relevant_ids"] = [[{"id": "p1", "grade": 2}], ["p2"]] * 2
    with mlflow.start_run():
        import warnings

        with warnings.catch_warnings():
            warnings.filterwarnings("error", message=".*id: grade.*")
            mlflow.models.evaluate(data=frame, model_type="rag", evaluators="rag",
                                   evaluator_config={"metrics": ["hit@5"]})
