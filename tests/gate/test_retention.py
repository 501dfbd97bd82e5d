"""Retention is not tampering (issue 44), on a real sqlite store: a retention job deletes the
traces of the champion's and the candidate's evaluations (MLflow's ``delete_traces``); their
sealed tables still gate, the deleted trace ids counted in the notes, unless the policy says
``require_traces: true``. A trace id that exists under another run stays refused
(``test_bound_evidence.py``)."""

from __future__ import annotations

from gate_support import POLICY, _candidate, _predictions

from mlflow_rag_eval.gate import gate

pytest_plugins = ["gate_support"]  # its fixture: registry, a fresh sqlite registry per test


def _delete_traces(client, run_id: str) -> int:
    run = client.get_run(run_id)
    ids = [t.info.trace_id for t in client.search_traces(locations=[run.info.experiment_id], run_id=run_id,
                                                         include_spans=False)]
    assert len(ids) == 15
    return client.delete_traces(run.info.experiment_id, trace_ids=ids)


def test_traces_deleted_by_retention_still_gate_a_sealed_run(registry, local_judge):
    v1, r1 = _candidate("rag", _predictions(), local_judge)
    assert gate("rag", v1, POLICY).passed
    v3, r3 = _candidate("rag", _predictions(), local_judge)
    assert _delete_traces(registry, r1) == 15 and _delete_traces(registry, r3) == 15

    decision = gate("rag", v3, POLICY, record=False)
    assert decision.exit_code == 0, decision.to_text()
    for run_id in (r3, r1):
        assert any(n.startswith(f"run {run_id}: 15 of the 15 trace ids of its rows table (first: ")
                   and "are deleted (retention: they exist nowhere in the store)" in n
                   for n in decision.notes), decision.notes

    strict = gate("rag", v3, {**POLICY, "require_traces": True}, record=False)
    assert strict.exit_code == 2, strict.to_text()
    assert f"run {r3}: 15 of the 15 trace ids" in strict.reasons[0]
    assert "the policy says require_traces: true" in strict.reasons[0]
