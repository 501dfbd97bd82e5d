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
from mlflow_rag_eval.records import DEFAULT_IGNORABLE, RecordError, is_blank, records_from_frame
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


#: Unicode 16's Default_Ignorable_Code_Point, as DerivedCoreProperties.txt lists it: written out
#: here, not read from the module, so that a range dropped or cut there fails.
UNICODE_DEFAULT_IGNORABLE = """
00AD; 034F; 061C; 115F..1160; 17B4..17B5; 180B..180D; 180E; 180F; 200B..200F; 202A..202E; 2060..2064; 2065;
2066..206F; 3164; FE00..FE0F; FEFF; FFA0; FFF0..FFF8; 1BCA0..1BCA3; 1D173..1D17A; E0000; E0001; E0002..E001F;
E0020..E007F; E0080..E00FF; E0100..E01EF; E01F0..E0FFF"""


def _code_points(listing: str) -> list[int]:
    out = []
    for item in listing.replace("\n", " ").split(";"):
        low, _, high = item.strip().partition("..")
        out += range(int(low, 16), int(high or low, 16) + 1)
    return out


def test_every_default_ignorable_code_point_is_blank_and_its_neighbours_are_not():
    points = _code_points(UNICODE_DEFAULT_IGNORABLE)
    assert len(points) == 4174
    assert sorted(points) == [c for low, high in DEFAULT_IGNORABLE for c in range(low, high + 1)]
    assert [hex(c) for c in points if not is_blank(chr(c))] == []
    # the marks, alone and in pairs, are no question
    for text in ("\u034f\u034f", "\ufe0f", "\U000e0100", "\u180b\u180c", "\u17b4\u17b5"):
        with pytest.raises(RecordError, match="column 'question': must not be empty"):
            records_from_frame(frame(text))
    # the letters and marks next to the ranges show something
    visible = [0x00AC, 0x034E, 0x0350, 0x17B3, 0x17B6, 0x180A, 0x2070, 0xFE10, 0xFFA1, 0xFFED, 0x1D172,
               0x1D17B]
    assert [hex(c) for c in visible if is_blank(chr(c))] == []
    assert not is_blank("e\u0301\u034f")  # a letter with ignorable marks is a letter


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
