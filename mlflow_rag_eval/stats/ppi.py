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

When there is no interval. The normal interval rests on the spread of the labelled rows'
corrections ``human - lam * judge``, estimated from those rows; the estimate carries
``ci_low``/``ci_high`` None and a ``reason`` instead of an interval that would claim a precision
the labels do not have:

* fewer than :data:`MIN_LABELS` (10) labels. With n labels the standard deviation of the
  corrections is itself off by about ``1 / sqrt(2 (n - 1))`` of its value (35% at 5 labels,
  24% at 10), and the normal quantile understates Student's t by more than 15% below 10 labels
  (t of 8 degrees of freedom: 2.31 against 1.96), so the interval would be too narrow by about
  that much on top. 10 is a floor, not a target: nominal coverage needs a few dozen labels
  (the gate's ``calibration.min_labels`` defaults to 50);
* labels that are all one value (20 labels all 1): their spread is 0, the tuned weight of the
  judge is 0, and the normal interval has width 0, as if people's mean were known exactly;
  20 passes out of 20 still leave a true rate of 0.85 quite plausible. Label more rows;
* a standard error of 0 for any other reason, or an interval wholly outside the bounds (the
  judge scores the labelled rows very differently from the others: are they a random sample?).

Bounds. Every metric of this package scores rows in [0, 1], so the estimate and its interval are
clipped to ``bounds`` (default ``(0, 1)``; labels and scores outside them are refused). Clipping
keeps coverage: the true mean lies in the bounds, so it lies in the clipped interval exactly when
it lies in the unclipped one, and the clipped estimate is never farther from it. The standard
error and the unclipped estimate are kept (``se``, ``unclipped_mean``, logged as
``<metric>/ppi_se`` and ``/ppi_unclipped_mean``) because :func:`ppi_difference` needs the normal
interval's own figures, which a clipped interval no longer shows.

:func:`mlflow_rag_eval.calibration.ppi.ppi_from_run` takes both from an evaluation run: the judge's Feedback on every trace and
the HUMAN Feedback reviewers left on some (in the MLflow UI, or ``mlflow.log_feedback``), and
logs ``<metric>/ppi_mean``, ``/ppi_ci_low``, ``/ppi_ci_high``, ``/n_human``, ``/ppi_lambda`` and
``/ppi_confidence`` on the run, where the gate's floors can read them
(``floors: {faithfulness/ppi_ci_low: 0.8}``) and its regression rule can decide on them
(``regression_test: {decide_on: ppi}``, :func:`ppi_difference`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["MIN_LABELS", "PPIDifference", "PPIEstimate", "ppi_difference", "ppi_mean"]

#: fewest human labels the normal interval is given for (see the module docstring)
MIN_LABELS = 10


@dataclass(frozen=True)
class PPIEstimate:
    """The PPI++ estimate of a mean, its CI (None, with a ``reason``, where there is none), and
    what it was made from."""

    #: the estimate, clipped to the bounds
    mean: float
    #: the normal interval clipped to the bounds; None when the labels cannot give one
    ci_low: float | None
    ci_high: float | None
    #: the power-tuning weight of the judge's scores, in [0, 1] (0: the human-only mean)
    lam: float
    n_human: int
    n_unlabelled: int
    #: for comparison: the judge's own mean over every row, and the humans' mean
    judge_mean: float
    human_mean: float
    #: the standard error of the estimate (None without an interval) and the estimate before
    #: clipping: what :func:`ppi_difference` reads back
    se: float | None = None
    unclipped_mean: float | None = None
    #: why there is no interval (None when there is one)
    reason: str | None = None

    def as_metrics(self, key: str) -> dict[str, float]:
        """``<key>/ppi_mean``, ``/ppi_ci_low``, ``/ppi_ci_high`` (:data:`~mlflow_rag_eval.keys.PPI_STATS`),
        ``/n_human``, ``/ppi_unclipped_mean`` and ``/ppi_se``; without an interval, neither its
        bounds nor ``ppi_se``, never a stand-in value."""
        from mlflow_rag_eval.keys import PPI_STATS

        values = dict(zip(PPI_STATS, (self.mean, self.ci_low, self.ci_high)))
        out = {f"{key}/{stat}": values[stat] for stat in PPI_STATS if values[stat] is not None}
        out[f"{key}/n_human"] = float(self.n_human)
        out[f"{key}/ppi_unclipped_mean"] = self.mean if self.unclipped_mean is None else self.unclipped_mean
        if self.se is not None and self.ci_low is not None:
            out[f"{key}/ppi_se"] = self.se
        return out


def ppi_mean(human: Sequence[float], judge_on_human: Sequence[float], judge_unlabelled: Sequence[float], *,
             confidence: float = 0.95, lam: float | None = None,
             bounds: tuple[float, float] | None = (0.0, 1.0)) -> PPIEstimate:
    """PPI++ estimate and CI of the mean of the human scores (see the module docstring).

    Args:
        human: the human labels of the labelled rows.
        judge_on_human: the judge's scores of the same rows, in the same order.
        judge_unlabelled: the judge's scores of every other row.
        lam: the judge's weight; None (default) tunes it for the smallest variance, clipped to
            [0, 1], as ``ppi_py`` does.
        bounds: the range of the metric: the estimate and its interval are clipped to it (which
            keeps coverage: the true mean is in it); None for an unbounded one.

    Returns:
        The estimate; with ``ci_low``/``ci_high`` None and a ``reason`` where the labels cannot
        give an interval: fewer than :data:`MIN_LABELS`, all one value, no spread.

    Raises:
        ValueError: fewer than two labelled rows, no unlabelled row, lengths that differ, a
            non-finite value or one outside ``bounds``, or a confidence outside (0, 1).
    """
    from scipy.stats import norm

    y, f, u = _checked(human, judge_on_human, judge_unlabelled, confidence, bounds)
    n, big_n = len(y), len(u)
    if lam is None:
        lam = _tuned_lambda(y, f, u)
    estimate = float(lam * u.mean() + (y - lam * f).mean())
    se = float(np.sqrt((lam * u).std() ** 2 / big_n + (y - lam * f).std() ** 2 / n))
    half = float(norm.ppf(1 - (1 - confidence) / 2)) * se
    low, high = estimate - half, estimate + half
    lo, hi = bounds if bounds is not None else (-np.inf, np.inf)
    reason = _no_interval(y, se, low, high, lo, hi)
    ci = (None, None) if reason else (float(np.clip(low, lo, hi)), float(np.clip(high, lo, hi)))
    return PPIEstimate(
        mean=float(np.clip(estimate, lo, hi)), ci_low=ci[0], ci_high=ci[1], lam=float(lam), n_human=n,
        n_unlabelled=big_n, judge_mean=float(np.concatenate([f, u]).mean()), human_mean=float(y.mean()),
        se=None if reason else se, unclipped_mean=estimate, reason=reason,
    )


def _checked(human, judge_on_human, judge_unlabelled, confidence: float, bounds) -> tuple[np.ndarray, ...]:
    """The three samples as arrays, refused as :func:`ppi_mean` says."""
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
    if bounds is not None:
        lo, hi = bounds
        for name, values in (("human label", y), ("judge score", f), ("judge score", u)):
            outside = values[(values < lo) | (values > hi)]
            if outside.size:
                raise ValueError(f"a {name} of {outside[0]:g} is outside the metric's bounds [{lo:g}, {hi:g}] "
                                 "(pass bounds=None for an unbounded metric)")
    return y, f, u


def _no_interval(y: np.ndarray, se: float, low: float, high: float, lo: float, hi: float) -> str | None:
    """Why the labels give no interval (see the module docstring), or None."""
    n = len(y)
    if n < MIN_LABELS:
        return (f"{n} human labels, fewer than {MIN_LABELS}: too few for the spread of the human-minus-judge "
                "errors, which the normal interval rests on, to mean anything; label more rows (a random sample)")
    if np.ptp(y) == 0:
        return (f"all {n} human labels are {y[0]:g}: labels with no spread give a normal interval of (almost) "
                "no width, as if people's mean were known exactly; label more rows (a random sample)")
    if not se > 0:
        return "the estimate has no spread (judge scores and human-minus-judge errors all constant): no interval"
    if high < lo or low > hi:
        return (f"the interval [{low:.3f}, {high:.3f}] lies wholly outside the metric's bounds [{lo:g}, {hi:g}]: "
                "the judge scores the labelled rows unlike the others; are they a random sample?")
    return None


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
    there is none: a run without ``<key>/ppi_*`` (label some of its rows, then run
    ``mlflow-rag-eval ppi``), or whose estimate has no interval (too few labels, or all one
    value: see the module docstring). Without both intervals there is nothing to decide on, so
    the gate's ``decide_on: ppi`` check fails with that reason.

    Each run's standard error and unclipped estimate are read from ``<key>/ppi_se`` and
    ``/ppi_unclipped_mean``; a run logged before they existed has an unclipped, symmetric normal
    interval, and its standard error is read back from it (at its ``ppi_confidence``; 0.95 when
    not logged). A non-finite figure counts as none (an interval that a later estimate without
    one overwrote, see :func:`mlflow_rag_eval.calibration.ppi.ppi_from_run`). The two estimates
    are treated as independent: when both runs share rows, and the same people labelled both,
    they are positively correlated and the interval is wider than it needs to be, never
    narrower (conservative).
    """
    from scipy.stats import norm

    ses, means = [], []
    for name, run in (("champion", a), ("candidate", b)):
        figures = _normal_figures(run, key)
        if isinstance(figures, str):
            return f"the {name} run {figures}"
        means.append(figures[0])
        ses.append(figures[1])
    delta = means[1] - means[0]
    half = norm.ppf(1 - (1 - confidence) / 2) * float(np.hypot(*ses))
    return PPIDifference(delta=float(delta), ci_low=float(delta - half), ci_high=float(delta + half),
                         confidence=confidence)


def _normal_figures(run: Mapping[str, float], key: str) -> tuple[float, float] | str:
    """(unclipped estimate, standard error) of the PPI estimate a run logged for ``key``, or
    what the run lacks (to follow "the champion run ...")."""
    from scipy.stats import norm

    mean, low, high = (run.get(f"{key}/{stat}") for stat in ("ppi_mean", "ppi_ci_low", "ppi_ci_high"))
    if mean is None:
        return (f"has no PPI estimate of {key} (label a random sample of its rows, then "
                f"mlflow-rag-eval ppi --run RUN --metric {key})")
    se = run.get(f"{key}/ppi_se")
    if se is None and low is not None and high is not None:  # logged before ppi_se: unclipped
        se = (high - low) / (2 * norm.ppf(1 - (1 - run.get(f"{key}/ppi_confidence", 0.95)) / 2))
    unclipped = run.get(f"{key}/ppi_unclipped_mean", mean)
    if low is None or high is None or se is None or not all(math.isfinite(v) for v in (low, high, se, unclipped)):
        n = run.get(f"{key}/n_human")
        why = (f"{n:g} human labels, fewer than {MIN_LABELS}" if n is not None and n < MIN_LABELS else
               "its labels were all one value, or gave the estimate no spread")
        return (f"has a PPI estimate of {key} without an interval ({why}; label more of its rows, a random "
                f"sample, then mlflow-rag-eval ppi --run RUN --metric {key})")
    return float(unclipped), float(se)
