"""The quickstart (what `make demo` runs) ends with two evaluated runs holding the metrics and
artifacts the README promises."""

from __future__ import annotations

import mlflow

PROMISED = (
    "faithfulness/mean",
    "answer_relevancy/mean",
    "context_recall/mean",
    "hit_at_5/mean",
    "mrr/mean",
    "ndcg_at_10/mean",
)


def test_quickstart_logs_two_evaluated_runs(demo):
    runs, decisions, out = demo.runs, demo.decisions, demo.out
    assert "mlflow ui --backend-store-uri" in out
    client = mlflow.MlflowClient(demo.uri)
    assert len(runs) == 2
    for run_id, _ in runs.values():
        run = client.get_run(run_id)
        assert set(PROMISED) <= set(run.data.metrics)
        # An MLflow 3 evaluation run: no model logged in it (the model is its input), one
        # trace per golden row.
        assert run.data.tags["mlflow.runType"] == "genai_evaluate" and not run.outputs.model_outputs
        assert [m.model_id for m in run.inputs.model_inputs] == [run.data.tags["rag_eval.model_id"]]
        traces = client.search_traces(locations=[demo.experiment_id], run_id=run_id, max_results=500,
                                      include_spans=False)
        assert len(traces) == 74
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
