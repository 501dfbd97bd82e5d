"""The gate binds its evidence (``gate/evidence.py``, ``tracking/seal.py``, ``tracking/search.py``):
each attack of issue 35 on a real sqlite store, followed by a real gate run. Each made the gate
promote a version it refuses untampered; each now fails closed with the reason.

The honest paths beside them: a real improvement still promotes, and a run logged before the
seal still gates with a one-line notice (or is refused under ``require_seal: true``)."""

from __future__ import annotations

import json
import time

import mlflow
import pytest
from gate_support import (
    POLICY,
    SLICED_POLICY,
    _candidate,
    _evaluate,
    _labelled,
    _predictions,
    _register,
    _sliced_version,
)

from mlflow_rag_eval.gate import calibrate, gate

pytest_plugins = ["gate_support"]  # its fixture: registry, a fresh sqlite registry per test

TABLE = "eval_results_table.json"
LINEAGE = "rag_eval/judge_lineage.json"


def _text(run_id: str, path: str) -> str:
    return mlflow.artifacts.load_text(f"runs:/{run_id}/{path}")


def _champion_and_regressed(client, local_judge, name: str = "rag"):
    """v1 promoted (all good), v2 evaluated with 4 wrong answers: the gate refuses v2 untampered."""
    v1, r1 = _candidate(name, _predictions(), local_judge)
    assert gate(name, v1, POLICY).passed
    v2, r2 = _candidate(name, _predictions(n_bad=4), local_judge)
    honest = gate(name, v2, POLICY, record=False)
    assert honest.exit_code == 1, honest.to_text()
    return v1, r1, v2, r2


def _alias(client, name: str, alias: str = "champion") -> str:
    return str(client.get_model_version_by_alias(name, alias).version)


# -- 1. directions read from an editable file --------------------------------------------------------
def test_a_lineage_rewritten_to_flip_directions_is_refused(registry, local_judge):
    v1, r1, v2, _ = _champion_and_regressed(registry, local_judge)
    lineage = json.loads(_text(r1, LINEAGE))
    for spec in lineage["metrics"]:  # the champion's drops now count as the candidate's gains
        spec["greater_is_better"] = False
    registry.log_text(r1, json.dumps(lineage, indent=2), LINEAGE)

    decision = gate("rag", v2, POLICY)
    assert decision.exit_code == 2, decision.to_text()
    assert f"run {r1}: its lineage ({LINEAGE}) is not the one sealed" in decision.reasons[0]
    assert _alias(registry, "rag") == v1


# -- 2. the rows table and the metrics replaced together ---------------------------------------------
def test_a_table_copied_from_another_run_with_matching_metrics_is_refused(registry, local_judge):
    v1, r1, v2, r2 = _champion_and_regressed(registry, local_judge)
    registry.log_text(r2, _text(r1, TABLE), TABLE)
    now = int(time.time() * 1000)
    for key, value in registry.get_run(r1).data.metrics.items():
        registry.log_metric(r2, key, value, timestamp=now)

    decision = gate("rag", v2, POLICY)
    assert decision.exit_code == 2, decision.to_text()
    assert f"run {r2}: its rows table (eval_results_table.json) is not the one sealed" in decision.reasons[0]
    assert _alias(registry, "rag") == v1


def test_an_unsealed_run_holding_another_runs_table_is_refused_by_its_trace_ids(registry, local_judge):
    """Where no seal exists (a run logged before it), the table's trace ids must be the run's."""
    v1, r1 = _candidate("rag", _predictions(), local_judge)
    assert gate("rag", v1, POLICY).passed
    _, r2 = _candidate("rag", _predictions(n_bad=4), local_judge)
    forged = _unsealed_copy(registry, r2, table_from=r1)
    v3 = _version_of_run(registry, "rag", forged)

    decision = gate("rag", v3, POLICY)
    assert decision.exit_code == 2, decision.to_text()
    assert f"run {forged}: 15 of the 15 trace ids of its rows table are not traces of the run" in decision.reasons[0]


