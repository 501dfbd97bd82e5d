"""The gate's checks (``gate/checks.py``) on logged metrics and paired evaluations, without a
registry: error rates, floors on CIs, and the regression rule (point, CI, PPI, test)."""

from __future__ import annotations

import pandas as pd
import pytest

from mlflow_rag_eval.gate import load_policy


def test_a_run_without_n_error_fails_max_error_rate_and_says_why():
    from mlflow_rag_eval.gate.checks import metric_checks

    checks = metric_checks({"faithfulness/mean": 0.9, "faithfulness/n_scored": 40},
                           load_policy({"require_metrics": ["faithfulness"]}))
    (rate,) = [c for c in checks if c.kind == "max_error_rate"]
    assert not rate.passed and rate.value is None
    assert rate.reason == ("faithfulness/n_error was not logged: the error rate is unknown, so "
                           "max_error_rate 0.05 cannot be checked")


# -- the regression rule's CI ----------------------------------------------------------------------
def _evaluated(run_id: str, scores: list[float]):
    from mlflow_rag_eval.compare import EvaluatedRun

    table = pd.DataFrame({"question": [f"q{i}" for i in range(len(scores))], "reference": "r",
                          "faithfulness/score": scores})
    return EvaluatedRun(run_id, {}, table, {})


def _regression(champion, candidate, **policy):
    from mlflow_rag_eval.compare import compare_evaluations
    from mlflow_rag_eval.gate.checks import regression_check

    policy = load_policy({"max_regression": {"faithfulness": 0.1}, **policy})
    (delta,) = compare_evaluations(champion, candidate).deltas
    return regression_check("faithfulness", champion, candidate, delta, policy)


def test_the_regression_ci_is_the_paired_bca_at_the_policys_confidence():
    from mlflow_rag_eval import stats

    a = [1.0] * 20
    b = [0.0, 0.0, 1.0, 0.5] + [1.0] * 16
    check = _regression(_evaluated("A", a), _evaluated("B", b),
                        regression_test={"confidence": 0.9, "decide_on": "ci_low"})
    low, high = stats.paired_difference_ci(a, b, confidence=0.9)
    assert f"90% CI [{low:+.3f}, {high:+.3f}]" in check.detail
    assert check.value == low and not check.passed and "90% CI lower bound" in check.reason


def test_one_pair_cannot_bound_a_drop():
    """Today's bug: one pair gave the zero-width CI [d, d], which then decided on its own."""
    check = _regression(_evaluated("A", [1.0]), _evaluated("B", [0.95]), regression_test={"decide_on": "ci_low"})
    assert not check.passed and check.value is None
    assert "cannot decide on the 95% CI lower bound" in check.reason
    assert "CI not computable (a CI needs at least 2 paired differences, got 1)" in check.reason
    point = _regression(_evaluated("A", [1.0]), _evaluated("B", [0.95]))
    assert point.passed and point.value == pytest.approx(-0.05)  # the point estimate still decides


def test_equal_differences_decide_on_that_difference():
    same = _regression(_evaluated("A", [0.5, 1.0, 0.0]), _evaluated("B", [0.5, 1.0, 0.0]),
                       regression_test={"decide_on": "ci_low"})
    assert same.passed and same.value == 0 and "CI not computable (all 3 paired differences equal 0" in same.detail
    drop = _regression(_evaluated("A", [1.0] * 4), _evaluated("B", [0.8] * 4), regression_test={"decide_on": "ci_low"})
    assert not drop.passed and drop.reason.startswith("faithfulness regressed: paired delta -0.200 < -0.1")
    assert "no CI to tell a real drop from noise" in drop.reason


def test_decide_on_ppi_decides_on_the_human_corrected_difference():
    """The judge says nothing moved (same scores); the PPI estimates, which human labels
    corrected, say the candidate dropped: the difference's CI is the normal one of two
    independent estimates, each standard error read back from its logged 95% interval."""
    from scipy.stats import norm

    from mlflow_rag_eval.stats.ppi import ppi_difference

    scores = [1.0, 0.0, 1.0, 1.0] * 10
    z = norm.ppf(0.975)

    def with_ppi(run, mean, se):
        run.metrics.update({"faithfulness/ppi_mean": mean, "faithfulness/ppi_ci_low": mean - z * se,
                            "faithfulness/ppi_ci_high": mean + z * se, "faithfulness/ppi_confidence": 0.95})
        return run

    champion = with_ppi(_evaluated("A", scores), 0.80, 0.03)
    dropped = with_ppi(_evaluated("B", scores), 0.62, 0.04)
    check = _regression(champion, dropped, regression_test={"decide_on": "ppi", "confidence": 0.9})
    low = (0.62 - 0.80) - norm.ppf(0.95) * (0.03 ** 2 + 0.04 ** 2) ** 0.5
    assert check.value == pytest.approx(low, abs=1e-12) and not check.passed
    assert check.reason.startswith(f"faithfulness regressed: the PPI CI lower bound {low:+.3f} < -0.1")
    assert "judge: " in check.reason and check.delta == 0  # the judge alone saw no change
    assert ppi_difference(champion.metrics, dropped.metrics, "faithfulness").delta == pytest.approx(-0.18)

    same = with_ppi(_evaluated("C", scores), 0.80, 0.03)
    assert _regression(champion, same, regression_test={"decide_on": "ppi"}).passed
    unlabelled = _regression(champion, _evaluated("D", scores), regression_test={"decide_on": "ppi"})
    assert not unlabelled.passed and unlabelled.value is None
    assert "the candidate run has no PPI estimate of faithfulness" in unlabelled.reason
    assert "mlflow-rag-eval ppi --run RUN --metric faithfulness" in unlabelled.reason


