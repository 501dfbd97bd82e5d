"""pytest plugin: gate a model version, or a run's metrics, from a test suite.

Registered through the ``pytest11`` entry point (name ``mlflow_rag_eval``), so it loads in
every pytest session of an environment where the package is installed: it imports nothing heavy
until used. Where plugin autoloading is off (``PYTEST_DISABLE_PLUGIN_AUTOLOAD``), load it with
``-p mlflow_rag_eval.pytest_plugin`` or ``pytest_plugins = ["mlflow_rag_eval.pytest_plugin"]``
in a top-level ``conftest.py``.

The fixtures come from the plugin: a test names them as arguments, it never imports them. The
assertion helpers are plain functions: a test imports them from this module.

Option ``--rag-gate-policy PATH`` (or ini ``rag_gate_policy``) names the policy; fixtures:

- ``rag_gate_policy``: the parsed :class:`~mlflow_rag_eval.gate.GatePolicy` (fails the test
  when no policy is configured, or when it is unusable, with one line naming the problem: a
  gate that silently skips is no gate);
- ``rag_gate``: ``rag_gate(model, version, policy=None, *, record=False, **gate_kwargs)``
  runs :func:`~mlflow_rag_eval.gate.gate`, as a dry run by default (tests should not move
  aliases unless asked to).

Assertion helpers, usable without the plugin::

    from mlflow_rag_eval.pytest_plugin import assert_gate_passes, assert_metrics_meet

    def test_candidate_meets_the_gate(rag_gate):
        assert_gate_passes(rag_gate("rag-pipeline", os.environ["CANDIDATE_VERSION"]))

    def test_eval_meets_floors(rag_gate_policy):
        result = mlflow.models.evaluate(..., model_type="rag", evaluators="rag")
        assert_metrics_meet(result, rag_gate_policy)   # a run id or a metrics dict work too

Both fail with one line per failed check: metric, check, value, threshold, delta vs champion.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

__all__ = ["assert_gate_passes", "assert_metrics_meet"]


def pytest_addoption(parser) -> None:
    group = parser.getgroup("rag-eval", "mlflow-rag-eval promotion gate")
    group.addoption("--rag-gate-policy", default=None, metavar="PATH",
                    help="gate policy YAML for the rag_gate / rag_gate_policy fixtures")
    parser.addini("rag_gate_policy", "gate policy YAML for the rag_gate fixtures", default=None)


@pytest.fixture
def rag_gate_policy(request):
    """The gate policy named by ``--rag-gate-policy`` or the ``rag_gate_policy`` ini value."""
    from mlflow_rag_eval.gate import PolicyError, load_policy

    path = request.config.getoption("--rag-gate-policy") or request.config.getini("rag_gate_policy")
    if not path:
        pytest.fail("no gate policy: pass --rag-gate-policy PATH or set rag_gate_policy in the ini file",
                    pytrace=False)
    try:
        return load_policy(path)
    except PolicyError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture
def rag_gate(request):
    """A function running the gate with the configured policy (a dry run unless record=True)."""
    from mlflow_rag_eval.gate import gate

    def run(model: str, version: str | int, policy=None, *, record: bool = False, **kwargs):
        if policy is None:
            policy = request.getfixturevalue("rag_gate_policy")
        return gate(model, version, policy, record=record, **kwargs)

    return run


def _lines(checks) -> list[str]:
    """The failed checks as the gate prints them (one table for both), each reason beneath."""
    from mlflow_rag_eval.gate.checks import table

    out = [f"  {line}" for line in table(checks).splitlines()]
    out += [f"      -> {c.metric} {c.label}: {c.reason}" for c in checks if c.reason]
    return out


def assert_gate_passes(decision) -> None:
    """Fail with the failed checks (and the reasons) unless the gate decision passed."""
    __tracebackhide__ = True
    if decision.passed:
        return
    lines = [f"RAG gate {decision.verdict} for {decision.model} v{decision.candidate_version} "
             f"(exit {decision.exit_code}, {len(decision.failed_checks)} of {len(decision.checks)} checks failed)"]
    if decision.failed_checks:
        lines += _lines(decision.failed_checks)
    other = [r for r in decision.reasons if r not in {c.reason for c in decision.failed_checks}]
    lines += [f"  {r}" for r in other]
    raise AssertionError("\n".join(lines))


def _metrics_of(source: Any, client=None) -> dict[str, float]:
    if isinstance(source, str):
        import mlflow

        from mlflow_rag_eval.compare import NotComparable, load_evaluation

        client = client or mlflow.MlflowClient()
        try:  # a run logs its means; the counts and quantiles are its rows'
            return load_evaluation(source, client).figures()
        except NotComparable:  # no rag evaluation (the extra_metrics route): its metrics as logged
            return dict(client.get_run(source).data.metrics)
    if isinstance(source, Mapping):
        return dict(source)
    if isinstance(getattr(source, "metrics", None), Mapping):  # mlflow.models.EvaluationResult
        if isinstance(getattr(source, "run_id", None), str):  # its run holds the counts the metrics lack
            return {**dict(source.metrics), **_metrics_of(source.run_id, client)}
        return dict(source.metrics)
    raise TypeError(f"expected a run id, a metrics mapping or an evaluation result, got {type(source).__name__}")


def assert_metrics_meet(run_id_or_metrics: Any, policy, *, client=None) -> None:
    """Fail unless the metrics meet the policy's required metrics, row counts, error rate,
    floors and ceilings (no champion, no calibration: those need :func:`gate`). Per-slice limits
    are read from a run's ``rag_eval/slices.json``: given metrics alone, they fail (a mapping
    holds no slices)."""
    __tracebackhide__ = True
    from mlflow_rag_eval.gate import load_policy
    from mlflow_rag_eval.gate.checks import metric_checks, slice_checks

    policy = load_policy(policy)
    checks = metric_checks(_metrics_of(run_id_or_metrics, client), policy)
    if policy.slice_floors or policy.slice_ceilings:
        from mlflow_rag_eval.evaluation.slices import load_slices

        slices = load_slices(run_id_or_metrics, client) if isinstance(run_id_or_metrics, str) else None
        checks += slice_checks(slices, policy)
    failed = [c for c in checks if not c.passed]
    if failed:
        raise AssertionError("\n".join(
            [f"metrics do not meet the gate policy ({len(failed)} of {len(checks)} checks failed)"]
            + _lines(failed)))
