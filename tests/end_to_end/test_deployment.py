"""The whole flow on a real deployment: an ``mlflow server`` backed by PostgreSQL, its artifacts
on S3 (moto's server standing in), all three started here on loopback and stopped after.

Two versions of the quickstart pipeline are logged, registered and evaluated over HTTP; every
row becomes a trace with its assessments; the runs are compared; reviewers' labels are posted
on one run's traces through the REST endpoint the MLflow UI uses; the judge is calibrated from
them; and the gate promotes the better version, moving the registry alias.

The "reviewer" here gives each row the judge's context recall rounded to a tenth, and the
opposite on a few rows: it exercises the path from UI labels to the gate, and says nothing of
the judge's quality.
"""

from __future__ import annotations

import json

import mlflow
import pytest
import requests
from mlflow import MlflowClient

from mlflow_rag_eval.testing import mlflow_server, postgres_server, s3_server

MODEL = "rag-pipeline-pg"
POLICY = """
require_metrics: [hit_at_5, ndcg_at_10, context_recall]
min_scored_rows: 30
max_error_rate: 0.0
floors: {ndcg_at_10/mean: 0.5, context_recall/mean: 0.5}
max_regression: {hit_at_5: 0.02, ndcg_at_10: 0.02, context_recall: 0.05}
calibration: {required: true, min_labels: 50, min_spearman: 0.7}
"""


@pytest.fixture(scope="session")
def deployment(tmp_path_factory):
    """PostgreSQL + an S3 stand-in + ``mlflow server`` in front of both, for the session."""
    home = tmp_path_factory.mktemp("deployment")
    with postgres_server() as database, s3_server(home) as (endpoint, bucket, env):
        with mlflow_server(home, backend_store_uri=database, artifacts_destination=f"s3://{bucket}/mlflow",
                           env=env) as (url, _):
            yield {"url": url, "database": database, "s3": endpoint, "bucket": bucket}


@pytest.fixture
def over_http(deployment, monkeypatch):
    monkeypatch.delenv("MLFLOW_EXPERIMENT_ID", raising=False)
    mlflow.set_tracking_uri(deployment["url"])
    yield deployment
    if mlflow.active_run():
        mlflow.end_run()
    mlflow.set_tracking_uri(None)


def _post_label(url: str, trace_id: str, value: float, reviewer: str) -> None:
    """A reviewer's feedback, as the MLflow UI's assessment form posts it."""
    body = {"assessment": {
        "assessment_name": "context_recall", "trace_id": trace_id,
        "source": {"source_type": "HUMAN", "source_id": reviewer},
        "feedback": {"value": value},
    }}
    response = requests.post(f"{url}/api/3.0/mlflow/traces/{trace_id}/assessments", json=body, timeout=30)
    assert response.ok, response.text[:500]


def test_evaluate_compare_calibrate_and_gate_on_postgres_and_s3(over_http, local_judge, tmp_path):
    import boto3
    from pipeline import load_golden, log_pipeline

    from mlflow_rag_eval.compare import compare_runs
    from mlflow_rag_eval.gate import calibrate_from_run, gate

    url = over_http["url"]
    client = MlflowClient(url)
    experiment_id = client.create_experiment("rag-on-postgres")
    golden = load_golden()[["question", "reference", "relevant_ids", "answerable"]]

    runs = {}
    for k in (2, 5):
        info = log_pipeline(k=k)
        with mlflow.start_run(experiment_id=experiment_id, run_name=f"bm25-top{k}") as run:
            mlflow.models.evaluate(model=info.model_uri, data=golden, model_type="rag", evaluators="rag",
                                   evaluator_config={"judge": local_judge})
        # registered from its evaluation run, as the docs do: the evaluation is in another
        # experiment than the logged model, and the version's run_id is what the gate trusts
        if not client.search_registered_models(f"name = '{MODEL}'"):
            client.create_registered_model(MODEL)
        version = client.create_model_version(MODEL, source=info.model_uri, run_id=run.info.run_id,
                                              model_id=info.model_id).version
        runs[k] = (run.info.run_id, str(version))

    # Rows as traces with assessments, in PostgreSQL; the table in S3, through the proxy.
    (run_a, _), (run_b, version_b) = runs[2], runs[5]
    for run_id in (run_a, run_b):
        got = requests.get(f"{url}/api/2.0/mlflow/runs/get", params={"run_id": run_id}, timeout=30).json()["run"]
        tags = {t["key"]: t["value"] for t in got["data"]["tags"]}
        assert tags["mlflow.runType"] == "genai_evaluate"
        traces = client.search_traces(locations=[experiment_id], run_id=run_id, max_results=500, include_spans=False)
        assert len(traces) == len(golden)
        path = client.download_artifacts(run_id, "eval_results_table.json", str(tmp_path))
        with open(path) as f:
            table = json.load(f)
        rows = [dict(zip(table["columns"], r)) for r in table["data"]]
        by_trace = {t.info.trace_id: t for t in traces}
        for row in rows:
            feedback = {a.name: a for a in by_trace[row["trace_id"]].info.assessments if a.name == "ndcg_at_10"}
            if row["ndcg_at_10/score"] is not None:
                assert feedback["ndcg_at_10"].value == pytest.approx(row["ndcg_at_10/score"], abs=1e-12)
    s3 = boto3.client("s3", endpoint_url=over_http["s3"], aws_access_key_id="testing",
                      aws_secret_access_key="testing", region_name="us-east-1")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=over_http["bucket"], MaxKeys=1000).get("Contents", [])]
    assert any(key.endswith(f"{run_b}/artifacts/eval_results_table.json") for key in keys), keys[:20]
    assert any(key.endswith(f"{run_b}/artifacts/rag_eval/report.html") for key in keys)

    comparison = compare_runs(run_a, run_b, log_to=None)
    assert {d.metric for d in comparison.deltas} >= {"hit_at_5", "ndcg_at_10", "context_recall"}

    # Reviewers label rows of the candidate's run; the judge is calibrated on those labels. The
    # rows are taken in golden-set order (not by random trace id), so the labels are the same
    # in every run of this test.
    traces = client.search_traces(locations=[experiment_id], run_id=run_b, max_results=500, include_spans=False)
    labelled = 0
    for trace in sorted(traces, key=lambda t: int(t.info.trace_metadata["rag_eval.row"])):
        judged = next((a for a in trace.info.assessments if a.name == "context_recall"), None)
        if judged is None or judged.value is None or labelled == 55:
            continue
        label = round(judged.value, 1)
        if labelled % 20 == 7:  # a few disagreements
            label = 1.0 - label
        _post_label(url, trace.info.trace_id, label, reviewer="reviewer@example.com")
        labelled += 1
    assert labelled == 55
    calibration = calibrate_from_run(run_b, "context_recall", n_boot=200)
    assert calibration.n_labels == 55 and calibration.n_scored == 55
    assert calibration.spearman is not None and calibration.spearman >= 0.7
    assert calibration.judge_fingerprint == client.get_run(run_b).data.params["rag_eval.judge_fingerprint"]

    # The gate: the first version on floors alone, then the second against it; the alias moves.
    policy = tmp_path / "gate.yaml"
    policy.write_text(POLICY)
    first = gate(MODEL, runs[2][1], str(policy))
    assert first.exit_code == 0, first.to_text()
    second = gate(MODEL, version_b, str(policy))
    assert second.exit_code == 0, second.to_text()
    assert client.get_model_version_by_alias(MODEL, "champion").version == version_b
    assert client.get_model_version_by_alias(MODEL, "previous_champion").version == runs[2][1]
