"""The gate's decision history (``gate/history.py``), read back after real promotions."""

from __future__ import annotations

import mlflow
from gate_support import _decision_json

from mlflow_rag_eval.gate import gate, gate_history, load_policy

pytest_plugins = ["gate_support"]  # its fixture: registry, a fresh sqlite registry per test


def test_a_better_pipeline_is_promoted_and_the_history_records_it(registry, local_judge):
    from pipeline import load_golden, log_pipeline

    golden = load_golden().head(15)
    versions, runs = [], []
    for k in (1, 5):  # k=1 retrieves one passage: worse recall and ranking than k=5
        with mlflow.start_run():
            info = log_pipeline(k=k)
        versions.append(str(mlflow.register_model(info.model_uri, "northwind").version))
        with mlflow.start_run() as run:
            mlflow.models.evaluate(model=info.model_uri, data=golden, model_type="rag", evaluators="rag",
                                   evaluator_config={"judge": local_judge,
                                                     "metrics": ["faithfulness", "mrr", "ndcg@10", "hit@5"]})
        runs.append(run.info.run_id)
    policy = {"require_metrics": ["faithfulness", "hit@5"], "min_scored_rows": 10,
              "floors": {"faithfulness/mean": 0.5, "hit_at_5/mean": 0.3},
              "max_regression": {"faithfulness": 0.03, "ndcg@10": 0.02}, "calibration": {"required": False}}

    first = gate("northwind", versions[0], policy)  # first version: no champion, floors only
    assert first.exit_code == 0 and first.champion_version is None and first.comparison is None
    assert {c.kind for c in first.checks} == {"min_scored_rows", "max_error_rate", "floor mean"}  # default rate
    assert any("no champion" in n for n in first.notes)

    decision = gate("northwind", versions[1], policy)
    assert decision.exit_code == 0 and decision.passed, decision.to_text()
    assert decision.champion_version == versions[0] and decision.champion_run_id == runs[0]
    assert decision.candidate_run_id == runs[1]
    by = {(c.metric, c.kind): c for c in decision.checks}
    assert by[("ndcg_at_10", "regression")].delta > 0  # graded relevance: the second passage counts
    assert by[("hit_at_5", "floor mean")].delta == 0  # the first relevant passage is ranked first by both
    assert str(registry.get_model_version_by_alias("northwind", "champion").version) == versions[1]
    assert str(registry.get_model_version_by_alias("northwind", "previous_champion").version) == versions[0]
    tags = registry.get_model_version("northwind", versions[1]).tags
    assert tags["rag_eval.gate"] == "passed" and tags["rag_eval.gate_run_id"] == runs[1]
    assert tags["rag_eval.gate_policy_sha256"] == load_policy(policy).policy_hash
    assert tags["rag_eval.gate_decided_at"] == decision.decided_at
    logged = _decision_json(registry, runs[1])
    assert logged["verdict"] == "passed" and logged["champion_version"] == versions[0]
    assert {m["metric"] for m in logged["comparison"]["metrics"]} >= {"faithfulness", "ndcg_at_10"}
    assert "GATE PASSED" in decision.to_text() and "ndcg_at_10" in decision.to_text()

    history = gate_history("northwind")
    assert list(history["version"]) == versions and list(history["verdict"]) == ["passed", "passed"]
    assert history["decided_at"].is_monotonic_increasing
    assert history["champion_version"].isna().tolist() == [True, False]  # first version: no champion
    assert history["champion_version"][1] == versions[0] and history["n_failed"].tolist() == [0, 0]
