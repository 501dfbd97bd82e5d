"""Statistics of evaluations, in one place: bootstrap CIs, pairing rows of two evaluations,
the Wilcoxon signed-rank test and the resampling rule calibration shares.

Conventions, the same everywhere:

- **Seeded.** Every resampling draws from ``numpy.random.default_rng(seed)``: the same input
  gives the same numbers, run after run.
- **One resampling rule.** :func:`resample_indices` draws ``n`` row indices with replacement
  per resample, one row per resample: exactly the draws :func:`scipy.stats.bootstrap` makes
  from the same generator, so a vectorised bootstrap over several figures (calibration) and
  scipy's agree resample by resample.
- **Not computable is None.** A CI needs at least two values that are not all equal; otherwise
  (one row, or every row the same, float noise aside) the functions return ``None`` — never NaN, and never a
  zero-width interval, which would claim a certainty the data cannot give. :func:`ci_missing`
  says why, in words.

Which interval where, and why:

- :func:`mean_ci` — the per-run CI of a metric's mean (``<metric>/ci_low``, ``/ci_high``):
  a seeded **percentile** bootstrap, 1,000 resamples (:func:`scipy.stats.bootstrap`). It is
  what runs have always logged — the same draws and quantiles, so logged figures move at most
  in their last bit — and it costs no jackknife on the logging path (every metric of every run,
  up to 10k rows; the genai route summarises once per statistic). It describes the run; no
  decision rests on it. Past a few hundred rows it agrees with BCa to about 0.001; on small
  runs they differ by up to about 0.01 (74 rows, 90% of them 1: [0.757, 0.932] vs BCa
  [0.743, 0.919]).
- :func:`paired_difference_ci` — the CI of ``mean(b - a)`` over paired rows, used by
  ``compare`` and the gate's regression rule: **BCa** (bias-corrected and accelerated),
  2,000 resamples. Golden sets are small (15 to a few hundred rows) and paired differences of
  [0, 1] scores are lumpy and skewed (mostly 0, a few +-1): the percentile interval is then
  too short on the long side; BCa corrects the bootstrap distribution's bias and skewness
  (second-order accurate). Simulated, a drop of 1 on 5% of 80 rows: the percentile 95% CI
  covered the true delta in 91.5% of samples, BCa in 99.5% (10% of 40 rows: 93.7% vs 98.7%);
  on symmetric or continuous differences the two agree. Resampling differences is the paired
  bootstrap: pairs are resampled together. The jackknife BCa needs runs in batches, so memory
  stays bounded at 10k pairs.
- :func:`krippendorff_alpha` / :func:`alpha_ci` — the agreement of a judge panel's members
  on one metric's decisions (``<metric>/panel_alpha``): Krippendorff's alpha, nominal for
  yes/no verdicts, interval for scores, and a seeded **percentile** bootstrap CI that
  resamples *rows* (a row's decisions — the claims of one answer — go together: they are not
  independent). Alpha rather than Fleiss' kappa because members fail on some items: alpha
  takes a decision with a missing vote as it is (any decision with two votes or more counts),
  kappa needs every rater on every item. With complete data the two agree:
  ``alpha = 1 - (1 - kappa) * (n - 1) / n`` for ``n`` votes in all.
"""

from __future__ import annotations

import json
import warnings
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "ALPHA_CI_RESAMPLES", "MEAN_CI_RESAMPLES", "PAIRED_CI_RESAMPLES", "PairedDelta", "SEED", "all_equal",
    "alpha_ci", "ci_missing", "krippendorff_alpha", "mean_ci", "holm", "pair_rows", "paired_delta", "paired_difference_ci", "percentile_interval", "regression_p",
    "resample_indices", "row_keys", "wilcoxon_p",
]

