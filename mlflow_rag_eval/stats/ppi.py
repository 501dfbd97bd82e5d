"""Prediction-powered inference (PPI++) of a metric's mean from judge scores and a few human labels.

A judge's mean is biased by the judge: a lenient judge's faithfulness of 0.9 says little about
what people would score. Human labels on a few hundred rows are unbiased but noisy. PPI
(Angelopoulos et al., 2023; ARES applies it to RAG judges) uses both: the judge's mean over all
rows, corrected by the judge's average error where humans labelled,

    estimate = lam * mean(judge on the unlabelled rows) + mean(human - lam * judge, on the labelled rows)

and its CI is the normal interval of that sum, whose two parts are independent samples. With
``lam = 1`` this is PPI; ``lam = 0`` the human-only mean. PPI++ ("power tuning") picks the
``lam`` in [0, 1] that minimises the variance, so the interval is never (asymptotically) wider
than the human-only one and is narrower the better the judge tracks people; the bias of the
judge is removed whatever ``lam`` is.

This module is the closed form for a one-dimensional mean, written out so it needs no extra
dependency; ``tests/test_ppi.py`` checks it against the ``ppi-python`` package (``ppi_py``,
``ppi_mean_pointestimate`` / ``ppi_mean_ci`` with power tuning) to 1e-12.

The labelled rows must be a random sample of the rows (humans labelling only the hard cases
would bias the correction), and the unlabelled rows are the others: each row counts once.

:func:`mlflow_rag_eval.calibration.ppi.ppi_from_run` takes both from an evaluation run: the judge's Feedback on every trace and
the HUMAN Feedback reviewers left on some (in the MLflow UI, or ``mlflow.log_feedback``), and
logs ``<metric>/ppi_mean``, ``/ppi_ci_low``, ``/ppi_ci_high``, ``/n_human``, ``/ppi_lambda`` and
``/ppi_confidence`` on the run, where the gate's floors can read them
(``floors: {faithfulness/ppi_ci_low: 0.8}``) and its regression rule can decide on them
(``regression_test: {decide_on: ppi}``, :func:`ppi_difference`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["PPIDifference", "PPIEstimate", "ppi_difference", "ppi_mean"]


@dataclass(frozen=True)
class PPIEstimate:
    """The PPI++ estimate of a mean, its CI, and what it was made from."""

    mean: float
    ci_low: float
    ci_high: float
    #: the power-tuning weight of the judge's scores, in [0, 1] (0: the human-only mean)
    lam: float
    n_human: int
    n_unlabelled: int
    #: for comparison: the judge's own mean over every row, and the humans' mean
    judge_mean: float
    human_mean: float

    def as_metrics(self, key: str) -> dict[str, float]:
        """``<key>/ppi_mean``, ``/ppi_ci_low``, ``/ppi_ci_high`` (:data:`~mlflow_rag_eval.keys.PPI_STATS`)
        and ``/n_human``."""
        from mlflow_rag_eval.keys import PPI_STATS

        values = dict(zip(PPI_STATS, (self.mean, self.ci_low, self.ci_high)))
        return {**{f"{key}/{stat}": values[stat] for stat in PPI_STATS}, f"{key}/n_human": float(self.n_human)}


def ppi_mean(human: Sequence[float], judge_on_human: Sequence[float], judge_unlabelled: Sequence[float], *,
             confidence: float = 0.95, lam: float | None = None) -> PPIEstimate:
    """PPI++ estimate and CI of the mean of the human scores (see the module docstring).

    Args:
        human: the human labels of the labelled rows.
        judge_on_human: the judge's scores of the same rows, in the same order.
        judge_unlabelled: the judge's scores of every other row.
        lam: the judge's weight; None (default) tunes it for the smallest variance, clipped to
            [0, 1], as ``ppi_py`` does.

    Raises:
        ValueError: fewer than two labelled rows, no unlabelled row, lengths that differ, a
            non-finite value, or a confidence outside (0, 1).
    """
    from scipy.stats import norm

    y = np.asarray(human, dtype=float)
    f = np.asarray(judge_on_human, dtype=float)
    u = np.asarray(judge_unlabelled, dtype=float)
    if len(y) != len(f):
        raise ValueError(f"{len(y)} human labels but {len(f)} judge scores of the labelled rows")
    if len(y) < 2 or len(u) < 1:
        raise ValueError(f"PPI needs at least 2 labelled rows and 1 unlabelled row, got {len(y)} and {len(u)}")
    if not (np.isfinite(y).all() and np.isfinite(f).all() and np.isfinite(u).all()):
        raise ValueError("PPI needs finite scores and labels (a failed judgement is no score: leave its row out)")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    n, big_n = len(y), len(u)
    if lam is None:
        lam = _tuned_lambda(y, f, u)
    estimate = lam * u.mean() + (y - lam * f).mean()
    se = np.sqrt((lam * u).std() ** 2 / big_n + (y - lam * f).std() ** 2 / n)
    z = norm.ppf(1 - (1 - confidence) / 2)
    return PPIEstimate(
        mean=float(estimate), ci_low=float(estimate - z * se), ci_high=float(estimate + z * se), lam=float(lam),
        n_human=n, n_unlabelled=big_n, judge_mean=float(np.concatenate([f, u]).mean()), human_mean=float(y.mean()),
    )


def _tuned_lambda(y: np.ndarray, f: np.ndarray, u: np.ndarray) -> float:
    """The variance-minimising weight: cov(human, judge) on the labelled rows over
    (1 + n/N) times the judge's variance on all rows, clipped to [0, 1] (PPI++ for a mean,
    the centring at the lam = 1 estimate included, as ``ppi_py`` computes it)."""
    n, big_n = len(y), len(u)
    centre = u.mean() + (y - f).mean()
    g, gh = y - centre, f - centre
    cov = ((g - g.mean()) * (gh - gh.mean())).sum() / n
    var = np.cov(np.concatenate([gh, u - centre]))
    if not var > 0:  # a judge that gives every row the same score carries no information
        return 0.0
    return float(np.clip(cov / ((1 + n / big_n) * var), 0.0, 1.0))


@dataclass(frozen=True)
class PPIDifference:
    """``b - a`` of two runs' PPI estimates of a metric's mean, with its normal CI."""

    delta: float
    ci_low: float
    ci_high: float
    confidence: float


def ppi_difference(a: Mapping[str, float], b: Mapping[str, float], key: str, *,
                   confidence: float = 0.95) -> PPIDifference | str:
    """The difference of the PPI estimates two runs logged for metric ``key`` (``b - a``), or why
    there is none (a run without ``<key>/ppi_*``: label some of its rows, then run
    ``mlflow-rag-eval ppi``).

    Each run's standard error is read back from its logged interval (normal, symmetric, at its
    ``ppi_confidence``; 0.95 when not logged). The two estimates are treated as independent:
    when both runs share rows, and the same people labelled both, they are positively
    correlated and the interval is wider than it needs to be, never narrower (conservative).
    """
    from scipy.stats import norm

    ses, means = [], []
    for name, run in (("champion", a), ("candidate", b)):
        mean, low, high = (run.get(f"{key}/{stat}") for stat in ("ppi_mean", "ppi_ci_low", "ppi_ci_high"))
        if mean is None or low is None or high is None:
            return (f"the {name} run has no PPI estimate of {key} (label a random sample of its rows, then "
                    f"mlflow-rag-eval ppi --run RUN --metric {key})")
        level = run.get(f"{key}/ppi_confidence", 0.95)
        ses.append((high - low) / (2 * norm.ppf(1 - (1 - level) / 2)))
        means.append(mean)
    delta = means[1] - means[0]
    half = norm.ppf(1 - (1 - confidence) / 2) * float(np.hypot(*ses))
    return PPIDifference(delta=float(delta), ci_low=float(delta - half), ci_high=float(delta + half),
                         confidence=confidence)