# -- 3. a forged run in another experiment -----------------------------------------------------------
def test_a_run_in_another_experiment_claiming_the_model_is_not_its_evaluation(registry, local_judge):
    v1, _ = _candidate("rag", _predictions(), local_judge)
    assert gate("rag", v1, POLICY).passed
    v2, model_id = _register("rag")
    own = _evaluate(model_id, _predictions(n_bad=4), local_judge)
    mlflow.set_experiment("elsewhere")  # newer, tagged rag_eval.model_id=<v2's model>, good answers
    forged = _evaluate(model_id, _predictions(), local_judge)
    assert registry.get_run(forged).data.tags["rag_eval.model_id"] == model_id

    decision = gate("rag", v2, POLICY)
    assert decision.candidate_run_id == own
    assert decision.exit_code == 1, decision.to_text()
    assert _alias(registry, "rag") == v1


# -- 4. a future start time ---------------------------------------------------------------------------
def test_a_run_started_in_the_future_is_refused_and_once_deleted_the_others_are_judged(registry, local_judge):
    v1, _ = _candidate("rag", _predictions(), local_judge)
    assert gate("rag", v1, POLICY).passed
    v2, model_id = _register("rag")
    tomorrow = int((time.time() + 86400) * 1000)
    ahead = registry.create_run(mlflow.get_experiment_by_name("tests").experiment_id, start_time=tomorrow).info.run_id
    with mlflow.start_run(run_id=ahead):  # a machine whose clock is a day ahead, good answers
        mlflow.models.evaluate(data=_predictions(), model_type="rag", evaluators="rag", model_id=model_id,
                               evaluator_config={"judge": local_judge,
                                                 "metrics": ["faithfulness", "mrr", "ndcg@10", "hit@5"]})
    today = _evaluate(model_id, _predictions(n_bad=4), local_judge)

    decision = gate("rag", v2, POLICY)
    assert decision.exit_code == 2, decision.to_text()
    assert f"the newest evaluation run {ahead} of rag v{v2} started at" in decision.reasons[0]
    assert "after this gate's clock" in decision.reasons[0]
    registry.delete_run(ahead)
    judged = gate("rag", v2, POLICY)
    assert (judged.exit_code, judged.candidate_run_id) == (1, today), judged.to_text()
    assert _alias(registry, "rag") == v1


# -- 5. deleting the champion version ----------------------------------------------------------------
def test_deleting_the_champion_version_fails_closed(registry, local_judge):
    v1, _, v2, _ = _champion_and_regressed(registry, local_judge)
    registry.delete_model_version("rag", v1)  # the alias goes with it

    decision = gate("rag", v2, POLICY)
    assert decision.exit_code == 2, decision.to_text()
    assert f"no version holds alias 'champion' of 'rag', but the gate gave it to v{v1}" in decision.reasons[0]
    assert "rag_eval.gate.alias.champion" in decision.reasons[0]
    assert not registry.get_registered_model("rag").aliases
    # --first-version stays the one way to promote without a champion
    first = gate("rag", v2, {**POLICY, "floors": {"faithfulness/mean": 0.5}}, first_version=True, record=False)
    assert first.exit_code == 0, first.to_text()


