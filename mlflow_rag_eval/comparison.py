"""Paired comparison of two evaluated runs: per-metric deltas over the rows both runs share.

Rows are paired by what stays fixed between pipeline versions — the question and the
reference (with an occurrence count for repeated questions) — never by position. For each
metric, only rows scored in both runs count: the delta of means, a seeded bootstrap 95% CI of
the mean paired difference, and a Wilcoxon signed-rank p-value (exact for small samples).

Two runs are comparable only on the same dataset digest, judge fingerprint and prompts
version; otherwise :class:`NotComparable` is raised, unless the caller explicitly allows the
change — then every result carries a loud warning.
"""

from __future__ import annotations

import html
import json
import math
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

__all__ = ["Comparison", "MetricDelta", "NotComparable", "compare_runs", "load_evaluation", "EvaluatedRun"]


class NotComparable(ValueError):
    """The runs differ in what makes their numbers comparable (dataset, judge, prompts)."""


@dataclass(frozen=True)
class EvaluatedRun:
    """What the comparison needs from one evaluated run."""

    run_id: str
    params: dict[str, str]
    table: pd.DataFrame
    greater_is_better: dict[str, bool]

    @property
    def identity(self) -> dict[str, str | None]:
        return {
            "dataset digest": self.params.get("rag_eval.dataset_digest"),
            "judge fingerprint": self.params.get("rag_eval.judge_fingerprint"),
            "prompts version": self.params.get("rag_eval.prompts_version"),
        }

    def metric_keys(self) -> list[str]:
        return [c[: -len("/score")] for c in self.table.columns if c.endswith("/score")]

    def row_keys(self) -> list[str]:
        seen: Counter = Counter()
        keys = []
        for question, reference in zip(self.table["question"], self.table.get("reference", [None] * len(self.table))):
            base = json.dumps([question, reference if isinstance(reference, str) else None])
            keys.append(f"{base}#{seen[base]}")
            seen[base] += 1
        return keys


def load_evaluation(run_id: str, client=None) -> EvaluatedRun:
    """Read a run's per-row table, params and metric directions from the tracking store."""
    import mlflow

    client = client or mlflow.MlflowClient()
    run = client.get_run(run_id)
    if run.data.tags.get("rag_eval.evaluated") != "true":
        raise NotComparable(f"run {run_id} holds no rag evaluation")
    with tempfile.TemporaryDirectory() as tmp:
        path = client.download_artifacts(run_id, "eval_results_table.json", tmp)
        with open(path) as f:
            table = json.load(f)
        lineage_path = client.download_artifacts(run_id, "rag_eval/judge_lineage.json", tmp)
        with open(lineage_path) as f:
            lineage = json.load(f)
    frame = pd.DataFrame(table["data"], columns=table["columns"])
    directions = {
        m["name"].replace("@", "_at_").replace(":", "_"): m.get("greater_is_better", True)
        for m in lineage.get("metrics", [])
    }
    return EvaluatedRun(run_id, dict(run.data.params), frame, directions)


@dataclass(frozen=True)
class MetricDelta:
    metric: str
    n_pairs: int
    mean_a: float | None
    mean_b: float | None
    delta: float | None  # mean of (b - a) over the paired rows
    ci_low: float | None
    ci_high: float | None
    p_value: float | None
    greater_is_better: bool = True

    @property
    def verdict(self) -> str:
        if self.delta is None:
            return "no pairs"
        if self.ci_low is not None and self.ci_low > 0:
            return "better" if self.greater_is_better else "worse"
        if self.ci_high is not None and self.ci_high < 0:
            return "worse" if self.greater_is_better else "better"
        return "no clear change"


@dataclass
class Comparison:
    run_a: str
    run_b: str
    deltas: list[MetricDelta]
    n_shared_rows: int
    n_rows_a: int
    n_rows_b: int
    warnings: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_a": self.run_a, "run_b": self.run_b, "n_shared_rows": self.n_shared_rows,
            "n_rows_a": self.n_rows_a, "n_rows_b": self.n_rows_b, "warnings": self.warnings,
            "metrics": [{**d.__dict__, "verdict": d.verdict} for d in self.deltas],
        }

    def to_text(self) -> str:
        lines = [f"A = {self.run_a}   B = {self.run_b}   shared rows: {self.n_shared_rows} "
                 f"(A {self.n_rows_a}, B {self.n_rows_b})"]
        lines += [f"WARNING: {w}" for w in self.warnings]
        lines.append(f"{'metric':<24}{'n':>5}{'A':>9}{'B':>9}{'B-A':>9}{'95% CI':>20}{'p':>8}  verdict")
        for d in self.deltas:
            ci = f"[{d.ci_low:+.3f}, {d.ci_high:+.3f}]" if d.ci_low is not None else "-"
            lines.append(
                f"{d.metric:<24}{d.n_pairs:>5}{_fmt(d.mean_a):>9}{_fmt(d.mean_b):>9}"
                f"{_fmt(d.delta, signed=True):>9}{ci:>20}{_fmt(d.p_value):>8}  {d.verdict}"
            )
        return "\n".join(lines)

    def to_html(self) -> str:
        rows = "".join(
            f"<tr><td>{html.escape(d.metric)}</td><td>{d.n_pairs}</td><td>{_fmt(d.mean_a)}</td>"
            f"<td>{_fmt(d.mean_b)}</td><td>{_fmt(d.delta, signed=True)}</td>"
            f"<td>{'' if d.ci_low is None else f'[{d.ci_low:+.3f}, {d.ci_high:+.3f}]'}</td>"
            f"<td>{_fmt(d.p_value)}</td><td class='{d.verdict.replace(' ', '-')}'>{d.verdict}</td></tr>"
            for d in self.deltas
        )
        warnings = "".join(f"<p class='warning'>WARNING: {html.escape(w)}</p>" for w in self.warnings)
        return (
            "<!doctype html><html><head><meta charset='utf-8'>"
            "<meta http-equiv='Content-Security-Policy' content=\"default-src 'none'; style-src 'unsafe-inline'\">"
            "<title>RAG run comparison</title><style>body{font-family:sans-serif;margin:2em}"
            "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}"
            "td:first-child{text-align:left}.better{color:#070}.worse{color:#b00}"
            ".warning{color:#b00;font-weight:bold}</style></head><body>"
            f"<h1>B vs A</h1><p>A = {html.escape(self.run_a)}<br>B = {html.escape(self.run_b)}<br>"
            f"paired rows: {self.n_shared_rows} (A has {self.n_rows_a}, B has {self.n_rows_b})</p>{warnings}"
            "<table><tr><th>metric</th><th>pairs</th><th>A</th><th>B</th><th>B-A</th>"
            "<th>95% CI of B-A</th><th>Wilcoxon p</th><th>verdict</th></tr>"
            f"{rows}</table></body></html>"
        )


