"""Which evaluation counts (issue 44), on a real sqlite store: chosen by what MLflow lets no one
change (params, run inputs, the version's run id), never by tags; evaluations of one model that
disagree are refused, not resolved by recency, unless the policy names a rule (``evidence:
version-run`` or ``evidence: newest``).

Each attack made the gate promote a version it refuses untampered: v1 holds ``champion``, v2
answers 6 of 15 rows wrongly."""

from __future__ import annotations

import mlflow
import pytest
from gate_support import POLICY, _evaluate, _predictions, _register

from mlflow_rag_eval.gate import gate

pytest_plugins = ["gate_support"]  # its fixture: registry, a fresh sqlite registry per test

NEWEST = {**POLICY, "evidence": "newest"}


def _alias(client, name: str = "rag", alias: str = "champion") -> str:
    return str(client.get_model_version_by_alias(name, alias).version)


def _champion(client, judge) -> tuple[str, str, str]:
    """v1, all good, promoted: (version, model id, run id)."""
    v1, model_id = _register("rag")
    run_id = _evaluate(model_id, _predictions(), judge)
    assert gate("rag", v1, POLICY).passed
    return v1, model_id, run_id


def _good_then_bad(judge) -> tuple[str, str, str, str]:
    """v2 with an older good evaluation and a newer, honest bad one (6 of 15 wrong)."""
    v2, model_id = _register("rag")
    good = _evaluate(model_id, _predictions(), judge)
    bad = _evaluate(model_id, _predictions(n_bad=6), judge)
    return v2, model_id, good, bad


@pytest.mark.parametrize("edit", ["delete rag_eval.evaluated", "rewrite rag_eval.model_id"])
def test_a_tag_edited_on_the_newer_evaluation_does_not_choose_the_older(registry, local_judge, edit):
    v1, _, _ = _champion(registry, local_judge)
    v2, _, good, bad = _good_then_bad(local_judge)
    if edit == "delete rag_eval.evaluated":
        registry.delete_tag(bad, "rag_eval.evaluated")
    else:
        registry.set_tag(bad, "rag_eval.model_id", "m-00000000000000000000000000000000")

    judged = gate("rag", v2, NEWEST)  # the newest evaluation counts: the tag did not hide it
    assert (judged.exit_code, judged.candidate_run_id) == (1, bad), judged.to_text()
    refused = gate("rag", v2, POLICY)  # the default: the two evaluations disagree
    assert refused.exit_code == 2, refused.to_text()
    assert f"run {bad} (the newest) and run {good} give faithfulness mean 0.600 vs 1.000" in refused.reasons[0]
    assert _alias(registry) == v1


def test_an_extra_evaluation_from_answers_the_version_never_gave_is_refused(registry, local_judge):
    v1, v1_model, v1_run = _champion(registry, local_judge)
    v2, model_id = _register("rag")
    own = _evaluate(model_id, _predictions(n_bad=6), local_judge)
    forged = _evaluate(model_id, _predictions(), local_judge)  # the public API, good answers, newer

    decision = gate("rag", v2, POLICY)
    assert decision.exit_code == 2, decision.to_text()
    reason = decision.reasons[0]
    assert f"the evaluations of rag v{v2} (the candidate) disagree: run {forged} (the newest) and run {own}" in reason
    assert "evidence: version-run" in reason and "evidence: newest" in reason
    assert _alias(registry) == v1
    # v2 registered from neither run: version-run has no run to trust
    unregistered = gate("rag", v2, {**POLICY, "evidence": "version-run"}, record=False)
    assert unregistered.exit_code == 2
    assert f"rag v{v2} was not registered from one of its evaluation runs" in unregistered.reasons[0]
    # both models registered from their own evaluation runs: only those runs count
    champion = str(registry.create_model_version("rag", f"models:/{v1_model}", run_id=v1_run).version)
    registry.set_registered_model_alias("rag", "champion", champion)
    v3 = str(registry.create_model_version("rag", f"models:/{model_id}", run_id=own).version)
    registered = gate("rag", v3, {**POLICY, "evidence": "version-run"}, record=False)
    assert (registered.exit_code, registered.candidate_run_id) == (1, own), registered.to_text()


def test_a_newer_worse_evaluation_of_the_champion_does_not_let_a_regression_pass(registry, local_judge):
    v1, model_id, honest = _champion(registry, local_judge)
    v2, v2_model = _register("rag")
    _evaluate(v2_model, _predictions(n_bad=4), local_judge)  # regressed: refused against v1's run
    assert gate("rag", v2, POLICY, record=False).exit_code == 1
    worse = _evaluate(model_id, _predictions(n_bad=6), local_judge)  # of v1's model, newer, worse than v2

    decision = gate("rag", v2, POLICY)
    assert decision.exit_code == 2, decision.to_text()
    assert (f"the evaluations of rag v{v1} (the champion) disagree: run {worse} (the newest) and run {honest}"
            in decision.reasons[0])
    assert _alias(registry) == v1
    newest = gate("rag", v2, NEWEST, record=False)  # the old rule, named: trusts every writer
    assert (newest.exit_code, newest.champion_run_id) == (0, worse), newest.to_text()


def test_evaluations_that_agree_gate_as_one(registry, local_judge):
    """An evaluation repeated (the same answers, the same judge) is no disagreement."""
    _champion(registry, local_judge)
    v2, model_id = _register("rag")
    first = _evaluate(model_id, _predictions(), local_judge)
    again = _evaluate(model_id, _predictions(), local_judge)

    decision = gate("rag", v2, POLICY, record=False)
    assert (decision.exit_code, decision.candidate_run_id) == (0, again), decision.to_text()
    assert first != again


def test_a_run_whose_evaluated_tag_was_deleted_is_still_an_evaluation(registry, local_judge):
    """A version registered from its evaluation run: the run is found by its params."""
    v1, _, run_id = _champion(registry, local_judge)
    registry.delete_tag(run_id, "rag_eval.evaluated")
    again = gate("rag", v1, POLICY, record=False)
    assert (again.exit_code, again.candidate_run_id) == (0, run_id), again.to_text()
    assert mlflow.get_run(run_id).data.params["rag_eval.metrics"]
