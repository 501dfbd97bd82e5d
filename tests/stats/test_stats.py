"""The statistics every figure of the package comes from: bootstrap CIs, pairing, Wilcoxon.

Expected values are written as the formula (numpy / scipy on the same seeded draws).
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from scipy.stats import bootstrap, wilcoxon

from mlflow_rag_eval import stats
from mlflow_rag_eval.results import RowResult, summarize
from mlflow_rag_eval.stats import inference


def _percentile_of_means(values: np.ndarray, n_resamples: int, seed: int) -> tuple[float, float]:
    """The per-run CI as runs have always logged it: seeded resamples, 2.5/97.5% quantiles."""
    idx = np.random.default_rng(seed).integers(0, len(values), size=(n_resamples, len(values)))
    means = values[idx].mean(axis=1)
    return float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


# -- the per-run CI of a mean ----------------------------------------------------------------
@pytest.mark.parametrize("n", [2, 74, 3000])
def test_the_per_run_ci_is_the_seeded_percentile_bootstrap_of_the_sorted_values(n):
    values = np.round(np.random.default_rng(n).beta(2, 1, n), 2)
    ordered = np.sort(values)
    # the same draws and quantiles as runs have logged, on the values in sorted order;
    # scipy's interpolation may differ in the last bit
    assert stats.mean_ci(values) == pytest.approx(_percentile_of_means(ordered, 1000, 0), rel=1e-15, abs=0)
    assert stats.mean_ci(values, seed=1) == pytest.approx(_percentile_of_means(ordered, 1000, 1), rel=1e-15, abs=0)
    assert stats.mean_ci(values) == stats.mean_ci(values)  # seeded
    if n > 2:
        assert stats.mean_ci(values, seed=1) != stats.mean_ci(values)


def test_a_ci_depends_on_the_values_not_their_order():
    """The genai route gets its rows in the order MLflow finished them; the evaluator in data
    order: the same rows must give the same interval on both."""
    values = np.round(np.random.default_rng(9).beta(2, 1, 60), 2)
    shuffled = np.random.default_rng(10).permutation(values)
    assert stats.mean_ci(shuffled) == stats.mean_ci(values)
    a, b = np.random.default_rng(11).uniform(0, 1, (2, 30))
    order = np.random.default_rng(12).permutation(30)
    assert stats.paired_difference_ci(a[order], b[order]) == stats.paired_difference_ci(a, b)


def test_the_resampling_rule_is_scipys():
    values = np.random.default_rng(5).uniform(0, 1, 40)
    idx = stats.resample_indices(40, 500, seed=3)
    assert idx.shape == (500, 40) and idx.min() >= 0 and idx.max() < 40
    ours = stats.percentile_interval(values[idx].mean(axis=1))
    theirs = bootstrap((values,), np.mean, n_resamples=500, method="percentile", rng=np.random.default_rng(3))
    assert ours == pytest.approx((theirs.confidence_interval.low, theirs.confidence_interval.high), abs=0)
    assert stats.resample_indices(0, 5).shape == (5, 0)


def test_the_bootstrap_memory_is_bounded_and_its_batches_do_not_change_the_ci(monkeypatch):
    """200 resamples of 200k rows at once would hold 640 MB of draws (3.2 GB at 1M rows: the
    Spark route's driver); batches within 64 MB give the same interval, to the last digit."""
    import tracemalloc

    values = np.random.default_rng(3).random(200_000)
    tracemalloc.start()
    try:
        ci = stats.mean_ci(values)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 100 * 2**20, f"{peak / 2**20:.0f} MB"
    a, b = values[:3000], values[3000:6000]
    paired = stats.paired_difference_ci(a, b)  # BCa: its jackknife is batched too
    assert inference._batch(len(a)) == inference._BATCH  # the usual sizes keep the usual batch
    monkeypatch.setattr(inference, "_BATCH_BYTES", 1)  # one resample at a time
    assert stats.mean_ci(values) == ci
    assert stats.paired_difference_ci(a, b) == paired


def test_one_row_or_equal_rows_have_no_ci_rather_than_a_zero_width_one():
    """Today's bug: one scored row logged ci_low = ci_high = its score; 74 rows all at 1.0 logged
    [1.0, 1.0] — a certainty the data cannot give."""
    assert stats.mean_ci([0.7]) is None and stats.mean_ci([]) is None
    assert stats.mean_ci([1.0] * 74) is None
    assert stats.ci_missing([0.7]) == "a CI needs at least 2 values, got 1"
    assert stats.ci_missing([1.0] * 74) == "all 74 values equal 1: nothing to resample"
    assert stats.ci_missing([0.0, 1.0]) is None

    one = summarize([RowResult.scored(0.7), RowResult.failed("ParseError: x")])
    assert (one.ci_low, one.ci_high) == (None, None) and one.mean == 0.7
    tied = summarize([RowResult.scored(1.0)] * 74)
    assert (tied.ci_low, tied.ci_high) == (None, None)
    logged = tied.as_metrics("faithfulness")
    assert "faithfulness/ci_low" not in logged and "faithfulness/ci_high" not in logged  # never NaN
    assert logged["faithfulness/mean"] == 1.0 and logged["faithfulness/n_scored"] == 74
    spread = summarize([RowResult.scored(v) for v in (0.0, 0.5, 1.0, 1.0)])
    expected = _percentile_of_means(np.array([0.0, 0.5, 1.0, 1.0]), 1000, 0)
    assert (spread.ci_low, spread.ci_high) == pytest.approx(expected, rel=1e-15, abs=0)


def test_float_noise_is_not_spread():
    # scores read back from a table: 0.3 - 0.2 is not 0.1, but the rows did not differ
    a, b = np.array([0.0, 0.2, 0.4, 0.6]), np.array([0.1, 0.3, 0.5, 0.7])
    assert np.ptp(b - a) > 0
    assert stats.paired_difference_ci(a, b) is None
    assert stats.ci_missing(b - a, "paired differences") == "all 4 paired differences equal 0.1: nothing to resample"
    assert stats.percentile_interval(np.array([1.0, 0.9999999999999999, np.nan])) is None


# -- the paired CI, Wilcoxon -----------------------------------------------------------------
def test_the_paired_ci_is_bca_on_the_differences():
    a = np.full(6, 0.5)
    b = np.array([1.0, 1.0, 0.5, 1.0, 1.0, 1.0])
    d = stats.paired_delta(a, b)
    expected = bootstrap((b - a,), np.mean, n_resamples=2000, method="BCa", rng=np.random.default_rng(0),
                         batch=200).confidence_interval
    assert (d.ci_low, d.ci_high) == pytest.approx((expected.low, expected.high), abs=1e-12)
    assert d.delta == pytest.approx(0.5 * 5 / 6) and (d.mean_a, d.mean_b) == pytest.approx((0.5, 5.5 / 6))
    assert 0 < d.ci_low <= d.delta <= d.ci_high <= 0.5
    assert d.p_value == pytest.approx(wilcoxon(b - a, zero_method="wilcox").pvalue) and 0 < d.p_value < 0.1
    # resampling pairs together is resampling differences: scipy's paired bootstrap agrees
    paired = bootstrap((a, b), lambda x, y, axis: np.mean(y - x, axis=axis), paired=True, n_resamples=2000,
                       method="BCa", rng=np.random.default_rng(0)).confidence_interval
    assert (d.ci_low, d.ci_high) == pytest.approx((paired.low, paired.high), abs=1e-12)


def test_bca_widens_the_long_side_of_a_skewed_difference():
    """One row in 30 improved by 1: the percentile interval stops at 0.1, BCa reaches further —
    the side a rare change leaves under-covered."""
    a, b = np.zeros(30), np.zeros(30)
    b[7] = 1.0
    low, high = stats.paired_difference_ci(a, b)
    pct = _percentile_of_means(b - a, 2000, 0)
    assert low == pct[0] == 0.0 and high > pct[1] == pytest.approx(0.1)


def test_a_paired_delta_without_pairs_or_spread():
    empty = stats.paired_delta([], [])
    assert (empty.n, empty.delta, empty.ci_low, empty.p_value) == (0, None, None, None)
    same = stats.paired_delta([0.5, 1.0, 0.0], [0.5, 1.0, 0.0])
    assert same.delta == 0 and same.ci_low is None and same.p_value == 1.0
    assert same.ci_missing == "all 3 paired differences equal 0: nothing to resample"
    assert stats.wilcoxon_p([], []) is None
    with pytest.raises(ValueError, match="differ in length"):
        stats.paired_delta([1.0], [1.0, 0.0])


def test_paired_cis_are_seeded_and_cheap_on_ten_thousand_rows():
    rng = np.random.default_rng(1)
    a, b = rng.uniform(0, 1, 10_000), rng.uniform(0, 1, 10_000)
    start = time.perf_counter()
    ci = stats.paired_difference_ci(a, b)
    assert time.perf_counter() - start < 20  # batched: no 10k x 10k jackknife matrix
    assert ci == stats.paired_difference_ci(a, b) != stats.paired_difference_ci(a, b, seed=1)
    assert ci[0] < (b - a).mean() < ci[1]


# -- pairing ----------------------------------------------------------------------------------
def test_rows_pair_by_question_reference_and_occurrence():
    keys_a = stats.row_keys(["q1", "q2", "q2", "q3"], ["r", "r", "r", None])
    keys_b = stats.row_keys(["q3", "q2", "q1", "q2", "q4"], [None, "r", "r", "r", "r"])
    ia, ib = stats.pair_rows(keys_a, keys_b)
    # q1 <-> B row 2; the first q2 <-> the first q2 of B (row 1), the second <-> row 3; q3 <-> 0
    assert ia.tolist() == [0, 1, 2, 3] and ib.tolist() == [2, 1, 3, 0]
    assert stats.row_keys(["q"], [float("nan")]) == stats.row_keys(["q"], [None])  # no reference
    assert stats.row_keys(["q"], ["r1"]) != stats.row_keys(["q"], ["r2"])
    none = stats.pair_rows(keys_a, [])
    assert none[0].tolist() == [] and none[1].tolist() == []
