"""The pytest plugin (``mlflow_rag_eval/pytest_plugin.py``): the assertion helpers' messages,
the ``--rag-gate-policy`` option and the fixtures, loaded by ``-p`` and by its entry point."""

from __future__ import annotations

import pytest

from mlflow_rag_eval.gate import GateDecision
from mlflow_rag_eval.gate.checks import Check
from mlflow_rag_eval.pytest_plugin import assert_gate_passes, assert_metrics_meet

pytest_plugins = ["pytester"]


def test_the_assertion_helpers_explain_each_failed_check():
    checks = [
        Check("faithfulness", "floor mean", 0.71, 0.85, False, "faithfulness/mean = 0.710 < floor 0.85", delta=-0.12),
        Check("faithfulness", "regression", -0.12, -0.03, False, "faithfulness regressed: ...", delta=-0.12),
        Check("mrr", "floor mean", 0.9, 0.3, True, delta=0.01),
    ]
    decision = GateDecision("rag", "7", False, 1, reasons=[c.reason for c in checks if c.reason], checks=checks)
    with pytest.raises(AssertionError) as info:
        assert_gate_passes(decision)
    text = str(info.value)
    assert text.splitlines()[0] == "RAG gate failed for rag v7 (exit 1, 2 of 3 checks failed)"
    assert "faithfulness" in text and "0.7100" in text and "0.8500" in text and "-0.1200" in text
    assert "mrr" not in text
    assert_gate_passes(GateDecision("rag", "8", True, 0))

    metrics = {"faithfulness/mean": 0.8, "faithfulness/n_scored": 40, "faithfulness/n_error": 5}
    policy = {"require_metrics": ["faithfulness", "context_recall"], "max_error_rate": 0.05,
              "floors": {"faithfulness/mean": 0.85}}
    with pytest.raises(AssertionError) as info:
        assert_metrics_meet(metrics, policy)
    text = str(info.value)
    assert "3 of 4 checks failed" in text
    assert "context_recall was not logged by the evaluation" in text
    assert "error rate 0.111 (5/45) > 0.05" in text and "faithfulness/mean = 0.800 < floor 0.85" in text
    assert_metrics_meet({**metrics, "faithfulness/n_error": 0, "faithfulness/mean": 0.9},
                        {"require_metrics": ["faithfulness"], "floors": {"faithfulness/mean": 0.85}})


def test_the_pytest_plugin_option_and_fixtures(pytester, monkeypatch):
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")  # load it once, by -p, installed or not
    pytester.makefile(".yaml", gate="require_metrics: [faithfulness]\nfloors: {faithfulness/mean: 0.9}\n")
    pytester.makepyfile("""
        from mlflow_rag_eval.pytest_plugin import assert_metrics_meet

        def test_policy(rag_gate_policy):
            assert rag_gate_policy.require_metrics == ("faithfulness",)
            assert_metrics_meet({"faithfulness/mean": 0.5, "faithfulness/n_scored": 20}, rag_gate_policy)

        def test_gate_fixture(rag_gate):
            assert callable(rag_gate)
    """)
    result = pytester.runpytest_inprocess("-p", "mlflow_rag_eval.pytest_plugin", "--rag-gate-policy", "gate.yaml")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*faithfulness/mean = 0.500 < floor 0.9*"])
    result = pytester.runpytest_inprocess("-p", "mlflow_rag_eval.pytest_plugin", "-k", "policy")
    result.stdout.fnmatch_lines(["*no gate policy: pass --rag-gate-policy*"])


def test_the_plugin_loads_by_its_entry_point_and_fails_an_unusable_policy_in_one_line(pytester, monkeypatch):
    """As docs/how-to/gate-ci.md shows it: no -p, fixtures taken as arguments, helpers imported."""
    monkeypatch.delenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    pytester.makefile(".yaml", gate="require_metrics: [faithfulness]\nfloors: {faithfulness/mean: 0.9}\n",
                      empty="# nothing yet\n")
    pytester.makepyfile("""
        from mlflow_rag_eval.pytest_plugin import assert_metrics_meet

        def test_meets(rag_gate_policy):
            assert_metrics_meet({"faithfulness/mean": 0.95, "faithfulness/n_scored": 40,
                                 "faithfulness/n_error": 0}, rag_gate_policy)

        def test_gate_fixture(rag_gate):
            assert callable(rag_gate)
    """)
    result = pytester.runpytest_subprocess("--rag-gate-policy", "gate.yaml", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    result = pytester.runpytest_subprocess("--rag-gate-policy", "empty.yaml", "-p", "no:cacheprovider", "-k", "meets")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*gate policy: empty.yaml: the policy file is empty*"])
    result.stdout.no_fnmatch_line("*Traceback*")