def _fmt(value: float | None, signed: bool = False) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:+.3f}" if signed else f"{value:.3f}"


def paired_delta(a: np.ndarray, b: np.ndarray, *, n_boot: int = 2000, seed: int = 0) -> tuple:
    """Mean of b - a, a bootstrap 95% CI of it, and the Wilcoxon signed-rank p-value."""
    diff = b - a
    n = len(diff)
    if n == 0:
        return None, None, None, None
    rng = np.random.default_rng(seed)
    means = diff[rng.integers(0, n, size=(n_boot, n))].mean(axis=1)
    low, high = (float(x) for x in np.quantile(means, [0.025, 0.975]))
    if np.all(diff == 0):
        p = 1.0
    else:
        from scipy.stats import wilcoxon

        p = float(wilcoxon(diff, zero_method="wilcox").pvalue)
    return float(diff.mean()), low, high, p


def compare_evaluations(a: EvaluatedRun, b: EvaluatedRun, *, allow_judge_change: bool = False,
                        allow_dataset_change: bool = False, n_boot: int = 2000, seed: int = 0) -> Comparison:
    """Compare two loaded evaluations (see :func:`compare_runs`)."""
    warnings = []
    for what, (va, vb) in {k: (a.identity[k], b.identity[k]) for k in a.identity}.items():
        if va == vb:
            continue
        allowed = allow_dataset_change if what == "dataset digest" else allow_judge_change
        message = f"the runs differ in {what}: {va} vs {vb}"
        if not allowed:
            flag = "--allow-dataset-change" if what == "dataset digest" else "--allow-judge-change"
            raise NotComparable(f"{message}; their numbers are not comparable ({flag} to compare anyway)")
        warnings.append(message + " (allowed by the caller: differences may come from that, not the pipeline)")
    keys_a, keys_b = a.row_keys(), b.row_keys()
    index_b = {k: i for i, k in enumerate(keys_b)}
    pairs = [(i, index_b[k]) for i, k in enumerate(keys_a) if k in index_b]
    if len(pairs) < len(keys_a) or len(pairs) < len(keys_b):
        warnings.append(f"only {len(pairs)} rows are in both runs (A {len(keys_a)}, B {len(keys_b)})")
    ia = np.array([p[0] for p in pairs], dtype=int)
    ib = np.array([p[1] for p in pairs], dtype=int)
    deltas = []
    for metric in [m for m in a.metric_keys() if m in set(b.metric_keys())]:
        sa = pd.to_numeric(a.table[f"{metric}/score"], errors="coerce").to_numpy(dtype=float)[ia] if len(ia) else np.array([])
        sb = pd.to_numeric(b.table[f"{metric}/score"], errors="coerce").to_numpy(dtype=float)[ib] if len(ib) else np.array([])
        both = ~np.isnan(sa) & ~np.isnan(sb)
        sa, sb = sa[both], sb[both]
        delta, low, high, p = paired_delta(sa, sb, n_boot=n_boot, seed=seed)
        deltas.append(MetricDelta(
            metric, int(both.sum()), float(sa.mean()) if len(sa) else None,
            float(sb.mean()) if len(sb) else None, delta, low, high, p,
            a.greater_is_better.get(metric, True),
        ))
    return Comparison(a.run_id, b.run_id, deltas, len(pairs), len(keys_a), len(keys_b), warnings)


def compare_runs(run_a: str, run_b: str, *, allow_judge_change: bool = False,
                 allow_dataset_change: bool = False, log_to: str | None = None, client=None,
                 n_boot: int = 2000, seed: int = 0) -> Comparison:
    """Compare run B against run A, paired over their shared rows.

    Raises NotComparable when the dataset digest, judge fingerprint or prompts version
    differ, unless allowed. ``log_to``: a run id that gets ``rag_eval/comparison_<A>_<B>.html``
    and ``.json`` artifacts.
    """
    import mlflow

    client = client or mlflow.MlflowClient()
    comparison = compare_evaluations(
        load_evaluation(run_a, client), load_evaluation(run_b, client),
        allow_judge_change=allow_judge_change, allow_dataset_change=allow_dataset_change,
        n_boot=n_boot, seed=seed,
    )
    if log_to is not None:
        stem = f"rag_eval/comparison_{run_a[:8]}_{run_b[:8]}"
        client.log_text(log_to, comparison.to_html(), f"{stem}.html")
        client.log_dict(log_to, comparison.as_dict(), f"{stem}.json")
    return comparison