def test_decide_on_ppi_leaves_metrics_the_judge_does_not_grade_to_the_paired_delta():
    from mlflow_rag_eval.compare import EvaluatedRun, compare_evaluations
    from mlflow_rag_eval.gate.checks import regression_check

    def run(run_id, scores):
        return EvaluatedRun(run_id, {}, pd.DataFrame({"question": [f"q{i}" for i in range(4)], "reference": "r",
                                                     "mrr/score": scores}), {"mrr": True})

    a, b = run("A", [1.0, 1.0, 0.5, 1.0]), run("B", [1.0, 0.5, 0.5, 1.0])
    (delta,) = compare_evaluations(a, b).deltas
    check = regression_check("mrr", a, b, delta, load_policy({"max_regression": {"mrr": 0.1},
                                                              "regression_test": {"decide_on": "ppi"}}))
    assert check.value == pytest.approx(-0.125) and not check.passed
    assert check.reason.startswith("mrr regressed: paired delta -0.125 < -0.1")


def test_a_floor_on_a_ci_the_run_could_not_compute_says_so():
    from mlflow_rag_eval.gate.checks import metric_checks

    metrics = {"faithfulness/mean": 1.0, "faithfulness/n_scored": 74, "faithfulness/n_error": 0}
    policy = load_policy({"floors": {"faithfulness/ci_low": 0.8}, "min_scored_rows": 10})
    (floor,) = [c for c in metric_checks(metrics, policy) if c.kind == "floor ci_low"]
    assert not floor.passed and floor.reason == (
        "faithfulness/ci_low was not logged (the CI is not computable: fewer than 2 scored rows, or all of them equal)")


# -- the regression test, corrected for several metrics --------------------------------------------
def _paired_runs(n_rows: int, drops: dict[str, float], seed: int = 0):
    """Champion and candidate tables (the comparison's EvaluatedRun) over the same questions;
    the candidate's scores of each metric shifted by ``drops[metric]`` plus a little noise."""
    import numpy as np
    import pandas as pd

    from mlflow_rag_eval.compare import EvaluatedRun

    rng = np.random.default_rng(seed)
    questions = [f"q{i}" for i in range(n_rows)]
    base = {m: rng.uniform(0.2, 0.8, n_rows) for m in drops}
    cand = {m: np.clip(v - drops[m] + rng.normal(0, 0.05, n_rows), 0, 1) for m, v in base.items()}

    def run(name, scores):
        return EvaluatedRun(name, {}, pd.DataFrame({"question": questions, "reference": ["r"] * n_rows,
                                                    **{f"{m}/score": v for m, v in scores.items()}}), {})

    return run("champion", base), run("candidate", cand)


@pytest.mark.parametrize("correction", ["holm", "none"])
def test_decide_on_test_refuses_a_real_drop_and_reports_raw_and_adjusted_p(correction):
    from mlflow_rag_eval.compare import compare_evaluations
    from mlflow_rag_eval.gate.checks import regression_check, regression_p_values
    from mlflow_rag_eval.stats import holm, regression_p

    metrics = {"faithfulness": 0.15, "mrr": 0.0, "hit_at_5": 0.0}
    champion, candidate = _paired_runs(60, metrics)
    policy = load_policy({"max_regression": {m: 0.02 for m in metrics},
                          "regression_test": {"decide_on": "test", "correction": correction}})
    deltas = {d.metric: d for d in compare_evaluations(champion, candidate, n_boot=200).deltas}
    p_values = regression_p_values(champion, candidate, deltas, policy)
    raw = [regression_p(champion.scores(m), candidate.scores(m), 0.02) for m in metrics]
    assert [p_values[m][0] for m in metrics] == raw
    assert [p_values[m][1] for m in metrics] == (holm(raw) if correction == "holm" else raw)
    checks = {m: regression_check(m, champion, candidate, deltas[m], policy, p_values[m]) for m in metrics}
    # the whole CI lies below the margin: refused on it, whatever the p-value; with Holm over three
    # metrics, the CI that refuses is widened as the correction is (Bonferroni, 98.33%)
    reason = checks["faithfulness"].reason
    shown = "98.33% CI (Bonferroni over 3 metrics)" if correction == "holm" else "95% CI"
    assert not checks["faithfulness"].passed and f"faithfulness regressed: the whole {shown} [" in reason
    assert "] lies below -0.02" in reason
    assert checks["mrr"].passed and checks["hit_at_5"].passed
    label = "Holm-adjusted" if correction == "holm" else "uncorrected"
    assert f"regression p={raw[1]:.3g} ({label} {p_values['mrr'][1]:.3g})" in checks["mrr"].detail


