"""``worst10_mean`` (``results.summarize_values``): the mean of the worst tenth of a metric's
scored rows, by the metric's direction, beside the interpolated ``p10`` it does not replace."""

from __future__ import annotations

import numpy as np
import pytest

from mlflow_rag_eval.results import MetricResult, RowResult, summarize, summarize_values

#: two bad rows among twenty: p10 interpolates past both of them
TWO_BAD = [0.0, 0.76] + [1.0] * 18


def test_p10_misses_the_worst_rows_and_worst10_mean_does_not():
    summary = summarize_values(TWO_BAD, 0, 0)
    assert summary.p10 == pytest.approx(0.976)  # np.quantile(values, 0.1), kept as it was
    assert summary.worst10_mean == pytest.approx(0.38)  # ceil(0.1 * 20) = 2 rows: mean(0, 0.76)
    assert summary.as_metrics("ndcg_at_10")["ndcg_at_10/worst10_mean"] == pytest.approx(0.38)


def test_a_lower_is_better_metrics_worst_rows_are_its_highest():
    values = [1.0, 0.9] + [0.0] * 18  # pollution: two badly polluted rows
    lower = summarize_values(values, 0, 0, greater_is_better=False)
    assert lower.worst10_mean == pytest.approx(0.95)
    assert summarize_values(values, 0, 0).worst10_mean == 0.0  # the same rows, read as higher-is-better
    rows = tuple(RowResult.scored(v) for v in values)
    assert MetricResult("pollution", {}, rows, greater_is_better=False).summary.worst10_mean == pytest.approx(0.95)
    assert summarize(rows, greater_is_better=False) == lower


@pytest.mark.parametrize(("n", "n_worst"), [(1, 1), (9, 1), (10, 1), (11, 2), (20, 2), (30, 3), (70, 7), (101, 11)])
def test_the_worst_decile_is_ceil_n_over_10_rows_and_at_least_one(n, n_worst):
    """Distinct values 0..n-1 in a shuffled order: the worst k are 0..k-1 (or the top k)."""
    values = np.random.default_rng(n).permutation(n).astype(float)
    assert summarize_values(values, 0, 0).worst10_mean == pytest.approx(np.mean(np.arange(n_worst)))
    top = np.arange(n - n_worst, n)
    assert summarize_values(values, 0, 0, greater_is_better=False).worst10_mean == pytest.approx(top.mean())


def test_one_row_is_its_own_worst_decile():
    summary = summarize([RowResult.scored(0.3), RowResult.failed("ParseError: x"), RowResult.not_applicable("n/a")])
    assert summary.worst10_mean == 0.3 and summary.n_scored == 1


def test_ties_at_the_cut_give_the_tied_value():
    values = [0.5, 0.5, 0.5, 1.0] + [1.0] * 16  # three rows tie for the two worst places
    assert summarize_values(values, 0, 0).worst10_mean == 0.5
    assert summarize_values([0.2] * 30, 0, 0, greater_is_better=False).worst10_mean == pytest.approx(0.2)


def test_an_all_failed_metric_logs_no_worst10_mean():
    summary = summarize([RowResult.failed("ParseError: x")] * 3)
    assert summary.worst10_mean is None
    assert "m/worst10_mean" not in summary.as_metrics("m")