# -- 6. calibration and PPI believed from metrics ---------------------------------------------------
def test_a_calibration_is_recomputed_from_its_labels_not_read_from_its_metrics(registry, local_judge):
    policy = {**POLICY, "calibration": {"required": True, "min_labels": 20, "min_spearman": 0.7}}
    version, _ = _candidate("calibrated", _predictions(), local_judge)
    flipped = calibrate(_labelled(flip=True), "faithfulness", local_judge, n_boot=200)
    assert flipped.spearman < 0
    refused = gate("calibrated", version, policy, record=False)
    assert refused.reasons == [f"faithfulness: calibration rho {flipped.spearman:.2f} < 0.7 on 24 labels"]

    for key in ("calibration/spearman", "calibration/spearman_ci_low", "calibration/spearman_ci_high"):
        registry.log_metric(flipped.run_id, key, 0.95)
    still = gate("calibrated", version, policy, record=False)
    assert still.reasons == refused.reasons, still.to_text()
    assert "0.950" not in still.to_text()

    rows = json.loads(_text(flipped.run_id, "rag_eval/calibration_rows.json"))
    for row in rows:
        row["label"] = 1 - row["label"]
    registry.log_text(flipped.run_id, json.dumps(rows), "rag_eval/calibration_rows.json")
    edited = gate("calibrated", version, policy, record=False)
    (reason,) = edited.reasons
    assert f"calibration run {flipped.run_id} cannot be recomputed from its labels" in reason
    assert "not the one sealed" in reason


def test_a_ppi_floor_is_recomputed_from_human_labels_not_read_from_metrics(registry, local_judge):
    policy = {**POLICY, "floors": {**POLICY["floors"], "faithfulness/ppi_ci_low": 0.8}}
    version, run_id = _candidate("ppi", _predictions(), local_judge)
    for key, value in {"faithfulness/ppi_mean": 0.95, "faithfulness/ppi_ci_low": 0.9,
                       "faithfulness/ppi_ci_high": 1.0}.items():
        registry.log_metric(run_id, key, value)  # no human label on the run: hand-logged

    decision = gate("ppi", version, policy, record=False)
    assert decision.exit_code == 1, decision.to_text()
    (failed,) = decision.failed_checks
    assert (failed.metric, failed.kind) == ("faithfulness", "floor ppi_ci_low")
    assert any(n.startswith(f"no PPI estimate of faithfulness on run {run_id}, recomputed from the human labels")
               for n in decision.notes)


# -- slices edited -----------------------------------------------------------------------------------
def test_an_edited_slice_table_is_refused(registry):
    version, run_id = _sliced_version("sliced", bad_hard=True)
    assert gate("sliced", version, SLICED_POLICY, record=False).exit_code == 1  # hard slice mrr 0.333
    slices = json.loads(_text(run_id, "rag_eval/slices.json"))
    slices["fields"]["difficulty"]["slices"]["hard"]["metrics"]["mrr"]["mean"] = 1.0
    registry.log_text(run_id, json.dumps(slices), "rag_eval/slices.json")

    decision = gate("sliced", version, SLICED_POLICY, record=False)
    assert decision.exit_code == 2, decision.to_text()
    assert f"run {run_id}: its slice table (rag_eval/slices.json) is not the one sealed" in decision.reasons[0]


# -- decide_on: test tests the mean ------------------------------------------------------------------
def test_decide_on_test_refuses_a_drop_of_the_mean_that_a_rank_test_let_through(registry, local_judge):
    """Six of fifteen answers wrong: faithfulness drops by 0.40, its CI well below the margin.
    The Wilcoxon test of the shifted differences (their pseudo-median) gave p 0.20; the mean's
    t-test rejects, and the CI alone refuses it."""
    policy = {**POLICY, "max_regression": {"faithfulness": 0.03}, "floors": {"faithfulness/mean": 0.5},
              "regression_test": {"decide_on": "test"}}
    v1, _ = _candidate("tested", _predictions(), local_judge)
    assert gate("tested", v1, policy).passed
    v2, _ = _candidate("tested", _predictions(n_bad=6), local_judge)
    decision = gate("tested", v2, policy, record=False)
    check = next(c for c in decision.checks if c.kind == "regression")
    assert not check.passed, decision.to_text()
    assert check.delta == pytest.approx(-0.4)
    assert "faithfulness regressed" in check.reason