def test_holm_is_the_step_down_formula():
    from mlflow_rag_eval.stats import holm

    assert holm([0.01, 0.04, 0.03, None, 0.005]) == pytest.approx([0.03, 0.06, 0.06, None, 0.02])
    assert holm([0.5, 0.9]) == [1.0, 1.0] and holm([]) == [] and holm([None]) == [None]


def test_an_undefined_calibration_names_its_metric(tracking_uri):
    """A gate refusing several metrics' calibrations says which one each reason is about; the
    figures are the ones recomputed from the labels (here: constant scores), not the run's metrics."""
    import mlflow
    import pandas as pd

    from mlflow_rag_eval.calibration.calibrate import _result
    from mlflow_rag_eval.gate.checks import calibration_check

    with mlflow.start_run() as run:
        mlflow.log_metrics({"calibration/spearman": 0.99, "calibration/n_scored": 8})
    rows = pd.DataFrame({"label": [0.0, 1.0] * 4, "score": [1.0] * 8, "status": ["scored"] * 8})
    recomputed = _result(rows, metric="faithfulness", judge="j", judge_fingerprint="fp", prompts_version="p",
                         threshold=0.5, label_threshold=0.5, n_boot=50, seed=0, labels_digest="d")
    policy = load_policy({"require_metrics": ["faithfulness"]})
    check = calibration_check("faithfulness", mlflow.get_run(run.info.run_id), "fp", policy, recomputed)
    assert not check.passed
    assert check.reason == "faithfulness: calibration rho is undefined on 8 labels (constant scores or labels)"
    unreadable = calibration_check("faithfulness", mlflow.get_run(run.info.run_id), "fp", policy, "rows gone")
    assert unreadable.reason == (f"faithfulness: calibration run {run.info.run_id} cannot be recomputed from its "
                                 "labels (rows gone)")


# -- worst10_mean: the floor that guards the worst rows --------------------------------------------
def test_a_worst10_mean_floor_fails_where_a_p10_floor_passes():
    """Two bad rows of twenty: p10 interpolates to 0.976, the worst two average 0.38."""
    from mlflow_rag_eval.gate.checks import metric_checks
    from mlflow_rag_eval.results import summarize_values

    logged = summarize_values([0.0, 0.76] + [1.0] * 18, 0, 0).as_metrics("ndcg_at_10")
    policy = load_policy({"min_scored_rows": 20, "floors": {"ndcg@10/p10": 0.5, "ndcg@10/worst10_mean": 0.5}})
    by_kind = {c.kind: c for c in metric_checks(logged, policy)}
    assert by_kind["floor p10"].passed and by_kind["floor p10"].value == pytest.approx(0.976)
    worst = by_kind["floor worst10_mean"]
    assert not worst.passed and worst.reason == "ndcg_at_10/worst10_mean = 0.380 < floor 0.5"


def test_a_lower_is_better_worst10_mean_is_verified_in_its_direction_and_gated_by_a_ceiling():
    """The gate recomputes the logged figure from the rows table in the direction the run's
    lineage records: the highest rows of pollution are its worst, so the honest figure is
    believed (read as higher-is-better it would be 0 and called altered), and an edited one is not."""
    from mlflow_rag_eval.compare import EvaluatedRun
    from mlflow_rag_eval.gate.checks import AlteredRun, metric_checks, verified_figures
    from mlflow_rag_eval.results import summarize_values

    scores = [1.0, 0.6] + [0.0] * 18
    table = pd.DataFrame({"question": [f"q{i}" for i in range(20)], "pollution_at_3/score": scores})
    logged = summarize_values(scores, 0, 0, greater_is_better=False).as_metrics("pollution_at_3")
    assert logged["pollution_at_3/worst10_mean"] == pytest.approx(0.8)
    key = "pollution_at_3/worst10_mean"
    run = EvaluatedRun("R", {}, table, {"pollution_at_3": False}, metrics=logged)
    assert verified_figures(run, ["pollution_at_3"], [key])[key] == pytest.approx(0.8)
    altered = EvaluatedRun("R", {}, table, {"pollution_at_3": False}, metrics={**logged, key: 0.0})
    with pytest.raises(AlteredRun, match="logged pollution_at_3/worst10_mean=0 but its rows table gives 0.8"):
        verified_figures(altered, ["pollution_at_3"], [key])
    policy = load_policy({"min_scored_rows": 20, "ceilings": {"pollution@3/p10": 0.5, "pollution@3/worst10_mean": 0.5}})
    by_kind = {c.kind: c for c in metric_checks(verified_figures(run, ["pollution_at_3"], [key]), policy)}
    assert by_kind["ceiling p10"].passed  # p10 of [0 x 18, 0.6, 1] is 0
    assert not by_kind["ceiling worst10_mean"].passed
    assert by_kind["ceiling worst10_mean"].reason == "pollution_at_3/worst10_mean = 0.800 > ceiling 0.5"
