"""Paired comparison of two evaluated runs: per-metric deltas over the rows both runs share.

Rows are paired by what stays fixed between pipeline versions — the question and the
reference (with an occurrence count for repeated questions) — never by position
(:func:`mlflow_rag_eval.stats.row_keys`). For each metric, only rows scored in both runs count:
the delta of means, a seeded BCa bootstrap 95% CI of the mean paired difference, and a Wilcoxon
signed-rank p-value (exact for small samples); see :mod:`mlflow_rag_eval.stats` for the methods
and for when a CI is not computable.

Two runs are comparable only on the same dataset digest, judge fingerprint and prompts
version; otherwise :class:`NotComparable` is raised, unless the caller explicitly allows the
change — then every result carries a loud warning.

Each metric's Wilcoxon p-value is also shown Holm-adjusted across the metrics compared
together (:func:`mlflow_rag_eval.stats.holm`): with ten metrics, one raw p below 0.05 turns up
in about 40% of comparisons of two identical pipelines; an adjusted p below 0.05 in 5%. The
verdicts stay per metric (each metric's CI); the adjusted p says which of them survive looking
at all the metrics at once.

When both runs were sliced by the same field (:mod:`mlflow_rag_eval.evaluation.slices`), each slice of it
shows the two runs' slice means and their difference (:class:`SliceDelta`), read from the runs'
``rag_eval/slices.json``. That difference is of the two means, each over the rows the run scored
in the slice: it is not paired and has no CI (the table does not say which slice a row is in),
so it shows where a change happened; the paired per-metric deltas above it say whether the
change is real. A value only one run has is shown with the other side empty.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from mlflow_rag_eval import stats
from mlflow_rag_eval._util.text_table import text_table
from mlflow_rag_eval.evaluation.slices import load_slices
from mlflow_rag_eval.keys import metric_key, metrics_in_columns, score_column
from mlflow_rag_eval.results import MetricSummary, summarize_values

__all__ = [
    "Comparison", "EvaluatedRun", "MetricDelta", "NonFiniteScores", "NotComparable", "SliceDelta", "compare_evaluations",
    "compare_runs", "load_evaluation", "paired_scores", "slice_deltas",
]

#: the p-value under which the Wilcoxon test gives a verdict when no CI is computable
P_THRESHOLD = 0.05


class NotComparable(ValueError):
    """The runs differ in what makes their numbers comparable (dataset, judge, prompts)."""


class NonFiniteScores(ValueError):
    """A run's rows table holds a non-finite score: no evaluation writes one."""


@dataclass(frozen=True)
class EvaluatedRun:
    """What the comparison needs from one evaluated run."""

    run_id: str
    params: dict[str, str]
    table: pd.DataFrame
    greater_is_better: dict[str, bool]
    #: the run's ``rag_eval/slices.json`` (None when it was not sliced)
    slices: dict[str, Any] | None = None
    #: the run's MLflow metrics (the PPI estimates a reviewer's labels added, among others)
    metrics: dict[str, float] = field(default_factory=dict)
    #: sha256 of the bytes of the run's ``eval_results_table.json``, as read: which rows a
    #: decision made on this run saw (None when the table was not read from a run)
    table_sha256: str | None = None
    #: sha256 of the bytes of the run's ``rag_eval/judge_lineage.json``, as read (the directions'
    #: source; the gate checks it against the run's seal)
    lineage_sha256: str | None = None

    @property
    def identity(self) -> dict[str, str | None]:
        return {
            "dataset digest": self.params.get("rag_eval.dataset_digest"),
            "judge fingerprint": self.params.get("rag_eval.judge_fingerprint"),
            "prompts version": self.params.get("rag_eval.prompts_version"),
        }

    def metric_keys(self) -> list[str]:
        return metrics_in_columns(self.table.columns)

    def row_keys(self) -> list[str]:
        references = self.table["reference"] if "reference" in self.table else [None] * len(self.table)
        return stats.row_keys(self.table["question"], references)

    def scores(self, metric: str) -> np.ndarray:
        """The metric's score per row; NaN where the row has none (failed or not applicable)."""
        return pd.to_numeric(self.table[score_column(metric)], errors="coerce").to_numpy(dtype=float)

    def summary(self, metric: str) -> MetricSummary | None:
        """:func:`~mlflow_rag_eval.results.summarize_values` of the metric's rows in the table
        (``<key>/score``, ``<key>/error``), as the evaluation summarized them when it logged the
        run, in the metric's direction as the run's lineage records it (its worst rows are the
        highest of a lower-is-better metric); None when the table has no score column for it.
        A table without the ``<key>/error`` column counts no failed row (every evaluation writes it).

        Raises:
            NonFiniteScores: a scored row's value is infinite.
        """
        frame = self.table
        if score_column(metric) not in frame:
            return None
        scores = self.scores(metric)
        error_column = f"{metric_key(metric)}/error"  # beside <key>/score, as EvaluationResult.table writes it
        failed = pd.notna(frame[error_column]).to_numpy() if error_column in frame else np.zeros(len(frame), bool)
        scored = ~np.isnan(scores) & ~failed
        if not np.isfinite(scores[scored]).all():
            raise NonFiniteScores(f"run {self.run_id}: its rows table holds a non-finite {score_column(metric)}")
        n_error = int(failed.sum())
        return summarize_values(scores[scored], n_error, len(frame) - int(scored.sum()) - n_error,
                                greater_is_better=self.greater_is_better.get(metric_key(metric), True))

    def figures(self) -> dict[str, float]:
        """The run's MLflow metrics with every statistic of each metric in its table
        (``<key>/mean``, ``/n_scored``, ``/n_error``, ``/p10``...) recomputed from its rows
        (:meth:`summary`): the same figures whether the run logged them all as metrics (runs
        logged before the statistics table, or with ``run_metrics="all"``) or only the means."""
        out = dict(self.metrics)
        for metric in self.metric_keys():
            out.update(self.summary(metric).as_metrics(metric))
        return out