# -- the honest paths --------------------------------------------------------------------------------
def test_a_real_improvement_still_promotes_on_sealed_runs(registry, local_judge):
    v1, r1 = _candidate("rag", _predictions(n_bad=2), local_judge)
    assert gate("rag", v1, POLICY).passed
    v2, r2 = _candidate("rag", _predictions(), local_judge)
    params = registry.get_run(r2).data.params
    assert {k for k in params if k.startswith("rag_eval.seal.")} == {
        "rag_eval.seal.rows_sha256", "rag_eval.seal.slices_sha256", "rag_eval.seal.lineage_sha256",
        "rag_eval.seal.directions"}
    assert json.loads(params["rag_eval.seal.directions"])["faithfulness"] == "higher"
    decision = gate("rag", v2, POLICY)
    assert decision.exit_code == 0, decision.to_text()
    assert not decision.notes[1:], decision.notes  # no notice: both runs are sealed
    assert _alias(registry, "rag") == v2 and _alias(registry, "rag", "previous_champion") == v1
    assert registry.get_registered_model("rag").tags["rag_eval.gate.alias.champion"] == v2


def test_a_run_logged_before_the_seal_gates_with_a_notice_or_is_refused_by_the_policy(registry, local_judge):
    _, r1 = _candidate("old", _predictions(), local_judge)
    old = _unsealed_copy(registry, r1)
    version = _version_of_run(registry, "old", old)
    decision = gate("old", version, POLICY, record=False)
    assert decision.exit_code == 0, decision.to_text()
    assert f"run {old} was logged before evaluations were sealed" in " ".join(decision.notes)

    refused = gate("old", version, {**POLICY, "require_seal": True}, record=False)
    assert refused.exit_code == 2
    assert "require_seal: true" in refused.reasons[0]


def test_an_unsealed_lineage_that_flips_a_direction_disagrees_with_the_metric_registry(registry, local_judge):
    _, r1 = _candidate("old", _predictions(), local_judge)
    lineage = json.loads(_text(r1, LINEAGE))
    for spec in lineage["metrics"]:
        if spec["name"] == "faithfulness":
            spec["greater_is_better"] = False
    old = _unsealed_copy(registry, r1, lineage=lineage)
    decision = gate("old", _version_of_run(registry, "old", old), POLICY, record=False)
    assert decision.exit_code == 2
    assert (f"run {old}: its lineage marks faithfulness lower-is-better, but the metric registry says "
            "higher-is-better") in decision.reasons[0]


# -- helpers: a run as versions before the seal logged it ---------------------------------------------
def _unsealed_copy(client, run_id: str, *, table_from: str | None = None, lineage: dict | None = None) -> str:
    """A copy of evaluation run ``run_id`` without the ``rag_eval.seal.*`` params, as the gate
    sees a run logged before the seal existed: the same params, tags, metrics and artifacts,
    its traces linked to the copy (``table_from``: another run's table and metrics instead of
    its own)."""
    from mlflow.entities import Metric, Param, RunTag

    run = client.get_run(run_id)
    copy = client.create_run(run.info.experiment_id).info.run_id
    now = int(time.time() * 1000)
    metrics = client.get_run(table_from or run_id).data.metrics
    client.log_batch(copy, metrics=[Metric(k, v, now, 0) for k, v in metrics.items()],
                     params=[Param(k, v) for k, v in run.data.params.items() if not k.startswith("rag_eval.seal.")],
                     tags=[RunTag(k, v) for k, v in run.data.tags.items() if not k.startswith("mlflow.")])
    client.log_text(copy, _text(table_from or run_id, TABLE), TABLE)
    client.log_text(copy, json.dumps(lineage) if lineage else _text(run_id, LINEAGE), LINEAGE)
    traces = client.search_traces(locations=[run.info.experiment_id], run_id=run_id, include_spans=False)
    client.link_traces_to_run([t.info.trace_id for t in traces], run_id=copy)
    client.set_terminated(copy)
    return copy


def _version_of_run(client, name: str, run_id: str) -> str:
    """A version registered from run ``run_id`` (``mv.run_id``: its own evaluation)."""
    if not client.search_registered_models(f"name = '{name}'"):
        client.create_registered_model(name)
    return str(client.create_model_version(name, f"runs:/{run_id}/model", run_id=run_id).version)
