"""PPI++ where the labels cannot give an interval (too few, all one value), intervals clipped to
the metric's bounds, and what the gate and the logged run make of both. The closed form is
checked against ``ppi_py`` as in tests/stats/test_ppi.py."""

from __future__ import annotations

import math

import mlflow
import numpy as np
import pandas as pd
import pytest
from conftest import figures_of
from scipy.stats import norm

from mlflow_rag_eval.stats.ppi import MIN_LABELS, ppi_difference, ppi_mean

Z95 = norm.ppf(0.975)


def _data(seed: int, n: int, big_n: int, slope: float):
    rng = np.random.default_rng(seed)
    y = rng.binomial(1, 0.6, n + big_n).astype(float)
    f = np.clip(slope * y + 0.3 + rng.normal(0, 0.25, n + big_n), 0, 1)
    return y[:n], f[:n], f[n:]


def _ppi_py(y, f, u, **kwargs) -> tuple[float, float, float]:
    """ppi_py's (point estimate, ci low, ci high) with power tuning unless ``lam`` is given."""
    import ppi_py  # a dev dependency: never skipped

    low, high = ppi_py.ppi_mean_ci(y, f, u, **kwargs)
    point = ppi_py.ppi_mean_pointestimate(y, f, u, **{k: v for k, v in kwargs.items() if k == "lam"})
    return float(np.squeeze(point)), float(np.squeeze(low)), float(np.squeeze(high))


