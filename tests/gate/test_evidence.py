"""The gate's evidence (``gate/decision.py``, ``tracking/search.py``): it decides only on finished,
live evaluation runs, and on figures recomputed from the run's per-row table, not on run metrics
anyone can overwrite. Through the CLI, against a real sqlite registry: exit 0 / 1 / 2 exactly."""

from __future__ import annotations

import hashlib
import json
import math

import mlflow
import pytest
from click.testing import CliRunner
from gate_support import POLICY, _decision_json, _evaluate, _predictions

from mlflow_rag_eval.cli import main

pytest_plugins = ["gate_support"]  # its fixture: registry, a fresh sqlite registry per test


def _from_run(name: str, data, judge, *, logged_model: bool = True) -> tuple[str, str]:
    """A version registered from its evaluation run (``create_model_version(..., run_id=R)``):
    (version, run id). ``logged_model`` False: the version's source is ``runs:/R/model`` (no
    logged model to search by), so only its own ``mv.run_id`` names the evaluation."""
    client = mlflow.MlflowClient()
    model_id = mlflow.create_external_model(name="rag").model_id
    run_id = _evaluate(model_id, data, judge)
    if not client.search_registered_models(f"name = '{name}'"):
        client.create_registered_model(name)
    source = f"models:/{model_id}" if logged_model else f"runs:/{run_id}/model"
    return str(client.create_model_version(name, source, run_id=run_id).version), run_id


def _policy(tmp_path, policy: dict = POLICY):
    path = tmp_path / "gate.yaml"
    path.write_text(json.dumps(policy))  # JSON is YAML
    return path


def _gate(model: str, version: str, policy, *extra):
    result = CliRunner().invoke(main, ["gate", "--model", model, "--candidate", version, "--policy", str(policy),
                                       "--tracking-uri", mlflow.get_tracking_uri(), *extra])
    assert "Traceback" not in result.output, result.output
    return result


@pytest.fixture
def quiet_downloads(monkeypatch):
    """MLflow draws a progress bar on stderr per artifact download: a refusal made after the
    rows table was read is then one line after the bars, which this leaves out."""
    monkeypatch.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")


def _one_line(result) -> str:
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    return lines[0]


def _set_state(client, run_id: str, state: str) -> None:
    if state == "deleted":
        client.delete_run(run_id)
    elif state in ("FAILED", "KILLED"):
        client.set_terminated(run_id, state)
    else:  # RUNNING, SCHEDULED: a process killed before it ended the run
        client.update_run(run_id, status=state)


def _said(state: str) -> str:
    return "is deleted (lifecycle_stage deleted)" if state == "deleted" else f"is {state}, not FINISHED"


# -- the run's state ------------------------------------------------------------------------------
@pytest.mark.parametrize("state", ["deleted", "FAILED", "KILLED", "RUNNING", "SCHEDULED"])
def test_a_candidate_whose_evaluation_run_is_not_finished_and_live_is_unusable(registry, local_judge, tmp_path,
                                                                             state):
    version, run_id = _from_run("states", _predictions(), local_judge)
    policy = _policy(tmp_path)
    assert _gate("states", version, policy, "--dry-run").exit_code == 0  # finished and live: it passes
    _set_state(registry, run_id, state)
    result = _gate("states", version, policy)
    assert result.exit_code == 2
    line = _one_line(result)
    assert f"the newest evaluation run {run_id} of states v{version}" in line and _said(state) in line
    assert "rag_eval.gate" not in registry.get_model_version("states", version).tags  # nothing recorded
    with pytest.raises(mlflow.exceptions.MlflowException):
        registry.get_model_version_by_alias("states", "champion")


def test_the_versions_own_run_obeys_the_same_rule(registry, local_judge, tmp_path):
    """No logged model to search by: ``mv.run_id`` names the evaluation, and a failed one is
    not judged."""
    version, run_id = _from_run("own", _predictions(), local_judge, logged_model=False)
    policy = _policy(tmp_path)
    assert _gate("own", version, policy, "--dry-run").exit_code == 0
    registry.set_terminated(run_id, "FAILED")
    result = _gate("own", version, policy)
    assert result.exit_code == 2 and f"run {run_id} of own v{version} is FAILED, not FINISHED" in _one_line(result)


def test_the_newest_evaluation_is_judged_not_an_older_finished_one(registry, local_judge, tmp_path):
    """A newer evaluation that failed, or was deleted, does not let an older one be judged in
    its place: that would let whoever can delete runs choose the evidence."""
    client = mlflow.MlflowClient()
    model_id = mlflow.create_external_model(name="rag").model_id
    client.create_registered_model("twice")
    version = str(client.create_model_version("twice", f"models:/{model_id}").version)
    _evaluate(model_id, _predictions(), local_judge)
    newest = _evaluate(model_id, _predictions(), local_judge)
    policy = _policy(tmp_path)
    for state in ("FAILED", "deleted"):
        _set_state(registry, newest, state)
        result = _gate("twice", version, policy)
        assert result.exit_code == 2, result.output
        assert f"the newest evaluation run {newest} of twice v{version} {_said(state)}" in _one_line(result)
    again = _evaluate(model_id, _predictions(), local_judge)  # evaluating again is the way out
    result = _gate("twice", version, policy)
    assert result.exit_code == 0, result.output
    assert f"candidate run: {again}" in result.output


