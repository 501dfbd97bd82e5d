"""Benchmark: how often does the gate refuse a candidate that did not change, over many metrics?

Why: the gate tests every metric of ``max_regression`` at once. Each test at 5% refuses an
unchanged pipeline by chance 5% of the time; over ten metrics that is about 40% of gates.
Holm's step-down correction (``regression_test.correction: holm``, the default) keeps the
family-wise rate at 5%. Target: with the correction, <= 5% of 1,000 seeds refused; without
it, more.

Usage::

    python bench/multiple_comparisons.py                 # 1,000 seeds, 10 metrics, 100 rows
    python bench/multiple_comparisons.py --seeds 200 --metrics 5 --rows 60 --tolerance 0.02

Each seed simulates a golden set whose rows have a true quality per metric (uniform in [0, 1],
the metrics correlated through a shared row difficulty), and two evaluations of the same
pipeline: each observes every row's quality plus judge noise (normal, sd 0.15, clipped to
[0, 1]) — a no-change candidate. The gate's own code decides each metric: the paired
one-sided regression test (``regression_p_values``) and ``regression_check`` under
``decide_on: test`` at confidence 0.95, with ``correction: holm`` and with ``correction: none``.
A seed counts as refused when any metric's check fails. Printed: the refusal rates with a
95% Wilson interval, and the rate one metric alone is refused at (the per-test level).
"""

from __future__ import annotations

import argparse
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(_HERE))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402


def _runs(rng, n_rows: int, n_metrics: int):
    from mlflow_rag_eval.compare import EvaluatedRun

    difficulty = rng.uniform(0, 1, n_rows)
    truth = np.clip(0.5 * difficulty[:, None] + 0.5 * rng.uniform(0, 1, (n_rows, n_metrics)), 0, 1)
    questions = [f"q{i}" for i in range(n_rows)]

    def observe(name: str):
        seen = np.clip(truth + rng.normal(0, 0.15, truth.shape), 0, 1).round(3)
        table = pd.DataFrame({"question": questions, "reference": ["ref"] * n_rows,
                              **{f"m{j}/score": seen[:, j] for j in range(n_metrics)}})
        return EvaluatedRun(name, {}, table, {})

    return observe("champion"), observe("candidate")


def _wilson(k: int, n: int) -> tuple[float, float]:
    if n == 0:
        return (0.0, 1.0)
    z, p = 1.959964, k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=1000)
    parser.add_argument("--metrics", type=int, default=10)
    parser.add_argument("--rows", type=int, default=100)
    parser.add_argument("--tolerance", type=float, default=0.0,
                        help="max_regression of every metric (0: any significant drop refuses)")
    args = parser.parse_args()

    from mlflow_rag_eval.compare import compare_evaluations
    from mlflow_rag_eval.gate.checks import regression_check, regression_p_values
    from mlflow_rag_eval.gate.policy import load_policy

    policies = {
        correction: load_policy({"max_regression": {f"m{j}": args.tolerance for j in range(args.metrics)},
                                 "regression_test": {"decide_on": "test", "correction": correction}})
        for correction in ("holm", "none")
    }
    refused = {c: 0 for c in policies}
    single = 0
    for seed in range(args.seeds):
        rng = np.random.default_rng(seed)
        champion, candidate = _runs(rng, args.rows, args.metrics)
        deltas = {d.metric: d for d in compare_evaluations(champion, candidate, n_boot=200).deltas}
        for correction, policy in policies.items():
            p_values = regression_p_values(champion, candidate, deltas, policy)
            checks = [regression_check(m, champion, candidate, deltas[m], policy, p_values[m])
                      for m in policy.max_regression]
            refused[correction] += not all(c.passed for c in checks)
            if correction == "none":
                single += not checks[0].passed
    n = args.seeds
    print(f"no-change candidate, {args.metrics} metrics, {args.rows} rows, tolerance {args.tolerance:g}, "
          f"decide_on: test at 95%, {n} seeds")
    print(f"{'correction':<12}{'refused':>9}{'rate':>8}   95% Wilson interval")
    for correction in ("holm", "none"):
        low, high = _wilson(refused[correction], n)
        print(f"{correction:<12}{refused[correction]:>9}{refused[correction] / n:>8.3f}   [{low:.3f}, {high:.3f}]")
    low, high = _wilson(single, n)
    print(f"{'one metric':<12}{single:>9}{single / n:>8.3f}   [{low:.3f}, {high:.3f}]   (the per-test level)")


if __name__ == "__main__":
    main()
