"""The quickstart (what `make demo` runs) ends with two evaluated runs holding the metrics and
artifacts the README promises."""

from __future__ import annotations

import importlib.util

import mlflow

from conftest import ROOT

PROMISED = (
    "faithfulness/mean",
    "answer_relevancy/mean",
    "context_recall/mean",
    "hit_at_5/mean",
    "mrr/mean",
    "ndcg_at_10/mean",
)


def test_quickstart_logs_two_evaluated_runs(tracking_uri, capsys):
    spec = importlib.util.spec_from_file_location("quickstart", ROOT / "examples" / "quickstart.py")
    quickstart = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(quickstart)

    runs, decisions = quickstart.main(["--tracking-uri", tracking_uri, "--experiment", "qs"])

    out = capsys.readouterr().out
    assert "mlflow ui --backend-store-uri" in out
    client = mlflow.MlflowClient()
    assert len(runs) == 2
    for run_id, _ in runs.values():
        run = client.get_run(run_id)
        assert set(PROMISED) <= set(run.data.metrics)
        paths = {a.path for a in client.list_artifacts(run_id)}
        assert "eval_results_table.json" in paths
        assert {a.path for a in client.list_artifacts(run_id, "rag_eval")} >= {
            "rag_eval/judge_lineage.json", "rag_eval/worst_rows.json", "rag_eval/report.html",
            "rag_eval/gate_decision.json",  # the gate records its decision on the evaluation run
        }
        assert f"{run.data.metrics['ndcg_at_10/mean']:.3f}" in out
    # Wider retrieval finds at least as many relevant passages in the top 5.
    (_, small), (_, large) = runs.values()
    assert large["hit_at_5/mean"] >= small["hit_at_5/mean"]

    # It ends by gating the second variant against the first, and says why.
    first, second = decisions
    assert first.champion_version is None and second.champion_version == "1"
    assert second.exit_code == 0 and "GATE PASSED: rag-quickstart-pipeline v2" in out
    assert "regression: 95% CI" in out
    assert str(client.get_model_version_by_alias("rag-quickstart-pipeline", "champion").version) == "2"
