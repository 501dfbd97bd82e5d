"""A policy as a new user writes it (issue 44), on a real sqlite store: floors alone over a
champion say that no regression check ran and refuse until the policy says ``regression:
none``; a misspelled metric or statistic is an unusable policy (exit 2, did you mean), not a
refused candidate; the champion line names the alias holder, the candidate included."""

from __future__ import annotations

import pytest
from gate_support import POLICY, _candidate, _predictions

from mlflow_rag_eval.gate import PolicyError, gate, load_policy

pytest_plugins = ["gate_support"]  # its fixture: registry, a fresh sqlite registry per test

FLOORS_ONLY = {"floors": {"hit@5/mean": 0.9}, "min_scored_rows": 10, "calibration": {"required": False}}


def test_floors_alone_over_a_champion_refuse_until_the_policy_says_regression_none(registry, local_judge):
    v1, _ = _candidate("rag", _predictions(), local_judge)
    assert gate("rag", v1, POLICY).passed
    v2, _ = _candidate("rag", _predictions(n_bad=1), local_judge)  # worse than v1, hit@5 still 1.0

    refused = gate("rag", v2, FLOORS_ONLY)
    assert refused.exit_code == 1, refused.to_text()
    assert refused.reasons == [
        f"v{v1} holds alias 'champion', but the policy has no regression check (max_regression): floors alone "
        "would promote a version worse than the champion; add max_regression for the metrics that matter, or "
        "state regression: none to promote without comparing"]
    assert "regression check: none: the policy has no max_regression" in refused.to_text()
    assert str(registry.get_model_version_by_alias("rag", "champion").version) == v1

    stated = gate("rag", v2, {**FLOORS_ONLY, "regression": "none"})
    assert stated.exit_code == 0, stated.to_text()
    assert f"regression check: none: the policy says regression: none (champion v{v1})" in stated.to_text()
    compared = gate("rag", v1, POLICY, record=False)
    assert f"regression check: vs v{v2} on faithfulness, mrr, ndcg_at_10 (decide_on point)" in compared.to_text()


def test_regression_none_beside_max_regression_is_refused():
    with pytest.raises(PolicyError, match="regression: says none, but max_regression names faithfulness"):
        load_policy({**POLICY, "max_regression": {"faithfulness": 0.03}, "regression": "none"})


@pytest.mark.parametrize(("floors", "expected"), [
    ({"faithfulnes/mean": 0.9}, "floors.faithfulnes/mean: unknown metric 'faithfulnes' (did you mean 'faithfulness'?)"),
    ({"faithfulness/maen": 0.9}, "floors.faithfulness/maen: unknown statistic 'maen' (did you mean 'mean'?)"),
])
def test_a_misspelled_metric_or_statistic_is_an_unusable_policy(registry, local_judge, floors, expected):
    version, _ = _candidate("rag", _predictions(), local_judge)
    decision = gate("rag", version, {**POLICY, "floors": floors}, record=False)
    assert decision.exit_code == 2, decision.to_text()
    assert decision.reasons[0].startswith(f"gate policy: {expected}"), decision.reasons


def test_a_misspelled_policy_key_gets_the_closest_key_at_its_level():
    with pytest.raises(PolicyError, match=r"max_regresion: unknown key \(did you mean 'max_regression' or .*\); known: "):
        load_policy({**POLICY, "max_regresion": {"faithfulness": 0.03}})
    with pytest.raises(PolicyError, match=r"calibration.requried: unknown key \(did you mean 'required'\?\)"):
        load_policy({**POLICY, "calibration": {"requried": False}})
    with pytest.raises(PolicyError, match=r"zzz: unknown key; known: "):  # nothing close: no guess
        load_policy({**POLICY, "zzz": 1})


def test_a_misspelled_metric_under_max_regression_or_require_metrics_is_refused():
    with pytest.raises(PolicyError, match=r"max_regression.ndgc@10: unknown metric 'ndgc@10' \(did you mean 'ndcg@10'"):
        load_policy({**POLICY, "max_regression": {"ndgc@10": 0.02}})
    with pytest.raises(PolicyError, match=r"require_metrics\[0\]: unknown metric 'faithfulnes'"):
        load_policy({**POLICY, "require_metrics": ["faithfulnes"]})
    assert load_policy({"require_metrics": ["politeness"]}).gated_metrics == ["politeness"]  # a rubric's name


def test_the_champion_line_names_the_alias_holder_even_when_it_is_the_candidate(registry, local_judge):
    v1, _ = _candidate("rag", _predictions(), local_judge)
    first = gate("rag", v1, POLICY)
    assert "champion: none (first version: no version holds alias 'champion')" in first.to_text()
    again = gate("rag", v1, POLICY, record=False)
    assert (f"champion: none to compare with: the candidate v{v1} already holds alias 'champion'"
            in again.to_text()), again.to_text()
    assert again.alias_holder == v1
    v2, _ = _candidate("rag", _predictions(), local_judge)
    assert f"champion: v{v1} (holds alias 'champion'; run " in gate("rag", v2, POLICY, record=False).to_text()
