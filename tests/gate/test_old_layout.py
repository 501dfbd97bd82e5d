"""Runs logged the old way (every statistic of the run and of each slice as an MLflow metric,
no statistics table) are compared and gated by the code that logs only the means, against runs
logged the new way, in both directions."""

from __future__ import annotations

from pathlib import Path

import mlflow
import pytest
from gate_support import POLICY, _predictions, _register

from mlflow_rag_eval.compare import compare_runs
from mlflow_rag_eval.evaluation.engine import evaluate_records
from mlflow_rag_eval.evaluation.slices import attach_columns, compute_slices
from mlflow_rag_eval.evaluation.statistics import STATISTICS_FILE
from mlflow_rag_eval.gate import gate
from mlflow_rag_eval.keys import RUN_STATS, split_aggregate_key
from mlflow_rag_eval.records import records_from_frame

pytest_plugins = ["gate_support"]  # its fixture: registry, a fresh sqlite registry per test

METRICS = ["faithfulness", "mrr", "ndcg@10", "hit@5"]


def _sliced(n_bad: int = 0):
    data = _predictions(n_bad=n_bad)
    data["difficulty"] = ["hard" if i % 3 == 0 else "easy" for i in range(len(data))]
    return data


def _old_layout_keys(data, judge) -> set[str]:
    """The metric keys a run of ``data`` held before the statistics table, as that code made
    them: every aggregate of the run (``figures.aggregates()``) and every slice statistic
    (``SliceTable.as_metrics()``)."""
    records = attach_columns(records_from_frame(data), data, ["difficulty"])
    result = evaluate_records(records, METRICS, judge, progress=False)
    return set(result.aggregates()) | set(compute_slices(result, ["difficulty"]).as_metrics())


def _evaluate(model_id: str, data, judge, **config) -> str:
    with mlflow.start_run() as run:
        mlflow.models.evaluate(data=data, model_type="rag", evaluators="rag", model_id=model_id,
                               evaluator_config={"judge": judge, "metrics": METRICS, "slice_by": ["difficulty"],
                                                 "log_traces": False, **config})
    return run.info.run_id


def _old_layout_run(client, model_id: str, data, judge) -> str:
    """A run as the old code left it: every statistic as a metric, and no statistics table."""
    run_id = _evaluate(model_id, data, judge, run_metrics="all")
    logged = set(client.get_run(run_id).data.metrics)
    assert logged == _old_layout_keys(data, judge)  # the old layout, key for key
    assert any("/slice/difficulty/hard/" in k for k in logged) and "faithfulness/n_error" in logged
    root = Path(client.get_run(run_id).info.artifact_uri.removeprefix("file://"))
    (root / STATISTICS_FILE).unlink()
    return run_id


def test_an_old_layout_champion_gates_a_new_layout_candidate(registry, local_judge):
    champion, model_id = _register("rag")
    old = _old_layout_run(registry, model_id, _sliced(), local_judge)
    first = gate("rag", champion, POLICY)
    assert first.passed, first.to_text()  # floors, rows and error rate from the old run's rows
    rows = {c.kind: c.value for c in first.checks if c.metric == "faithfulness"}
    assert rows["min_scored_rows"] == 15 and rows["max_error_rate"] == 0.0
    candidate, model_id = _register("rag")
    new = _evaluate(model_id, _sliced(n_bad=3), local_judge)
    assert {split_aggregate_key(k)[1] for k in registry.get_run(new).data.metrics} <= set(RUN_STATS)
    decision = gate("rag", candidate, POLICY)
    assert decision.exit_code == 1, decision.to_text()
    failed = {(c.metric, c.kind) for c in decision.failed_checks}
    assert failed == {("faithfulness", "regression"), ("mrr", "regression"), ("ndcg_at_10", "regression")}
    faithfulness = {c.kind: c.value for c in decision.checks if c.metric == "faithfulness"}
    assert faithfulness["min_scored_rows"] == 15  # the new run's count, from its rows table
    comparison = compare_runs(old, new)
    deltas = {d.metric: d for d in comparison.deltas}
    assert set(deltas) == {"faithfulness", "mrr", "ndcg_at_10", "hit_at_5"}
    assert deltas["faithfulness"].delta == pytest.approx(-0.2)  # 3 of 15 rows unsupported
    assert {(s.field, s.value) for s in comparison.slices} == {("difficulty", "easy"), ("difficulty", "hard")}


def test_a_new_layout_champion_gates_an_old_layout_candidate(registry, local_judge):
    champion, model_id = _register("rag")
    _evaluate(model_id, _sliced(), local_judge)
    assert gate("rag", champion, POLICY).passed
    candidate, model_id = _register("rag")
    old = _old_layout_run(registry, model_id, _sliced(), local_judge)
    decision = gate("rag", candidate, POLICY)
    assert decision.passed, decision.to_text()
    # the old run's logged counts were checked against its rows table, not taken on trust
    registry.log_metric(old, "faithfulness/n_error", 0.0)  # unchanged: agrees
    registry.log_metric(old, "faithfulness/n_scored", 14.0)  # altered
    altered = gate("rag", candidate, POLICY, record=False)
    assert altered.exit_code == 2
    assert "logged faithfulness/n_scored=14 but its rows table has 15 scored rows" in altered.reasons[0]