def load_evaluation(run_id: str, client=None) -> EvaluatedRun:
    """Read a run's per-row table, params and metric directions from the tracking store."""
    import mlflow

    from mlflow_rag_eval.tracking.search import is_evaluation_run

    client = client or mlflow.MlflowClient()
    run = client.get_run(run_id)
    if not is_evaluation_run(run):  # by its params: a tag can be deleted
        if run.data.tags.get("rag_eval.route") == "extra_metrics":
            raise NotComparable(
                f"run {run_id} was evaluated through extra_metrics, which MLflow's default evaluator logs "
                "metric by metric: it holds no rag evaluation (rows table, dataset digest, lineage) to pair "
                "rows on; evaluate with model_type='rag' or rag_scorers to compare or gate it")
        raise NotComparable(f"run {run_id} holds no rag evaluation")
    from mlflow_rag_eval._util.mlflow_compat import read_run_artifact  # imports MLflow
    raw = read_run_artifact(client, run_id, "eval_results_table.json")
    table = json.loads(raw)
    raw_lineage = read_run_artifact(client, run_id, "rag_eval/judge_lineage.json")
    lineage = json.loads(raw_lineage)
    frame = pd.DataFrame(table["data"], columns=table["columns"])
    directions = {metric_key(m["name"]): m.get("greater_is_better", True) for m in lineage.get("metrics", [])}
    return EvaluatedRun(run_id, dict(run.data.params), frame, directions, load_slices(run_id, client),
                        dict(run.data.metrics), hashlib.sha256(raw).hexdigest(), hashlib.sha256(raw_lineage).hexdigest())


