"""The quickstart (what `make demo` runs) ends with two evaluated runs holding the metrics and
artifacts docs/getting-started.md promises."""

from __future__ import annotations

import json

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
    runs, out = demo.runs, demo.out
    assert "mlflow ui --backend-store-uri" in out
    client = mlflow.MlflowClient(demo.uri)
    assert list(runs) == ["extractive", "overconfident"]
    for run_id, _ in runs.values():
        run = client.get_run(run_id)
        assert set(PROMISED) <= set(run.data.metrics)
        # An MLflow 3 evaluation run: no model logged in it (the model is its input), one
        # trace per golden row.
        assert run.data.tags["mlflow.runType"] == "genai_evaluate" and not run.outputs.model_outputs
        assert [m.model_id for m in run.inputs.model_inputs] == [run.data.tags["rag_eval.model_id"]]
        traces = client.search_traces(locations=[demo.experiment_id], run_id=run_id, max_results=500,
                                      include_spans=False)
        assert len(traces) == demo.n_rows
        paths = {a.path for a in client.list_artifacts(run_id)}
        assert "eval_results_table.json" in paths
        assert {a.path for a in client.list_artifacts(run_id, "rag_eval")} >= {
            "rag_eval/judge_lineage.json", "rag_eval/worst_rows.json", "rag_eval/report.html",
            "rag_eval/slices.json",
            "rag_eval/gate_decision.json",  # the gate records its decision on the evaluation run
        }
        assert f"{run.data.metrics['ndcg_at_10/mean']:.3f}" in out


def test_quickstart_evaluates_on_the_golden_set_it_wrote(demo):
    """The generated set is logged first, as an MLflow evaluation dataset of the experiment;
    both runs name its digest; it has all three kinds of question."""
    golden = demo.golden
    digest = golden.tags["rag_eval.dataset_digest"]
    assert f"digest {digest}" in demo.out and "answerable_from_corpus" in demo.out  # the drop report
    client = mlflow.MlflowClient(demo.uri)
    for run_id, _ in demo.runs.values():
        assert client.get_run(run_id).data.params["rag_eval.dataset_digest"] == digest
    kept = json.loads(golden.tags["rag_eval.kept"])
    assert set(kept) == {"single", "multi", "unanswerable"} and all(kept.values())
    assert demo.n_rows == sum(kept.values())


def test_quickstart_shows_the_generator_regression_per_slice_and_the_gate_refuses_it(demo):
    (_, base), (_, worse) = demo.runs.values()
    # Same retrieval; the overconfident generator invents and never abstains.
    assert worse["hit_at_5/mean"] == base["hit_at_5/mean"]
    assert worse["faithfulness/mean"] < base["faithfulness/mean"] - 0.1
    assert worse["abstention/mean"] == 0.0 < base["abstention/mean"]
    from mlflow_rag_eval.evaluation.slices import load_slices

    (base_run, _), (worse_run, _) = demo.runs.values()
    client = mlflow.MlflowClient(demo.uri)
    base_slices, worse_slices = (load_slices(r, client)["fields"]["question_type"]["slices"] for r in (base_run, worse_run))
    for kind in ("single", "multi", "unanswerable"):
        mean = lambda s: s[kind]["metrics"]["faithfulness"]["mean"]  # noqa: E731
        assert mean(worse_slices) < mean(base_slices), kind
    assert "per question_type" in demo.out and "per difficulty" in demo.out

    first, second = demo.decisions
    assert first.champion_version is None and first.exit_code == 0
    assert second.champion_version == "1" and second.exit_code == 1
    assert "GATE FAILED: rag-quickstart-pipeline v2" in demo.out
    assert "faithfulness regressed" in demo.out and "abstention/mean = 0.000 < floor 0.5" in demo.out
    assert "on slice question_type=" in demo.out
    client = mlflow.MlflowClient(demo.uri)
    assert str(client.get_model_version_by_alias("rag-quickstart-pipeline", "champion").version) == "1"
