"""The rag evaluator logging to a real ``mlflow server`` over HTTP, read back over plain REST.

The server (sqlite backend store, artifacts proxied to a local ``--artifacts-destination``:
``--serve-artifacts`` is the default in MLflow 3, so new experiments get an
``mlflow-artifacts:/`` root and every upload goes through the server) runs on 127.0.0.1 for
this module. The evaluation is logged with the MLflow client over HTTP; everything is then
read back with ``requests`` only, the way another tool or the UI would see the run:
``/api/2.0/mlflow/runs/get``, ``/api/2.0/mlflow/artifacts/list`` and the artifact proxy
``/api/2.0/mlflow-artifacts/artifacts/<experiment>/<run>/artifacts/<path>``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import mlflow
import pandas as pd
import pytest
import requests
from mlflow import MlflowClient

from mlflow_rag_eval.testing import mlflow_server as loopback_mlflow_server

START_TIMEOUT_S = 60
METRICS = ["faithfulness", "context_recall", "ndcg@10", "mrr"]


@dataclass
class Server:
    url: str
    artifacts: Path

    def get(self, endpoint: str, **params) -> requests.Response:
        response = requests.get(f"{self.url}{endpoint}", params=params, timeout=30)
        assert response.ok, (endpoint, response.status_code, response.text[:500])
        return response


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """``mlflow server`` on 127.0.0.1:<free port> for this module, always torn down."""
    with loopback_mlflow_server(tmp_path_factory.mktemp("mlflow_server")) as (url, artifacts):
        yield Server(url, artifacts)


def predictions() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "question": ["How much does a bike ticket cost?", "Can I bring my cat?", "Do dogs pay?"],
            "answer": [
                "A bike ticket costs 5 euros. Bikes ride free on Sundays.",
                "I don't know.",
                "Dogs travel free on all trains.",
            ],
            "contexts": [
                [
                    {"id": "p1", "text": "Bikes travel for a flat fare of 5 euros per journey."},
                    {"id": "p2", "text": "Dogs travel free on all trains."},
                ],
                [{"id": "p2", "text": "Dogs travel free on all trains."}],
                [
                    {"id": "p3", "text": "Seat reservations cost 4 euros."},
                    {"id": "p2", "text": "Dogs travel free on all trains."},
                ],
            ],
            "reference": [
                "A bike ticket costs 5 euros.",
                "Cats travel free in a closed carrier.",
                "Dogs travel free.",
            ],
            "relevant_ids": [{"p1": 2}, {"p9": 1}, {"p2": 1}],
        }
    )


@pytest.fixture
def over_http(mlflow_server):
    """The server as the tracking URI for this test; the URI is reset afterwards."""
    mlflow.set_tracking_uri(mlflow_server.url)
    yield mlflow_server
    if mlflow.active_run():
        mlflow.end_run()
    mlflow.set_tracking_uri(None)


def test_evaluation_logged_over_http_reads_back_over_rest(over_http, local_judge):
    server = over_http
    df = predictions()
    # An experiment of our own, named to start_run: no active-experiment state is left behind.
    experiment_id = MlflowClient(server.url).create_experiment("rag-over-http")
    with mlflow.start_run(experiment_id=experiment_id) as run:
        result = mlflow.models.evaluate(
            data=df, model_type="rag", evaluators="rag",
            evaluator_config={"judge": local_judge, "metrics": METRICS},
        )
    run_id = run.info.run_id

    got = server.get("/api/2.0/mlflow/runs/get", run_id=run_id).json()["run"]
    metrics = {m["key"]: m["value"] for m in got["data"]["metrics"]}
    params = {p["key"]: p["value"] for p in got["data"]["params"]}
    tags = {t["key"]: t["value"] for t in got["data"]["tags"]}
    assert {"faithfulness/mean", "context_recall/mean", "ndcg_at_10/mean", "mrr/mean"} <= set(metrics)
    assert metrics == result.metrics  # what went over the wire is what was computed, exactly
    assert params["rag_eval.judge"] == "local:minilm-l6"
    fingerprint = params["rag_eval.judge_fingerprint"]
    assert len(fingerprint) == 16 and tags["rag_eval.judge_fingerprint"] == fingerprint
    assert '"eval_results_table.json"' in tags["mlflow.loggedArtifacts"]  # the UI's table view

    # Artifacts went through the server's proxy, into its --artifacts-destination.
    root = got["info"]["artifact_uri"]
    assert root == f"mlflow-artifacts:/{experiment_id}/{run_id}/artifacts"
    listed = server.get("/api/2.0/mlflow/artifacts/list", run_id=run_id).json()
    files = {f["path"]: f["is_dir"] for f in listed["files"]}
    assert files["eval_results_table.json"] is False and files["rag_eval"] is True
    inner = server.get("/api/2.0/mlflow/artifacts/list", run_id=run_id, path="rag_eval").json()
    assert "rag_eval/judge_lineage.json" in {f["path"] for f in inner["files"]}
    assert (server.artifacts / experiment_id / run_id / "artifacts" / "eval_results_table.json").is_file()

    proxy = f"/api/2.0/mlflow-artifacts/artifacts/{experiment_id}/{run_id}/artifacts"
    table = server.get(f"{proxy}/eval_results_table.json").json()
    assert len(table["data"]) == len(df)
    for key in ("faithfulness", "context_recall", "ndcg_at_10", "mrr"):
        assert f"{key}/score" in table["columns"] and f"{key}/justification" in table["columns"]
    rows = [dict(zip(table["columns"], r)) for r in table["data"]]
    assert [r["question"] for r in rows] == list(df["question"])
    faithfulness = [r["faithfulness/score"] for r in rows]
    assert sum(faithfulness) / len(faithfulness) == pytest.approx(metrics["faithfulness/mean"])

    lineage = server.get(f"{proxy}/rag_eval/judge_lineage.json").json()
    assert lineage["judge"]["name"] == "local:minilm-l6"
    assert lineage["judge"]["fingerprint"] == fingerprint
    assert lineage["dataset"]["n_rows"] == len(df)
    assert {m["name"] for m in lineage["metrics"]} == set(METRICS)
