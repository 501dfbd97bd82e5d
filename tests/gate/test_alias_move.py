"""The alias moves by compare-and-set at the moment of the move (issue 44), on a real sqlite
store: a person who moves ``@champion`` while the gate records is never overwritten, and a
version's tags say ``passed`` only once the alias has moved (``pending`` before).

A person's move is interleaved where it would happen, from a second client on the same store:
the gate's client is a real ``MlflowClient`` whose tag writes also make that move."""

from __future__ import annotations

import pytest
from gate_support import POLICY, _candidate, _predictions, _register
from mlflow import MlflowClient

from mlflow_rag_eval.gate import gate

pytest_plugins = ["gate_support"]  # its fixture: registry, a fresh sqlite registry per test


class _PersonMovesTheAlias(MlflowClient):
    """An MlflowClient during whose first ``rag_eval.gate`` version tag a person moves the alias."""

    def __init__(self, to_version: str):
        super().__init__()
        self.to_version, self.moved = to_version, False

    def set_model_version_tag(self, name, version=None, key=None, value=None, stage=None):
        super().set_model_version_tag(name, version, key, value, stage)
        if key == "rag_eval.gate" and not self.moved:
            self.moved = True
            MlflowClient().set_registered_model_alias(name, "champion", self.to_version)


class _Crash(BaseException):
    """kill -9, as far as the gate can tell: nothing after it runs."""


class _DiesMovingTheAlias(MlflowClient):
    """An MlflowClient whose process dies as it moves the champion alias; it keeps the version's
    ``rag_eval.gate`` tag at that moment."""

    def set_registered_model_alias(self, name, alias, version):
        self.tag_at_move = self.get_model_version(name, version).tags.get("rag_eval.gate")
        raise _Crash


def test_a_person_moving_the_alias_while_the_gate_records_is_not_overwritten(registry, local_judge):
    v1, _ = _candidate("rag", _predictions(), local_judge)
    assert gate("rag", v1, POLICY).passed
    v3, _ = _candidate("rag", _predictions(), local_judge)
    v4, _ = _register("rag")  # the person's choice

    decision = gate("rag", v3, POLICY, client=_PersonMovesTheAlias(v4))
    assert decision.exit_code == 2, decision.to_text()
    assert str(registry.get_model_version_by_alias("rag", "champion").version) == v4
    reason = decision.reasons[0]
    assert f"alias 'champion' of 'rag' moved to v{v4} (not by a gate" in reason
    assert f"while this gate recorded (the move was aborted), after this gate read it on v{v1}" in reason
    assert f"v{v3} is tagged rag_eval.gate=aborted" in reason
    assert registry.get_model_version("rag", v3).tags["rag_eval.gate"] == "aborted"
    assert not registry.search_registered_models("name = 'rag.rag_eval-promotion-lease'")


def test_a_version_is_pending_until_the_alias_moved_and_stays_so_if_the_gate_dies(registry, local_judge):
    v1, _ = _candidate("rag", _predictions(), local_judge)
    dying = _DiesMovingTheAlias()
    with pytest.raises(_Crash):
        gate("rag", v1, POLICY, client=dying)
    assert dying.tag_at_move == "pending"
    assert registry.get_model_version("rag", v1).tags["rag_eval.gate"] == "pending"
    assert not registry.get_registered_model("rag").aliases

    done = gate("rag", v1, POLICY)
    assert done.exit_code == 0, done.to_text()
    assert registry.get_model_version("rag", v1).tags["rag_eval.gate"] == "passed"
    assert str(registry.get_model_version_by_alias("rag", "champion").version) == v1