SEED = 0
#: resamples of the per-run CI of a metric's mean
MEAN_CI_RESAMPLES = 1000
#: resamples of the paired-difference CI (compare, gate)
PAIRED_CI_RESAMPLES = 2000
#: resamples of the CI of a judge panel's agreement (Krippendorff's alpha)
ALPHA_CI_RESAMPLES = 1000
#: values closer than this (relative to their size, at least 1) count as equal: differences
#: of scores read back from a table carry float noise (0.3 - 0.2 != 0.1), and a bootstrap of
#: noise is not a CI
_SAME = 1e-12
#: why a CI is missing when the data allow one but BCa is undefined (a degenerate bootstrap
#: distribution; not seen in practice, handled rather than returned as NaN)
_UNDEFINED = "the BCa interval is undefined on these differences"
#: resamples computed at once: bounds memory to about this many x n floats (BCa's jackknife
#: would otherwise build an n x n matrix: 800 MB at 10k rows) ...
_BATCH = 200
#: ... and to this many bytes of resampled values and their indices, whatever n is: 200 x 1M
#: rows would be 3.2 GB. The batch does not change the interval (the draws are the same stream).
_BATCH_BYTES = 64 << 20


def _batch(n: int) -> int:
    """Resamples per batch for ``n`` values: at most :data:`_BATCH`, within :data:`_BATCH_BYTES`."""
    return max(1, min(_BATCH, _BATCH_BYTES // (16 * max(n, 1))))


# -- resampling -------------------------------------------------------------------------------
def resample_indices(n: int, n_resamples: int, seed: int = SEED) -> np.ndarray:
    """``(n_resamples, n)`` row indices drawn with replacement, seeded: the bootstrap's draws.

    The same numbers :func:`scipy.stats.bootstrap` draws from ``default_rng(seed)``.
    """
    if n == 0:
        return np.empty((n_resamples, 0), dtype=np.int64)
    return np.random.default_rng(seed).integers(0, n, size=(n_resamples, n))


def ci_missing(values: Sequence[float] | np.ndarray, what: str = "values") -> str | None:
    """Why no CI can be computed from ``values`` (None when one can), in words naming them
    ``what``: ``"all 74 values equal 1"``."""
    values = np.asarray(values, dtype=float)
    if len(values) < 2:
        return f"a CI needs at least 2 {what}, got {len(values)}"
    if all_equal(values):
        return f"all {len(values)} {what} equal {values[0]:.6g}: nothing to resample"
    return None


def all_equal(values: Sequence[float] | np.ndarray) -> bool:
    """Whether ``values`` are all the same, float noise aside (True for none or one)."""
    values = np.asarray(values, dtype=float)
    return len(values) < 2 or bool(np.ptp(values) <= _SAME * max(1.0, float(np.max(np.abs(values)))))


def percentile_interval(distribution: np.ndarray, confidence: float = 0.95) -> tuple[float, float] | None:
    """The percentile interval of a bootstrap distribution, undefined resamples (NaN) left out.

    None when no resample is defined or every resample gives the same value: a zero-width
    interval is not a CI.
    """
    values = np.asarray(distribution, dtype=float)
    values = values[~np.isnan(values)]
    if len(values) == 0 or all_equal(values):
        return None
    tail = round((1 - confidence) / 2, 12)  # 0.025 exactly, not 0.025000000000000022
    low, high = np.quantile(values, [tail, 1 - tail])
    return float(low), float(high)


def _bootstrap_mean(values: np.ndarray, method: str, confidence: float, n_resamples: int,
                    seed: int) -> tuple[float, float] | None:
    from scipy.stats import DegenerateDataWarning, bootstrap

    if ci_missing(values) is not None:
        return None
    # The resamples pick positions: sorted, the same values give the same interval in any
    # order (the genai route hands rows over in the order MLflow finished them).
    values = np.sort(values)
    with warnings.catch_warnings():  # a degenerate BCa is reported as None below, not as a warning
        warnings.simplefilter("ignore", DegenerateDataWarning)
        result = bootstrap((values,), np.mean, n_resamples=n_resamples, method=method, vectorized=True,
                           confidence_level=confidence, batch=_batch(len(values)), rng=np.random.default_rng(seed))
    low, high = float(result.confidence_interval.low), float(result.confidence_interval.high)
    if not (np.isfinite(low) and np.isfinite(high)):  # BCa on a degenerate distribution
        return None
    return low, high


def mean_ci(values: Sequence[float] | np.ndarray, *, confidence: float = 0.95,
            n_resamples: int = MEAN_CI_RESAMPLES, seed: int = SEED) -> tuple[float, float] | None:
    """Seeded percentile bootstrap CI of the mean of ``values`` (see the module docstring).

    Returns:
        ``(low, high)``, or None when not computable (:func:`ci_missing`).
    """
    return _bootstrap_mean(np.asarray(values, dtype=float), "percentile", confidence, n_resamples, seed)


def paired_difference_ci(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray, *,
                         confidence: float = 0.95, n_resamples: int = PAIRED_CI_RESAMPLES,
                         seed: int = SEED) -> tuple[float, float] | None:
    """Seeded BCa bootstrap CI of ``mean(b - a)`` over paired rows (see the module docstring).

    Returns:
        ``(low, high)``, or None when not computable: fewer than two pairs, or every pair
        differs by the same amount (:func:`ci_missing` of ``b - a``).
    """
    diff = np.asarray(b, dtype=float) - np.asarray(a, dtype=float)
    return _bootstrap_mean(diff, "BCa", confidence, n_resamples, seed)


def wilcoxon_p(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray) -> float | None:
    """Two-sided Wilcoxon signed-rank p-value of ``b - a`` (zero differences dropped; exact for
    small samples, as scipy chooses). 1.0 when every difference is zero (no evidence of a
    change); None when there is no pair."""
    diff = np.asarray(b, dtype=float) - np.asarray(a, dtype=float)
    if len(diff) == 0:
        return None
    if np.all(diff == 0):
        return 1.0
    from scipy.stats import wilcoxon

    return float(wilcoxon(diff, zero_method="wilcox").pvalue)


def regression_p(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray, tolerance: float, *,
                 greater_is_better: bool = True) -> float | None:
    """One-sided p-value that the mean of ``b`` regressed against ``a`` by more than ``tolerance``.

    The paired t-test of the direction-adjusted differences ``d = sign * (b - a)``: H0
    ``mean(d) >= -tolerance`` against ``mean(d) < -tolerance``, ``t = (mean(d) + tolerance) /
    (sd(d) / sqrt(n))`` on ``n - 1`` degrees of freedom. It tests the mean, which is what the
    gate's rule is stated on (a rank test of the shifted differences tests their pseudo-median:
    a drop of 1 on a few rows, the rest unchanged, has a median drop of 0). Small p: the drop is
    beyond the tolerance and unlikely to be noise. Where every difference is the same
    (``sd`` 0), the mean is known: 0.0 when it is below ``-tolerance``, else 1.0. None with
    fewer than 2 pairs.
    """
    sign = 1.0 if greater_is_better else -1.0
    shifted = sign * (np.asarray(b, dtype=float) - np.asarray(a, dtype=float)) + float(tolerance)
    if len(shifted) < 2:
        return None
    shifted[np.isclose(shifted, 0.0, atol=1e-12)] = 0.0  # float noise of scores read back from tables
    mean, sd = float(shifted.mean()), float(shifted.std(ddof=1))
    if sd < 1e-12:
        return 0.0 if mean < -1e-12 else 1.0
    from scipy.stats import t

    return float(t.cdf(mean / (sd / np.sqrt(len(shifted))), df=len(shifted) - 1))


def holm(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values, in the given order (None stays None and is not
    counted among the tests).

    Testing m metrics at level alpha each rejects a true "no change" somewhere far more often
    than alpha (10 independent metrics at 5%: 40%); rejecting where the adjusted p < alpha
    keeps that family-wise rate at alpha, whatever the dependence between the metrics, and
    is never less powerful than Bonferroni.
    """
    tested = sorted((p, i) for i, p in enumerate(p_values) if p is not None)
    m = len(tested)
    out: list[float | None] = [None] * len(p_values)
    running = 0.0
    for rank, (p, i) in enumerate(tested):
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = running
    return out


@dataclass(frozen=True)
class PairedDelta:
    """``b`` against ``a`` over paired rows: means, the mean difference, its CI, Wilcoxon p."""

    n: int
    mean_a: float | None
    mean_b: float | None
    delta: float | None  # mean of (b - a)
    ci_low: float | None
    ci_high: float | None
    p_value: float | None
    #: why there is no CI (None when there is one)
    ci_missing: str | None = None


def paired_delta(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray, *,
                 confidence: float = 0.95, n_resamples: int = PAIRED_CI_RESAMPLES,
                 seed: int = SEED) -> PairedDelta:
    """The paired comparison of scores ``a`` and ``b`` (same length, row i paired with row i)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(a) != len(b):
        raise ValueError(f"paired scores differ in length: {len(a)} vs {len(b)}")
    if len(a) == 0:
        return PairedDelta(0, None, None, None, None, None, None, ci_missing([], "paired differences"))
    ci = paired_difference_ci(a, b, confidence=confidence, n_resamples=n_resamples, seed=seed)
    return PairedDelta(
        n=len(a), mean_a=float(a.mean()), mean_b=float(b.mean()), delta=float((b - a).mean()),
        ci_low=None if ci is None else ci[0], ci_high=None if ci is None else ci[1],
        p_value=wilcoxon_p(a, b),
        ci_missing=None if ci is not None else (ci_missing(b - a, "paired differences") or _UNDEFINED),
    )


# -- pairing ----------------------------------------------------------------------------------
def row_keys(questions: Iterable[str], references: Iterable[object]) -> list[str]:
    """A key per row that stays fixed between pipeline versions: the question and the
    reference (non-string references count as none), with an occurrence count so that a
    repeated question pairs first with first, second with second. Never the position."""
    seen: Counter = Counter()
    keys = []
    for question, reference in zip(questions, references):
        base = json.dumps([question, reference if isinstance(reference, str) else None])
        keys.append(f"{base}#{seen[base]}")
        seen[base] += 1
    return keys


def pair_rows(keys_a: Sequence[str], keys_b: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Indices ``(ia, ib)`` of the rows present in both, in ``a``'s order: ``a[ia[j]]`` pairs
    with ``b[ib[j]]``."""
    index_b = {k: i for i, k in enumerate(keys_b)}
    pairs = [(i, index_b[k]) for i, k in enumerate(keys_a) if k in index_b]
    if not pairs:
        return np.array([], dtype=int), np.array([], dtype=int)
    ia, ib = zip(*pairs)
    return np.array(ia, dtype=int), np.array(ib, dtype=int)


# -- agreement --------------------------------------------------------------------------------
#: the levels of measurement Krippendorff's alpha is computed at here
ALPHA_LEVELS = ("nominal", "interval")


def _alpha_terms(units: Iterable[Sequence[object]], level: str,
                 categories: dict[object, int]) -> np.ndarray:
    """One line of sums per unit with at least two votes (the others pair with nothing):
    ``[m, W / (m - 1), *pooled]``, where ``m`` is the unit's votes, ``W`` the sum over its
    ordered pairs of votes of the distance between them (nominal: 1 when they differ; interval:
    the squared difference), and ``pooled`` what the expected disagreement needs (nominal: the
    votes per category; interval: the sum of the votes and of their squares)."""
    if level not in ALPHA_LEVELS:
        raise ValueError(f"level must be one of {ALPHA_LEVELS}, got {level!r}")
    lines = []
    for unit in units:
        values = [v for v in unit if v is not None]
        m = len(values)
        if m < 2:
            continue
        if level == "nominal":
            for v in values:  # categories are numbered as first seen, shared by every unit
                categories.setdefault(v, len(categories))
            counts = np.bincount([categories[v] for v in values], minlength=len(categories)).astype(float)
            within = m * m - float((counts ** 2).sum())
            lines.append((m, within / (m - 1), counts))
        else:
            x = np.asarray(values, dtype=float)
            within = 2 * m * float((x ** 2).sum()) - 2 * float(x.sum()) ** 2
            lines.append((m, within / (m - 1), np.array([x.sum(), (x ** 2).sum()])))
    width = (len(categories) if level == "nominal" else 2) + 2
    out = np.zeros((len(lines), width))
    for i, (m, observed, pooled) in enumerate(lines):
        out[i, 0], out[i, 1] = m, observed
        out[i, 2 : 2 + len(pooled)] = pooled
    return out


def _alpha_from_sums(sums: np.ndarray, level: str) -> np.ndarray:
    """Alpha from column sums of :func:`_alpha_terms` (one line of sums per resample; NaN
    where undefined: fewer than two pairable votes, or no variation at all among the votes).

    ``alpha = 1 - D_o / D_e`` with ``D_o = sum_u W_u / (m_u - 1) / n`` and ``D_e`` the mean
    distance over all ordered pairs of the ``n`` pooled votes, so
    ``alpha = 1 - (n - 1) * sum_u W_u / (m_u - 1) / P`` where ``P`` is the sum of distances over
    the pooled pairs: nominal ``n^2 - sum_c n_c^2``, interval ``2 n sum x^2 - 2 (sum x)^2``.
    """
    sums = np.atleast_2d(sums)
    n, observed = sums[:, 0], sums[:, 1]
    if level == "nominal":
        pooled = n * n - (sums[:, 2:] ** 2).sum(axis=1)
    else:
        pooled = 2 * n * sums[:, 3] - 2 * sums[:, 2] ** 2
    # pooled disagreement of float noise only (interval votes all equal) is no variation
    scale = np.maximum(1.0, n * n * (1.0 if level == "nominal" else np.maximum(1.0, sums[:, 3])))
    defined = (n >= 2) & (pooled > _SAME * scale)
    with np.errstate(divide="ignore", invalid="ignore"):
        alpha = 1.0 - (n - 1) * observed / pooled
    return np.where(defined, alpha, np.nan)


def krippendorff_alpha(units: Iterable[Sequence[object]], level: str = "nominal") -> float | None:
    """Krippendorff's alpha of ``units``, each the votes of the raters on one decision (None:
    a rater gave none). ``level``: ``nominal`` (categories: verdicts) or ``interval`` (scores).

    1 is perfect agreement, 0 agreement at the level of chance, below 0 systematic
    disagreement. None when undefined: fewer than two votes on every decision, or every vote
    the same (no variation: agreement beyond chance cannot be told from none).
    """
    terms = _alpha_terms(units, level, {})
    value = float(_alpha_from_sums(terms.sum(axis=0), level)[0])
    return None if np.isnan(value) else value


def alpha_ci(groups: Sequence[Sequence[Sequence[object]]], level: str = "nominal", *,
             confidence: float = 0.95, n_resamples: int = ALPHA_CI_RESAMPLES,
             seed: int = SEED) -> tuple[float | None, tuple[float, float] | None]:
    """Krippendorff's alpha over the units of all ``groups`` (a group: one row's decisions),
    and its seeded percentile bootstrap CI resampling whole groups (:func:`resample_indices`).

    Returns:
        ``(alpha, (low, high))``; alpha None when undefined (:func:`krippendorff_alpha`), the
        CI None when alpha is, when there are fewer than two groups, or when every resample
        gives the same alpha.
    """
    categories: dict[object, int] = {}
    per_group = [_alpha_terms(units, level, categories) for units in groups]
    width = (len(categories) if level == "nominal" else 2) + 2
    sums = np.zeros((len(per_group), width))
    for i, terms in enumerate(per_group):
        if len(terms):
            sums[i, : terms.shape[1]] = terms.sum(axis=0)
    alpha = float(_alpha_from_sums(sums.sum(axis=0), level)[0]) if len(sums) else float("nan")
    if np.isnan(alpha):
        return None, None
    if len(sums) < 2:
        return alpha, None
    distribution = np.concatenate([
        _alpha_from_sums(sums[idx].sum(axis=1), level)
        for idx in np.array_split(resample_indices(len(sums), n_resamples, seed), max(1, n_resamples // _BATCH))
    ])
    return alpha, percentile_interval(distribution, confidence)
