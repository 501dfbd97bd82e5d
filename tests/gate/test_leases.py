"""A promotion lease someone edited (issue 44), on a real sqlite store: an expiry that is no
number, not finite, or further ahead than any gate writes is named (model, holder, value) and
taken as expired, never an OS or parsing error; a live lease refuses naming the command that
clears it."""

from __future__ import annotations

import time

import pytest
from gate_support import POLICY, _candidate, _predictions

from mlflow_rag_eval.gate import gate
from mlflow_rag_eval.gate.promotion import lease_name

pytest_plugins = ["gate_support"]  # its fixture: registry, a fresh sqlite registry per test

LEASE = "rag.rag_eval-promotion-lease"


def _lease(client, expires_at: str) -> None:
    client.create_registered_model(lease_name("rag"), tags={
        "rag_eval.lease.holder": "h-dead", "rag_eval.lease.model": "rag", "rag_eval.lease.version": "9",
        "rag_eval.lease.owner": "ci-box pid 1", "rag_eval.lease.expires_at": expires_at})


@pytest.mark.parametrize(("expires_at", "why"), [
    ("1e18", "is further ahead than any gate writes"),
    ("abc", "is not a number"),
    ("inf", "is not a time"),
    ("nan", "is not a time"),
    ("", "is not a number"),
])
def test_an_unreadable_or_absurd_lease_is_named_and_taken_as_expired(registry, local_judge, expires_at, why):
    version, _ = _candidate("rag", _predictions(), local_judge)
    _lease(registry, expires_at)

    decision = gate("rag", version, POLICY)
    assert decision.exit_code == 0, decision.to_text()
    note = next(n for n in decision.notes if n.startswith(f"the promotion lease {LEASE!r}"))
    assert "of 'rag' (holder h-dead, owner ci-box pid 1)" in note
    assert f"expires_at {expires_at!r} {why}" in note
    assert not registry.search_registered_models(f"name = '{LEASE}'")  # released after the move
    assert str(registry.get_model_version_by_alias("rag", "champion").version) == version


def test_a_live_lease_refuses_naming_its_holder_and_the_command_that_clears_it(registry, local_judge):
    version, _ = _candidate("rag", _predictions(), local_judge)
    _lease(registry, f"{time.time() + 120:.3f}")

    decision = gate("rag", version, POLICY)
    assert decision.exit_code == 2, decision.to_text()
    assert "the gate of v9 (ci-box pid 1, holder h-dead) holds its promotion lease" in decision.reasons[0]
    assert f"if that gate died, clear it: MlflowClient().delete_registered_model({LEASE!r})" in decision.reasons[0]
    assert not registry.get_registered_model("rag").aliases
