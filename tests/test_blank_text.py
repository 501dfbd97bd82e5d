"""Text that shows nothing is empty on every route: zero-width characters, the BOM, control
characters and whitespace do not make a question, an answer or a passage (issue 38)."""

from __future__ import annotations

import mlflow
import pandas as pd
import pytest
from click.testing import CliRunner
from mlflow.exceptions import MlflowException

from mlflow_rag_eval.cli import main
from mlflow_rag_eval.evaluation.engine import evaluate_records
from mlflow_rag_eval.records import RecordError, is_blank, records_from_frame
from mlflow_rag_eval.routes.extra_metrics import rag_metrics
from mlflow_rag_eval.routes.scorers import rag_scorers

INVISIBLE = ["\u200b", "\ufeff", "\u200b\ufeff \u2060\u200d", "\x00\x07\x1f", "\u3000\n\t\u00a0", "\u00ad\u180e",
             "\u202e\u2066", "\u3164\u2800"]


def frame(question: str, contexts=("\u200b", "\ufeff"), answer: str = "A bike ticket costs 5 euros.") -> pd.DataFrame:
    return pd.DataFrame({"question": [question], "answer": [answer], "contexts": [list(contexts)]})


@pytest.mark.parametrize("text", INVISIBLE, ids=[repr(t) for t in INVISIBLE])
def test_invisible_text_is_blank_and_is_no_question(text):
    assert is_blank(text)
    with pytest.raises(RecordError, match="column 'question': must not be empty"):
        records_from_frame(frame(text))


def test_visible_text_is_kept_as_written():
    assert not any(is_blank(t) for t in ("a", "\u200bx", "5", "\u00e9", "\u4e2d", "\U0001f600"))
    (record,) = records_from_frame(frame("\ufeffHow much?", contexts=["\u200bBikes cost 5 euros."]))
    assert (record.question, record.context_texts) == ("\ufeffHow much?", ["\u200bBikes cost 5 euros."])


def test_blank_passages_and_answers_count_as_nothing(local_judge):
    """The issue's row with a real question: its passages hold nothing, so nothing is relevant
    or useful, and a blank answer is no answer."""
    (record,) = records_from_frame(frame("How much is a bike ticket?", answer="\u200b\ufeff"))
    assert record.answer == "" and record.context_texts == ["", ""]
    result = evaluate_records([record], ["context_relevance", "context_precision", "answer_relevancy"], local_judge)
    assert {m.name: m.rows[0].value for m in result.metrics} == {
        "context_relevance": 0.0, "context_precision": 0.0, "answer_relevancy": 0.0}


def test_every_route_refuses_an_invisible_question(tracking_uri, tmp_path, local_judge):
    bad = frame("\u200b")
    with pytest.raises(RecordError, match="column 'question'"):
        mlflow.models.evaluate(data=bad, model_type="rag", evaluators="rag",
                               evaluator_config={"judge": local_judge, "metrics": ["context_relevance"]})
    with pytest.raises(MlflowException, match="column 'question': must not be empty"):  # MLflow wraps it
        mlflow.models.evaluate(data=bad, model_type=None, predictions="answer",
                               extra_metrics=rag_metrics(["context_relevance"], local_judge))
    rows = [{"inputs": {"question": "\u200b"}, "outputs": {"answer": "x", "contexts": ["\ufeff"]}}]
    with pytest.raises(RecordError, match="row 0, column 'question'"):
        rag_scorers(["context_relevance"], local_judge, data=rows)
    runs_before = len(mlflow.search_runs())  # mlflow.evaluate opened a run before our check refused the data
    path = tmp_path / "rows.jsonl"
    bad.to_json(path, orient="records", lines=True)
    result = CliRunner().invoke(main, ["evaluate", "--data", str(path), "--metrics", "context_relevance"])
    assert result.exit_code == 2 and "row 0, column 'question': must not be empty" in result.output, result.output
    assert len(mlflow.search_runs()) == runs_before  # the CLI checks the data before it opens a run
