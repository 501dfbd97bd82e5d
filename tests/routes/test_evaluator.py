"""mlflow.evaluate(model_type="rag") end to end, in a temporary sqlite store."""

from __future__ import annotations

import json

import mlflow
import pandas as pd
import pytest
from conftest import figures_of
from mlflow.models.evaluation.base import resolve_evaluators_and_configs

from mlflow_rag_eval.evaluation.engine import evaluate_records
from mlflow_rag_eval.judges import JudgeFailure
from mlflow_rag_eval.judges.local_model.embedding import model_files_sha256
from mlflow_rag_eval.judges.providers.local import LocalJudge
from mlflow_rag_eval.records import records_from_frame
from mlflow_rag_eval.routes.evaluator import RagEvaluator

REQUIRED_METRICS = (
    "faithfulness/mean",
    "answer_relevancy/mean",
    "context_recall/mean",
    "context_relevance/mean",
    "hit_at_5/mean",
    "mrr/mean",
    "ndcg_at_10/mean",
)


@pytest.fixture(scope="module")
def golden():
    from pipeline import load_golden

    df = load_golden()
    # A slice with answerable and unanswerable questions keeps the test quick.
    picked = pd.concat([df[df.answerable].head(10), df[~df.answerable].head(3)])
    return picked[["question", "reference", "relevant_ids", "answerable"]].reset_index(drop=True)


def static_frame() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "question": ["How much does a bike ticket cost?", "Can I bring my cat?"],
            "answer": ["A bike ticket costs 5 euros. Bikes ride free on Sundays.", "I don't know."],
            "contexts": [
                [
                    {"id": "p1", "text": "Bikes travel for a flat fare of 5 euros per journey."},
                    {"id": "p2", "text": "Dogs travel free on all trains."},
                ],
                [{"id": "p2", "text": "Dogs travel free on all trains."}],
            ],
            "reference": ["A bike ticket costs 5 euros.", "Cats travel free in a closed carrier."],
            "relevant_ids": [{"p1": 2}, {"p9": 1}],
        }
    )


def _artifact_json(run_id: str, path: str) -> dict:
    local = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=path)
    with open(local) as f:
        return json.load(f)


def test_logged_pyfunc_pipeline_end_to_end(tracking_uri, golden):
    from pipeline import log_pipeline

    with mlflow.start_run() as run:
        info = log_pipeline(k=3)
        result = mlflow.models.evaluate(
            model=info.model_uri, data=golden, model_type="rag", evaluators="rag"
        )
    run_id = run.info.run_id
    client = mlflow.MlflowClient()
    logged = client.get_run(run_id).data

    for key in REQUIRED_METRICS:
        assert key in result.metrics and key in logged.metrics
        assert 0.0 <= logged.metrics[key] <= 1.0
        assert logged.metrics[key] == pytest.approx(result.metrics[key])
    # Unanswerable rows have no relevant ids: skipped by retrieval metrics, not scored as 0.
    figures = figures_of(run_id)  # the counts are the rows table's
    assert figures["hit_at_5/n_scored"] == 10
    assert figures["faithfulness/n_scored"] == 13
    assert figures["faithfulness/n_error"] == 0

    assert logged.params["rag_eval.judge"] == "local:minilm-l6"
    fingerprint = logged.params["rag_eval.judge_fingerprint"]
    assert len(fingerprint) == 16 and logged.tags["rag_eval.judge_fingerprint"] == fingerprint

    table = _artifact_json(run_id, "eval_results_table.json")
    assert len(table["data"]) == len(golden)
    for key in ("faithfulness", "context_recall", "ndcg_at_10"):
        assert f"{key}/score" in table["columns"] and f"{key}/justification" in table["columns"]
    assert result.tables["eval_results_table"].shape[0] == len(golden)

    lineage = _artifact_json(run_id, "rag_eval/judge_lineage.json")
    assert lineage["judge"]["name"] == "local:minilm-l6"
    assert lineage["judge"]["fingerprint"] == fingerprint
    assert lineage["judge"]["model_files_sha256"] == model_files_sha256(lineage["judge"]["model"])
    assert {m["name"] for m in lineage["metrics"]} >= {"faithfulness", "ndcg@10", "mrr"}
    assert lineage["dataset"]["n_rows"] == len(golden)

    worst = _artifact_json(run_id, "rag_eval/worst_rows.json")
    assert set(worst["metrics"]) >= {"faithfulness", "ndcg_at_10"}
    assert all(w["justification"] for w in worst["metrics"]["faithfulness"]["worst"])
    report = mlflow.artifacts.load_text(f"runs:/{run_id}/rag_eval/report.html")
    assert 'id="quadrant"' in report and "<script" not in report

    # MLflow's input for the bare frame, and the golden set under the digest every route logs
    inputs = client.get_run(run_id).inputs.dataset_inputs
    digest = client.get_run(run_id).data.params["rag_eval.dataset_digest"]
    assert sorted(d.dataset.name for d in inputs) == ["dataset", f"golden-{digest[:8]}"]


