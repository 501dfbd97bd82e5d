"""PPI++: the closed form against the ppi-python package, and its coverage on simulated data
with a known truth (bench/ppi.py prints the full figures)."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from conftest import ROOT

from mlflow_rag_eval.stats.ppi import ppi_mean

sys.path.insert(0, str(ROOT / "bench"))


def _data(seed: int, n: int, big_n: int, slope: float):
    rng = np.random.default_rng(seed)
    y = rng.binomial(1, 0.6, n + big_n).astype(float)
    f = np.clip(slope * y + 0.3 + rng.normal(0, 0.25, n + big_n), 0, 1)
    return y[:n], f[:n], f[n:]


@pytest.mark.parametrize("seed,slope", [(0, 0.6), (1, 0.2), (2, 0.0), (3, -0.5), (4, 1.0)])
def test_the_closed_form_is_ppi_py_with_power_tuning(seed, slope):
    import ppi_py  # a dev dependency: never skipped
    y, f, u = _data(seed, 80, 400, slope)
    ours = ppi_mean(y, f, u, confidence=0.9)
    low, high = ppi_py.ppi_mean_ci(y, f, u, alpha=0.1)
    assert ours.mean == pytest.approx(float(np.squeeze(ppi_py.ppi_mean_pointestimate(y, f, u))), abs=1e-12)
    assert (ours.ci_low, ours.ci_high) == pytest.approx((float(np.squeeze(low)), float(np.squeeze(high))), abs=1e-12)
    assert 0.0 <= ours.lam <= 1.0
    fixed = ppi_mean(y, f, u, confidence=0.9, lam=1.0)  # plain PPI
    low1, high1 = ppi_py.ppi_mean_ci(y, f, u, alpha=0.1, lam=1.0)
    assert (fixed.ci_low, fixed.ci_high) == pytest.approx((float(np.squeeze(low1)), float(np.squeeze(high1))), abs=1e-12)


def test_a_judge_that_tells_nothing_gets_no_weight():
    y, f, u = _data(5, 60, 300, -0.5)  # anti-correlated: the tuned weight clips at 0
    estimate = ppi_mean(y, f, u)
    assert estimate.lam == 0.0 and estimate.mean == pytest.approx(y.mean())
    constant = ppi_mean(y, np.full(60, 0.5), np.full(300, 0.5))
    assert constant.lam == 0.0 and constant.mean == pytest.approx(y.mean())


@pytest.mark.parametrize("args,message", [
    (([1.0], [0.5], [0.5]), "at least 2 labelled rows"),
    (([1.0, 0.0], [0.5], [0.5]), "2 human labels but 1 judge scores"),
    (([1.0, 0.0], [0.5, float("nan")], [0.5]), "finite"),
    (([1.0, 0.0], [0.5, 0.4], []), "1 unlabelled row"),
])
def test_bad_inputs_are_refused(args, message):
    with pytest.raises(ValueError, match=message):
        ppi_mean(*args)


def test_the_ppi_interval_covers_the_truth_where_the_judges_does_not():
    from ppi import TRUTH, intervals, simulate  # bench/ppi.py

    seeds = 300
    covered = {"judge only": 0, "human only": 0, "PPI++": 0}
    width = {name: 0.0 for name in covered}
    for seed in range(seeds):
        for name, (low, high) in intervals(*simulate(seed, 2000, 200, bias=0.05, noise=0.2)).items():
            covered[name] += low <= TRUTH <= high
            width[name] += (high - low) / seeds
    assert covered["PPI++"] / seeds >= 0.9          # nominal 0.95 (bench: 0.939 on 1,000 seeds)
    assert covered["judge only"] / seeds <= 0.2     # a lenient judge's interval misses the truth
    assert width["PPI++"] < 0.75 * width["human only"]