def paired_scores(a: EvaluatedRun, b: EvaluatedRun, metric: str,
                  pairs: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Scores of ``metric`` on the rows both evaluations scored, paired by row key.

    Args:
        pairs: ``stats.pair_rows(a.row_keys(), b.row_keys())``, when the caller has it.
    """
    ia, ib = pairs if pairs is not None else stats.pair_rows(a.row_keys(), b.row_keys())
    sa, sb = a.scores(metric)[ia], b.scores(metric)[ib]
    both = ~np.isnan(sa) & ~np.isnan(sb)
    return sa[both], sb[both]


@dataclass(frozen=True)
class MetricDelta:
    metric: str
    n_pairs: int
    mean_a: float | None
    mean_b: float | None
    delta: float | None  # mean of (b - a) over the paired rows
    ci_low: float | None  # BCa bootstrap 95% CI of delta; None when not computable
    ci_high: float | None
    p_value: float | None
    greater_is_better: bool = True
    ci_missing: str | None = None  # why there is no CI
    #: ``p_value`` Holm-adjusted across the metrics of the comparison (see the module docstring)
    p_holm: float | None = None

    @property
    def verdict(self) -> str:
        """better / worse / no clear change, for B against A.

        The CI decides: better (worse) when it lies above (below) 0. Where no CI is computable
        (every pair differs by the same amount, or one pair), the Wilcoxon test at p <
        ``P_THRESHOLD`` decides the direction of a non-zero delta.
        """
        if self.delta is None:
            return "no pairs"
        up = "better" if self.greater_is_better else "worse"
        down = "worse" if self.greater_is_better else "better"
        if self.ci_low is not None and self.ci_high is not None:
            return up if self.ci_low > 0 else down if self.ci_high < 0 else "no clear change"
        if self.delta != 0 and self.p_value is not None and self.p_value < P_THRESHOLD:
            return up if self.delta > 0 else down
        return "no clear change"

    @property
    def ci_text(self) -> str | None:
        return None if self.ci_low is None else f"[{self.ci_low:+.3f}, {self.ci_high:+.3f}]"


@dataclass(frozen=True)
class SliceDelta:
    """One metric on one slice of both runs: each run's slice mean (over the rows it scored in
    the slice) and ``mean_b - mean_a``; not paired, no CI (see the module docstring)."""

    field: str
    value: str
    metric: str
    n_a: int | None  # scored rows of the slice in A (None: A has no such slice)
    n_b: int | None
    mean_a: float | None
    mean_b: float | None

    @property
    def delta(self) -> float | None:
        return None if self.mean_a is None or self.mean_b is None else self.mean_b - self.mean_a

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "delta": self.delta}


def slice_deltas(a: EvaluatedRun, b: EvaluatedRun, metrics: list[str]) -> list[SliceDelta]:
    """Per field both runs were sliced by, per value either run has, per metric of ``metrics``:
    the two slice means (from the runs' ``rag_eval/slices.json``)."""
    fields_a = (a.slices or {}).get("fields", {})
    fields_b = (b.slices or {}).get("fields", {})
    out = []
    for name in [f for f in fields_a if f in fields_b]:
        slices_a, slices_b = fields_a[name]["slices"], fields_b[name]["slices"]
        for value in sorted({*slices_a, *slices_b}):
            for metric in metrics:
                sa = slices_a.get(value, {}).get("metrics", {}).get(metric)
                sb = slices_b.get(value, {}).get("metrics", {}).get(metric)
                if sa is None and sb is None:
                    continue
                out.append(SliceDelta(name, value, metric, None if sa is None else sa["n_scored"],
                                      None if sb is None else sb["n_scored"], (sa or {}).get("mean"),
                                      (sb or {}).get("mean")))
    return out


@dataclass
class Comparison:
    run_a: str
    run_b: str
    deltas: list[MetricDelta]
    n_shared_rows: int
    n_rows_a: int
    n_rows_b: int
    warnings: list[str] = field(default_factory=list)
    #: per-slice means of both runs, on the fields both were sliced by
    slices: list[SliceDelta] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        out = {
            "run_a": self.run_a, "run_b": self.run_b, "n_shared_rows": self.n_shared_rows,
            "n_rows_a": self.n_rows_a, "n_rows_b": self.n_rows_b, "warnings": self.warnings,
            "metrics": [{**d.__dict__, "verdict": d.verdict} for d in self.deltas],
        }
        if self.slices:
            out["slices"] = [s.as_dict() for s in self.slices]
        return out

    def to_text(self) -> str:
        lines = [f"A = {self.run_a}   B = {self.run_b}   shared rows: {self.n_shared_rows} "
                 f"(A {self.n_rows_a}, B {self.n_rows_b})"]
        lines += [f"WARNING: {w}" for w in self.warnings]
        rows = [[d.metric, d.n_pairs, _fmt(d.mean_a), _fmt(d.mean_b), _fmt(d.delta, signed=True), d.ci_text,
                 _fmt(d.p_value), _fmt(d.p_holm), d.verdict] for d in self.deltas]
        lines.append(text_table(["metric", "n", "A", "B", "B-A", "95% CI of B-A", "Wilcoxon p", "Holm p", "verdict"],
                                rows, align="<>>>>>>><"))
        missing = [f"{d.metric}: no CI ({d.ci_missing})" for d in self.deltas if d.ci_missing and d.n_pairs]
        lines += missing
        if self.slices:
            lines += ["", "per slice (the difference of the two slice means: not paired, no CI):"]
            rows = [[s.field, s.value, s.metric, s.n_a, s.n_b, _fmt(s.mean_a), _fmt(s.mean_b),
                     _fmt(s.delta, signed=True)] for s in self.slices]
            lines.append(text_table(["field", "value", "metric", "n A", "n B", "A", "B", "B-A"], rows,
                                    align="<<<>>>>>"))
        return "\n".join(lines)

    def to_html(self) -> str:
        from mlflow_rag_eval.report.templating import render

        return render("comparison.html.j2", comparison=self, title="RAG run comparison")


def _fmt(value: float | None, signed: bool = False) -> str | None:
    if value is None:
        return None
    return f"{value:+.3f}" if signed else f"{value:.3f}"


def compare_evaluations(a: EvaluatedRun, b: EvaluatedRun, *, allow_judge_change: bool = False,
                        allow_dataset_change: bool = False, n_boot: int = stats.PAIRED_CI_RESAMPLES,
                        seed: int = stats.SEED) -> Comparison:
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
    pairs = stats.pair_rows(keys_a, keys_b)
    n_pairs = len(pairs[0])
    if n_pairs < len(keys_a) or n_pairs < len(keys_b):
        warnings.append(f"only {n_pairs} rows are in both runs (A {len(keys_a)}, B {len(keys_b)})")
    deltas = []
    in_b = set(b.metric_keys())
    for metric in [m for m in a.metric_keys() if m in in_b]:
        sa, sb = paired_scores(a, b, metric, pairs)
        d = stats.paired_delta(sa, sb, n_resamples=n_boot, seed=seed)
        deltas.append(MetricDelta(metric, d.n, d.mean_a, d.mean_b, d.delta, d.ci_low, d.ci_high, d.p_value,
                                  a.greater_is_better.get(metric, True), d.ci_missing))
    adjusted = stats.holm([d.p_value for d in deltas])
    deltas = [dataclasses.replace(d, p_holm=p) for d, p in zip(deltas, adjusted)]
    return Comparison(a.run_id, b.run_id, deltas, n_pairs, len(keys_a), len(keys_b), warnings,
                      slice_deltas(a, b, [d.metric for d in deltas]))


def calibration_warnings(client, a: EvaluatedRun, b: EvaluatedRun, metrics: list[str]) -> list[str]:
    """A warning per distinct judge of the two runs that has no calibration record (looked up
    now, so a calibration made after the evaluation counts) for a compared metric."""
    from mlflow_rag_eval.evaluation.result import uncalibrated_warning
    from mlflow_rag_eval.tracking.search import calibration_records

    out, seen = [], set()
    for run in (a, b):
        identity = (run.params.get("rag_eval.judge_fingerprint"), run.params.get("rag_eval.prompts_version"))
        if identity in seen or None in identity:
            continue
        seen.add(identity)
        records = calibration_records(client, metrics, *identity)
        warning = uncalibrated_warning(run.params.get("rag_eval.judge", identity[0]), records)
        if warning:
            out.append(warning)
    return out


def compare_runs(run_a: str, run_b: str, *, allow_judge_change: bool = False,
                 allow_dataset_change: bool = False, log_to: str | None = None, client=None,
                 n_boot: int = stats.PAIRED_CI_RESAMPLES, seed: int = stats.SEED) -> Comparison:
    """Compare run B against run A, paired over their shared rows.

    Raises NotComparable when the dataset digest, judge fingerprint or prompts version
    differ, unless allowed. A judge without a calibration record for a compared metric is
    named in the warnings. ``log_to``: a run id that gets ``rag_eval/comparison_<A>_<B>.html``
    and ``.json`` artifacts.
    """
    import mlflow

    client = client or mlflow.MlflowClient()
    a, b = load_evaluation(run_a, client), load_evaluation(run_b, client)
    comparison = compare_evaluations(
        a, b, allow_judge_change=allow_judge_change, allow_dataset_change=allow_dataset_change,
        n_boot=n_boot, seed=seed,
    )
    comparison.warnings += calibration_warnings(client, a, b, [d.metric for d in comparison.deltas])
    if log_to is not None:
        stem = f"rag_eval/comparison_{run_a[:8]}_{run_b[:8]}"
        client.log_text(log_to, comparison.to_html(), f"{stem}.html")
        client.log_dict(log_to, comparison.as_dict(), f"{stem}.json")
    return comparison