def test_static_predictions_log_what_the_engine_computes(tracking_uri, local_judge):
    df = static_frame()
    with mlflow.start_run() as run:
        result = mlflow.models.evaluate(
            data=df, model_type="rag", evaluators="rag", evaluator_config={"judge": local_judge}
        )
    computed = evaluate_records(records_from_frame(df), judge=local_judge)
    expected = computed.run_metrics()  # the means and CI bounds
    logged = mlflow.MlflowClient().get_run(run.info.run_id).data.metrics
    assert logged == pytest.approx(expected)
    assert result.metrics == pytest.approx(expected)
    assert figures_of(run.info.run_id) == pytest.approx(computed.aggregates())  # the rest: the rows table's
    # Hand-checkable rows: the second sentence of answer 1 has no support, answer 2 abstains.
    assert logged["faithfulness/mean"] == pytest.approx((1 / 2 + 1.0) / 2)
    table = result.tables["eval_results_table"]
    assert table["answer_relevancy/score"][1] == 0.0  # the abstention is noncommittal: 0
    assert table["answer_relevancy/justification"][1].startswith("noncommittal answer")
    assert logged["hit_at_5/mean"] == 0.5 and logged["mrr/mean"] == 0.5


def test_reading_the_results_tables_warns_of_nothing(tracking_uri, local_judge, caplog):
    """MLflow's own ``tables`` tries every artifact as a table, and the judge lineage (a JSON
    document) made it log "Not all runs have the specified table artifact"."""
    with mlflow.start_run():
        result = mlflow.models.evaluate(data=static_frame(), model_type="rag", evaluators="rag",
                                        evaluator_config={"judge": local_judge, "metrics": ["mrr"]})
    caplog.clear()
    with caplog.at_level("WARNING"):
        tables = result.tables
    assert list(tables) == ["eval_results_table"] and len(tables["eval_results_table"]) == len(static_frame())
    assert mlflow.MlflowClient().list_artifacts(result.run_id, "rag_eval")  # the lineage is on the run
    assert not [r for r in caplog.records if "table artifact" in r.getMessage()], caplog.text


def test_static_predictions_named_with_the_predictions_argument(tracking_uri, local_judge):
    df = static_frame().rename(columns={"answer": "response"})
    with mlflow.start_run():
        result = mlflow.models.evaluate(
            data=df,
            predictions="response",
            model_type="rag",
            evaluators="rag",
            evaluator_config={"judge": local_judge, "metrics": ["faithfulness", "ndcg@10"]},
        )
    assert set(k.split("/")[0] for k in result.metrics) == {"faithfulness", "ndcg_at_10"}
    assert result.metrics["faithfulness/mean"] == pytest.approx(0.75)


def test_named_metric_the_data_cannot_feed_is_refused_before_judging(tracking_uri):
    df = static_frame().drop(columns=["reference"])
    with mlflow.start_run():
        with pytest.raises(ValueError, match="column 'reference'.*context_recall"):
            mlflow.models.evaluate(
                data=df, model_type="rag", evaluators="rag",
                evaluator_config={"metrics": ["context_recall"]},
            )


