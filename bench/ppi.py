"""Benchmark: does the PPI interval cover the true mean at its nominal rate, where the judge's
own interval does not, and is it narrower than the human-only one?

Why: a judge's mean is biased by the judge; a gate deciding on it decides on the judge's
taste. Prediction-powered inference (:mod:`mlflow_rag_eval.stats.ppi`) corrects the bias with a few
human labels. Target: >= 93% coverage of the truth at 95% over 1,000 seeds, narrower than the
human-only interval.

Usage::

    python bench/ppi.py                       # 1,000 seeds, 2,000 rows, 200 human labels
    python bench/ppi.py --seeds 300 --rows 1000 --labels 100 --bias 0.1 --noise 0.3

Each seed draws a golden set whose rows a person would pass (1) with probability 0.7 — the
truth is 0.7 — and a judge with a known bias and noise: its score is
``clip(0.7 * label + 0.15 + bias + N(0, noise), 0, 1)`` (lenient by ``bias``, shrunk towards
the middle, noisy). Humans label a random ``--labels`` of the rows. Three 95% intervals for the
mean: the judge-only one (the run's ``<metric>/ci_low..ci_high``: a normal interval of the
judge's scores on every row), the human-only one (normal, on the labelled rows) and PPI++.
Printed: coverage of 0.7 and mean width for each.
"""

from __future__ import annotations

import argparse
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(_HERE))

import numpy as np  # noqa: E402

TRUTH = 0.7


def simulate(seed: int, rows: int, labels: int, bias: float, noise: float):
    """(human labels, judge on them, judge on the other rows) of one seed."""
    rng = np.random.default_rng(seed)
    y = rng.binomial(1, TRUTH, rows).astype(float)
    judge = np.clip(0.7 * y + 0.15 + bias + rng.normal(0, noise, rows), 0, 1)
    labelled = rng.choice(rows, labels, replace=False)
    rest = np.setdiff1d(np.arange(rows), labelled)
    return y[labelled], judge[labelled], judge[rest]


def intervals(y, f, u, confidence: float = 0.95) -> dict[str, tuple[float, float]]:
    from scipy.stats import norm

    from mlflow_rag_eval.stats.ppi import ppi_mean

    z = norm.ppf(1 - (1 - confidence) / 2)
    everyone = np.concatenate([f, u])

    def normal(values):
        half = z * values.std(ddof=1) / np.sqrt(len(values))
        return values.mean() - half, values.mean() + half

    estimate = ppi_mean(y, f, u, confidence=confidence)
    return {"judge only": normal(everyone), "human only": normal(y), "PPI++": (estimate.ci_low, estimate.ci_high)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=1000)
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--labels", type=int, default=200)
    parser.add_argument("--bias", type=float, default=0.05, help="the judge's leniency")
    parser.add_argument("--noise", type=float, default=0.2, help="sd of the judge's noise")
    args = parser.parse_args()
    covered, widths = {}, {}
    for seed in range(args.seeds):
        for name, (low, high) in intervals(*simulate(seed, args.rows, args.labels, args.bias, args.noise)).items():
            covered[name] = covered.get(name, 0) + (low <= TRUTH <= high)
            widths.setdefault(name, []).append(high - low)
    print(f"truth {TRUTH}, {args.rows} rows, {args.labels} human labels, judge bias {args.bias:+g}, "
          f"noise sd {args.noise:g}; 95% intervals over {args.seeds} seeds")
    print(f"{'interval':<12}{'coverage':>10}{'mean width':>12}")
    for name in ("judge only", "human only", "PPI++"):
        print(f"{name:<12}{covered[name] / args.seeds:>10.3f}{np.mean(widths[name]):>12.4f}")


if __name__ == "__main__":
    main()