def test_a_deleted_champion_run_is_not_compared_with(registry, local_judge, tmp_path):
    champion, champion_run = _from_run("champ", _predictions(), local_judge)
    policy = _policy(tmp_path)
    assert _gate("champ", champion, policy).exit_code == 0  # v1 takes the alias
    candidate, _ = _from_run("champ", _predictions(), local_judge)
    assert _gate("champ", candidate, policy, "--dry-run").exit_code == 0
    registry.delete_run(champion_run)
    result = _gate("champ", candidate, policy)
    assert result.exit_code == 2
    line = _one_line(result)
    assert f"the champion's evaluation run {champion_run} of champ v{champion} is deleted" in line
    assert str(registry.get_model_version_by_alias("champ", "champion").version) == champion
    registry.restore_run(champion_run)
    assert _gate("champ", candidate, policy).exit_code == 0


# -- the run's figures ----------------------------------------------------------------------------
def _flaky_judge():
    """A scripted LLM judge that cannot decide (a twice-unparsable reply: ParseError) on answers
    marked "(flaky)" and supports every other answer."""
    from mlflow_rag_eval.judges.llm.judge import LLMJudge
    from mlflow_rag_eval.judges.providers.scripted import ScriptedBackend

    def reply(variables):
        if "(flaky)" in variables["text"]:
            return "Sorry, I am not sure."
        return {"claims": [{"claim": variables["text"], "supported": True, "reason": "stated"}]}

    return LLMJudge(ScriptedBackend({"claims_verdicts": reply}), cache=False, backoff_base=0.01, backoff_max=0.05)


def test_an_overwritten_error_count_is_refused_as_altered(registry, tmp_path, quiet_downloads):
    data = _predictions()
    data.loc[:6, "answer"] = data.loc[:6, "answer"] + " (flaky)"  # 7 of 15 rows fail
    version, run_id = _from_run("altered", data, _flaky_judge())
    policy = _policy(tmp_path, {"require_metrics": ["faithfulness"], "min_scored_rows": 5,
                                "calibration": {"required": False}})
    result = _gate("altered", version, policy, "--dry-run")
    assert result.exit_code == 1 and "faithfulness: error rate 0.467 (7/15) > 0.05" in result.output

    registry.log_metric(run_id, "faithfulness/n_error", 0)
    result = _gate("altered", version, policy)
    assert result.exit_code == 2
    assert _one_line(result).endswith(
        f"run {run_id}: logged faithfulness/n_error=0 but its rows table has 7 errors; "
        "the run was altered after it was evaluated")
    assert "rag_eval.gate" not in registry.get_model_version("altered", version).tags


def test_an_infinite_mean_is_refused_and_float_noise_is_not(registry, local_judge, tmp_path, quiet_downloads):
    version, run_id = _from_run("inf", _predictions(n_bad=8), local_judge)
    policy = _policy(tmp_path)
    result = _gate("inf", version, policy)
    assert result.exit_code == 1 and f"faithfulness/mean = {7 / 15:.3f} < floor 0.6" in result.output

    # a logged figure within float noise of the table's is the same figure; the table's decides
    registry.log_metric(run_id, "faithfulness/mean", 7 / 15 * (1 + 1e-13))
    result = _gate("inf", version, policy)
    assert result.exit_code == 1 and f"faithfulness/mean = {7 / 15:.3f} < floor 0.6" in result.output

    registry.log_metric(run_id, "faithfulness/mean", math.inf)  # sqlite keeps 1.8e308
    result = _gate("inf", version, policy)
    assert result.exit_code == 2
    line = _one_line(result)
    assert f"run {run_id}: logged faithfulness/mean=inf but its rows table gives {7 / 15:.6g}" in line
    assert "the run was altered after it was evaluated" in line


def test_logged_ppi_figures_are_not_believed(registry, local_judge, tmp_path, quiet_downloads):
    """PPI figures are not in the rows table (``mlflow-rag-eval ppi`` logs them later, from
    human labels): the gate recomputes them from the labels on the run's traces, so figures
    logged on a run nobody labelled (finite or not) are not an estimate: the floor fails."""
    version, run_id = _from_run("ppi", _predictions(), local_judge)
    policy = _policy(tmp_path, {**POLICY, "floors": {"faithfulness/ppi_mean": 0.5}})
    for value in (0.9, math.inf):
        registry.log_metric(run_id, "faithfulness/ppi_mean", value)
        result = _gate("ppi", version, policy, "--dry-run")
        assert result.exit_code == 1, result.output
        assert ("faithfulness/ppi_mean was not logged (the gate recomputes it from the human labels on the run's "
                "traces, and found too few: see the notes)") in result.output


def test_the_decision_records_the_digest_of_each_rows_table(registry, local_judge, tmp_path):
    champion, champion_run = _from_run("digest", _predictions(), local_judge)
    policy = _policy(tmp_path)
    assert _gate("digest", champion, policy).exit_code == 0
    candidate, candidate_run = _from_run("digest", _predictions(), local_judge)
    assert _gate("digest", candidate, policy).exit_code == 0

    def sha256(run_id: str) -> str:
        path = mlflow.artifacts.download_artifacts(f"runs:/{run_id}/eval_results_table.json", dst_path=str(tmp_path))
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()

    logged = _decision_json(registry, candidate_run)
    assert logged["rows_table_sha256"] == {"candidate": sha256(candidate_run), "champion": sha256(champion_run)}
    assert _decision_json(registry, champion_run)["rows_table_sha256"] == {"candidate": sha256(champion_run)}