def test_default_suite_leaves_out_what_the_data_cannot_feed(tracking_uri, local_judge):
    df = static_frame().drop(columns=["reference", "relevant_ids"])
    with mlflow.start_run():
        result = mlflow.models.evaluate(
            data=df, model_type="rag", evaluators="rag", evaluator_config={"judge": local_judge}
        )
    # No reference, no relevant ids, no answerable column, no answer citing a context.
    assert {k.split("/")[0] for k in result.metrics} == {
        "faithfulness", "answer_relevancy", "context_relevance", "context_precision", "false_abstention"
    }


class _FlakyJudge(LocalJudge):
    """The local judge, except verification fails for rows whose claims mention 'cat'."""

    def verify(self, items):
        real = super().verify(items)
        return [
            JudgeFailure("ParseError", "reply was not valid JSON")
            if any("cat" in c.lower() for c in item.claims) else outcome
            for item, outcome in zip(items, real)
        ]


def test_a_failed_row_is_a_named_error_never_a_score(tracking_uri):
    df = static_frame()
    df.loc[1, "answer"] = "Cats travel in a carrier."
    with mlflow.start_run() as run:
        result = mlflow.models.evaluate(
            data=df, model_type="rag", evaluators="rag",
            evaluator_config={"judge": _FlakyJudge(), "metrics": ["faithfulness"]},
        )
    assert figures_of(result)["faithfulness/n_error"] == 1
    assert figures_of(result)["faithfulness/n_scored"] == 1
    assert result.metrics["faithfulness/mean"] == pytest.approx(0.5)  # the failed row is not in it
    table = _artifact_json(run.info.run_id, "eval_results_table.json")
    rows = [dict(zip(table["columns"], r)) for r in table["data"]]
    assert rows[1]["faithfulness/score"] is None
    assert rows[1]["faithfulness/error"] == "ParseError: reply was not valid JSON"


def test_a_run_holds_one_rag_evaluation(tracking_uri, local_judge):
    with mlflow.start_run():
        mlflow.models.evaluate(data=static_frame(), model_type="rag", evaluators="rag",
                               evaluator_config={"judge": local_judge, "metrics": ["mrr"]})
        with pytest.raises(ValueError, match="already holds a RAG evaluation"):
            mlflow.models.evaluate(data=static_frame(), model_type="rag", evaluators="rag",
                                   evaluator_config={"judge": local_judge, "metrics": ["mrr"]})


@pytest.mark.parametrize("model_type", ["rag", None, "classifier", "regressor", "question-answering", "text", "retriever"])
def test_plugin_only_answers_the_rag_model_type(model_type):
    assert RagEvaluator.can_evaluate(model_type=model_type, evaluator_config={}) is (model_type == "rag")
    names = [b.name for b in resolve_evaluators_and_configs(None, None, model_type)]
    assert ("rag" in names) is (model_type == "rag")


class _AnswersOnly(mlflow.pyfunc.PythonModel):
    """A pipeline that returns its answers as plain strings, without the contexts it used."""

    def predict(self, context, model_input, params=None):
        return [f"An answer to {q}" for q in model_input["question"]]


def test_a_model_returning_plain_strings_is_told_the_shape_it_must_return(tracking_uri):
    """Issue 37: the error said "column 'contexts' is missing ... map another column", where
    the model's output shape is the problem. It says what the model returned and what it must."""
    info = mlflow.pyfunc.log_model(name="answers_only", python_model=_AnswersOnly(),
                                   input_example=pd.DataFrame({"question": ["q"]}))
    data = static_frame()[["question", "reference"]]
    with mlflow.start_run(), pytest.raises(ValueError) as raised:
        mlflow.models.evaluate(model=info.model_uri, data=data, model_type="rag", evaluators="rag",
                               evaluator_config={"judge": "scripted", "metrics": ["faithfulness"]})
    message = str(raised.value)
    assert f"the model returned a list of {len(data)} str" in message, message
    assert "'answer' and 'contexts'" in message and "map another column" not in message, message