def _lenient_judge(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A judge around 0.42 on ``n`` labelled rows and 100 others, telling little."""
    rng = np.random.default_rng(seed)
    return np.clip(0.417 + rng.normal(0, 0.2, n), 0, 1), np.clip(0.417 + rng.normal(0, 0.2, 100), 0, 1)


def test_identical_labels_give_no_interval_and_say_why():
    """Today's bug: 20 labels all 1 gave mean 1.000 with the zero-width CI [1, 1], and a floor
    on ppi_ci_low passed."""
    f, u = _lenient_judge(20)
    estimate = ppi_mean(np.ones(20), f, u)
    assert estimate.mean == 1.0 and estimate.judge_mean == pytest.approx(np.concatenate([f, u]).mean())
    assert (estimate.ci_low, estimate.ci_high, estimate.se) == (None, None, None)
    assert estimate.reason.startswith("all 20 human labels are 1: labels with no spread give a normal interval")
    assert set(estimate.as_metrics("faithfulness")) == {"faithfulness/ppi_mean", "faithfulness/n_human",
                                                       "faithfulness/ppi_unclipped_mean"}
    zeros = ppi_mean(np.zeros(20), f, u, lam=1.0)  # a fixed weight spreads the estimate, not the labels
    assert zeros.ci_low is None and zeros.reason.startswith("all 20 human labels are 0")


def test_too_few_labels_give_no_interval():
    """Today's bug: 8 labels gave an interval; below MIN_LABELS the spread it rests on is noise."""
    y, f, u = _data(3, MIN_LABELS - 2, 200, 0.6)
    y[:2] = [0.0, 1.0]  # not all one value: the count alone is the reason
    estimate = ppi_mean(y, f, u)
    assert estimate.ci_low is None and estimate.ci_high is None and estimate.se is None
    assert estimate.reason.startswith(f"{MIN_LABELS - 2} human labels, fewer than {MIN_LABELS}")
    assert estimate.mean == pytest.approx(_ppi_py(y, f, u)[0], abs=1e-12)  # the estimate itself stays
    y, f, u = _data(3, MIN_LABELS, 200, 0.6)  # at the minimum: an interval
    assert ppi_mean(y, f, u).ci_low is not None


@pytest.mark.parametrize("seed,slope", [(0, 0.6), (2, 0.0), (4, 1.0)])
def test_the_non_degenerate_case_is_still_ppi_py_and_keeps_its_standard_error(seed, slope):
    y, f, u = _data(seed, 40, 400, slope)
    ours = ppi_mean(y, f, u, confidence=0.9)
    point, low, high = _ppi_py(y, f, u, alpha=0.1)
    assert 0 < low and high < 1  # inside the bounds: nothing clipped
    assert ours.reason is None
    assert (ours.mean, ours.ci_low, ours.ci_high) == pytest.approx((point, low, high), abs=1e-12)
    assert ours.unclipped_mean == pytest.approx(point, abs=1e-12)
    assert ours.se == pytest.approx((high - low) / (2 * norm.ppf(0.95)), abs=1e-12)


def _overflowing():
    """12 labels, 11 of them 1, and a judge that tells little: the normal interval passes 1."""
    rng = np.random.default_rng(7)
    y = np.array([1.0] * 11 + [0.0])
    f = np.clip(0.2 * y + 0.5 + rng.normal(0, 0.25, 12), 0, 1)
    u = np.clip(0.6 + rng.normal(0, 0.25, 200), 0, 1)
    return y, f, u


def test_an_interval_of_a_bounded_metric_is_clipped_to_its_bounds():
    """Today's bug: an interval like [0.752, 1.063] was logged for a metric bounded by 1.
    Clipped, it covers the truth exactly when the unclipped one does (the truth is in [0, 1])."""
    y, f, u = _overflowing()
    point, low, high = _ppi_py(y, f, u, alpha=0.05)
    assert 0 < low < 1 < high  # the case overflows
    estimate = ppi_mean(y, f, u)
    assert (estimate.mean, estimate.ci_low, estimate.ci_high) == pytest.approx((point, low, 1.0), abs=1e-12)
    assert estimate.se == pytest.approx((high - low) / (2 * Z95), abs=1e-12)  # the unclipped interval's
    unbounded = ppi_mean(y, f, u, bounds=None)
    assert (unbounded.ci_low, unbounded.ci_high) == pytest.approx((low, high), abs=1e-12)

    # with the judge's full weight the point estimate passes 1 too: clipped, the raw one kept
    u_high = np.clip(u + 0.3, 0, 1)
    point, low, high = _ppi_py(y, f, u_high, alpha=0.05, lam=1.0)
    assert point > 1 and low < 1
    full = ppi_mean(y, f, u_high, lam=1.0)
    assert (full.mean, full.ci_low, full.ci_high) == pytest.approx((1.0, low, 1.0), abs=1e-12)
    assert full.unclipped_mean == pytest.approx(point, abs=1e-12)
    with pytest.raises(ValueError, match=r"a judge score of 1.5 is outside the metric's bounds \[0, 1\]"):
        ppi_mean(y, np.append(f[:-1], 1.5), u)


def test_an_interval_wholly_outside_the_bounds_is_no_interval():
    """Clipped, it would be [1, 1]: a zero-width interval again. The labelled rows are then
    unlike the others, which a random sample would not be."""
    y = np.array([1.0] * 19 + [0.0])
    estimate = ppi_mean(y, np.full(20, 0.0) + np.linspace(0, 0.1, 20), np.full(500, 1.0), lam=1.0)
    assert estimate.ci_low is None and estimate.mean == 1.0
    assert "lies wholly outside the metric's bounds [0, 1]" in estimate.reason


# -- the gate: a floor and decide_on: ppi on an estimate without an interval -------------------
def _evaluated(run_id: str, scores: list[float], metrics: dict[str, float]):
    from mlflow_rag_eval.compare import EvaluatedRun

    table = pd.DataFrame({"question": [f"q{i}" for i in range(len(scores))], "reference": "r",
                          "faithfulness/score": scores})
    return EvaluatedRun(run_id, {}, table, {}, metrics=metrics)


def _ppi_metrics(estimate) -> dict[str, float]:
    return {**estimate.as_metrics("faithfulness"), "faithfulness/ppi_confidence": 0.95}


def _identical_labels_run() -> dict[str, float]:
    f, u = _lenient_judge(20)
    return {"faithfulness/n_scored": 120.0, "faithfulness/n_error": 0.0, **_ppi_metrics(ppi_mean(np.ones(20), f, u))}


def test_a_floor_on_ppi_ci_low_fails_without_an_interval():
    """Today's bug: the identical labels' CI [1, 1] passed a floor on ppi_ci_low."""
    from mlflow_rag_eval.gate import load_policy
    from mlflow_rag_eval.gate.checks import metric_checks

    floor = load_policy({"floors": {"faithfulness/ppi_ci_low": 0.8}, "calibration": {"required": False}})
    (check,) = [c for c in metric_checks(_identical_labels_run(), floor) if c.kind.startswith("floor")]
    assert not check.passed and check.value is None and "faithfulness/ppi_ci_low was not logged" in check.reason


def test_decide_on_ppi_fails_without_an_interval_and_says_why():
    """Today's bug: the identical labels' CI [1, 1] decided decide_on: ppi as if the
    candidate's estimate were exact, and passed it."""
    from mlflow_rag_eval.compare import compare_evaluations
    from mlflow_rag_eval.gate import load_policy
    from mlflow_rag_eval.gate.checks import regression_check

    scores = [0.4] * 20
    champion = _evaluated("A", scores, _ppi_metrics(ppi_mean(*_data(0, 40, 400, 0.6))))
    candidate = _evaluated("B", scores, _identical_labels_run())
    policy = load_policy({"max_regression": {"faithfulness": 0.1}, "regression_test": {"decide_on": "ppi"}})
    (delta,) = compare_evaluations(champion, candidate).deltas
    check = regression_check("faithfulness", champion, candidate, delta, policy)
    assert not check.passed and check.value is None
    assert check.reason.startswith("faithfulness: cannot decide on PPI: the candidate run has a PPI estimate of "
                                   "faithfulness without an interval (its labels were all one value")
    few = _ppi_metrics(ppi_mean(*_data(3, 8, 200, 0.6)))
    assert "(8 human labels, fewer than 10;" in ppi_difference(few, champion.metrics, "faithfulness")
    # and where both have one, the clipped intervals do not narrow the difference: it is read
    # from each run's standard error, not from its clipped interval
    clipped = _ppi_metrics(ppi_mean(*_overflowing()))
    diff = ppi_difference(champion.metrics, clipped, "faithfulness")
    expected_half = Z95 * math.hypot(champion.metrics["faithfulness/ppi_se"], clipped["faithfulness/ppi_se"])
    assert diff.ci_high - diff.delta == pytest.approx(expected_half, abs=1e-12)


# -- ppi_from_run: what a run carries after an estimate without an interval ------------------
def _evaluated_run(local_judge) -> tuple[str, list[str]]:
    """20 rows: the even ones copy their context (faithful), the odd ones change its hour."""
    answers, contexts = [], []
    for i in range(10):
        fact = f"The museum on Elm Street {i} opens at {8 + i % 4} am."
        answers += [fact, fact.replace(f"at {8 + i % 4} am", f"at {50 + i} am")]
        contexts += [[fact], [fact]]
    frame = pd.DataFrame({"question": [f"When does museum {i} open?" for i in range(20)], "answer": answers,
                          "contexts": contexts})
    with mlflow.start_run() as run:
        mlflow.models.evaluate(data=frame, model_type="rag", evaluators="rag",
                               evaluator_config={"judge": local_judge, "metrics": ["faithfulness"]})
    return run.info.run_id, frame["question"].tolist()


def test_ppi_from_run_logs_no_interval_and_overwrites_an_earlier_one(tracking_uri, local_judge):
    from mlflow_rag_eval.calibration.ppi import ppi_from_run
    from mlflow_rag_eval.gate import load_policy
    from mlflow_rag_eval.gate.checks import metric_checks

    run_id, questions = _evaluated_run(local_judge)
    interval_keys = {"faithfulness/ppi_ci_low", "faithfulness/ppi_ci_high", "faithfulness/ppi_se"}
    floor = load_policy({"floors": {"faithfulness/ppi_ci_low": 0.1}, "min_scored_rows": 1,
                         "calibration": {"required": False}})

    def floor_check():
        metrics = figures_of(run_id)  # the run's metrics, with the counts of its rows table
        (check,) = [c for c in metric_checks(metrics, floor) if c.kind.startswith("floor")]
        return metrics, check

    all_pass = pd.DataFrame({"question": questions[:12:2], "label": [1] * 6})  # the copied facts only
    estimate = ppi_from_run(run_id, labels=all_pass, log=True)
    assert estimate.ci_low is None and estimate.reason.startswith("6 human labels, fewer than 10")
    metrics, check = floor_check()
    assert metrics["faithfulness/ppi_mean"] == estimate.mean and not interval_keys & set(metrics)
    assert not check.passed and "faithfulness/ppi_ci_low was not logged" in check.reason

    mixed = pd.DataFrame({"question": questions[:14], "label": [1 - i % 2 for i in range(14)]})
    with_ci = ppi_from_run(run_id, labels=mixed, log=True)
    metrics, check = floor_check()
    assert metrics["faithfulness/ppi_ci_low"] == with_ci.ci_low and check.passed

    same = pd.DataFrame({"question": questions[:24:2], "label": [1] * 10})  # 10 labels, all 1
    again = ppi_from_run(run_id, labels=same, log=True)
    assert again.ci_low is None and again.reason.startswith("all 10 human labels are 1")
    metrics, check = floor_check()
    assert all(math.isnan(metrics[k]) for k in interval_keys)  # not the earlier interval
    assert metrics["faithfulness/ppi_mean"] == again.mean and metrics["faithfulness/n_human"] == 10
    assert not check.passed
    assert "without an interval" in ppi_difference(metrics, metrics, "faithfulness")
