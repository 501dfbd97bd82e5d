"""The gate's checks, as pure functions of a run's figures, a paired comparison and calibrations.

Each check is one row of the decision table: which metric, what kind of check, the value seen,
the threshold, and whether it passed. A failed check carries a one-line reason. A per-slice
check names its slice (``difficulty=hard``), shown beside its kind.

The figures checked are recomputed from the run's per-row table (:func:`verified_figures`),
whatever the run logged as metrics: a run logs only each metric's mean and CI bounds (the
counts and quantiles are its rows'), and one logged before that, with every statistic as a
metric, is read the same way. Anyone who can write to a run can overwrite its metrics
(``log_metric(run, "faithfulness/n_error", 0)``): a logged figure that disagrees with the rows
it summarizes is refused, not believed.
The PPI figures (``<metric>/ppi_*``) are not in the table: the gate recomputes those it decides
on from the human labels on the run's traces (:func:`mlflow_rag_eval.gate.evidence.recompute_ppi`),
and calibrations from their labels; neither is read from metrics.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from mlflow_rag_eval import stats
from mlflow_rag_eval._util.text_table import text_table
from mlflow_rag_eval.gate.policy import EVERY_SLICE, GatePolicy
from mlflow_rag_eval.keys import AGGREGATES, PPI_STATS, is_slice_key, split_aggregate_key

__all__ = [
    "AlteredRun", "Check", "calibration_check", "metric_checks", "regression_check", "regression_p_values",
    "slice_checks", "table", "verified_figures",
]


@dataclass(frozen=True)
class Check:
    """One row of the decision table."""

    metric: str
    kind: str  # required | min_scored_rows | max_error_rate | floor | ceiling | regression | calibration | judge
    value: Any
    threshold: Any
    passed: bool
    reason: str = ""  # why it failed (empty when it passed)
    delta: float | None = None  # paired delta vs the champion (direction-adjusted), when compared
    detail: str = ""  # CI and p of the delta, calibration figures...
    slice: str = ""  # ``<field>=<value>`` of a per-slice check (empty for the whole run)

    @property
    def label(self) -> str:
        """The kind, with the slice of a per-slice check: ``floor mean [difficulty=hard]``."""
        return f"{self.kind} [{self.slice}]" if self.slice else self.kind

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)


class AlteredRun(ValueError):
    """A run's logged figure disagrees with its rows table (or is not a finite number): the
    message names the run, the figure and both values."""


#: how far a logged figure may be from the table's and still be the same figure: the table keeps
#: 15 decimals (``eval_results_table.json``), and a route may sum the scores in another order
_NOISE = 1e-9


#: what MLflow's SQL stores keep for an infinite metric (they cannot store inf)
_LARGEST = float(np.finfo(float).max)


def _is_infinite(value: float) -> bool:
    return math.isinf(value) or abs(value) >= _LARGEST


def _is_number(value: float) -> bool:
    """Finite, and not MLflow's stored inf."""
    return math.isfinite(value) and abs(value) < _LARGEST


def _shown(value: float) -> str:
    """A logged figure as a message writes it: ``inf`` for MLflow's stored inf, counts as ints."""
    if _is_infinite(value):
        return "inf" if value > 0 else "-inf"
    return str(int(value)) if _is_number(value) and value.is_integer() else f"{value:g}"


def _table_figures(evaluation, metric: str) -> dict[str, float]:
    """Every statistic of the metric recomputed from the run's rows table
    (:meth:`~mlflow_rag_eval.compare.EvaluatedRun.summary`, as the evaluation computed them when
    it logged the run); none when the table has no score column for it."""
    from mlflow_rag_eval.compare import NonFiniteScores

    try:
        summary = evaluation.summary(metric)
    except NonFiniteScores as exc:
        raise AlteredRun(f"{exc}: no evaluation writes one; the table was altered after it was evaluated") from None
    return {} if summary is None else summary.as_metrics(metric)


def _disagreement(run_id: str, key: str, logged: float, recomputed: float | None) -> str | None:
    """Why a logged figure is not the table's (None when it is, within float noise)."""
    stat = split_aggregate_key(key)[1]
    if recomputed is not None and _is_number(logged):
        same = logged == recomputed if stat in ("n_scored", "n_error") else \
            math.isclose(logged, recomputed, rel_tol=_NOISE, abs_tol=_NOISE)
        if same:
            return None
    if stat == "n_error":
        table_says = f"has {int(recomputed)} errors" if recomputed is not None else "has no such metric"
    elif stat == "n_scored":
        table_says = f"has {int(recomputed)} scored rows" if recomputed is not None else "has no such metric"
    else:
        table_says = f"gives {recomputed:.6g}" if recomputed is not None else "gives none (no scored row, or no CI)"
    seed = (f", or its CI was computed with a bootstrap seed other than {stats.SEED}"
            if stat in ("ci_low", "ci_high") else "")
    return (f"run {run_id}: logged {key}={_shown(logged)} but its rows table {table_says}; "
            f"the run was altered after it was evaluated{seed}")


def verified_figures(evaluation, metrics, keys=()) -> dict[str, float]:
    """The run's figures for the gate, each one it checks recomputed from the run's rows table.

    For each metric of ``metrics`` (keys) in the table, its ``n_scored``, ``n_error`` and
    ``mean``; for each aggregate key of ``keys`` (``faithfulness/p10``: a floor's or a
    ceiling's), that statistic: each is :func:`~mlflow_rag_eval.results.summarize_values` of
    the table's rows (the function that computed the logged figure). Where the run logged the
    same figure as a metric (its mean and CI bounds; every statistic on a run logged before
    the statistics table, or with ``run_metrics="all"``), the logged one must agree. A metric
    the table has no column for stays out (the checks report it missing), and so does a
    statistic its rows cannot give (a CI of one row). Every other metric is the run's as
    logged: the PPI estimates, which the table does not hold, are refused when infinite (NaN
    is how ``mlflow-rag-eval ppi`` says "no interval": the checks fail on it).

    Raises:
        AlteredRun: a logged figure disagrees with the table beyond float noise, or is not a
            finite number, naming the run, the figure and both values.
    """
    logged = dict(evaluation.metrics)
    wanted: dict[str, set[str]] = {metric: {"n_scored", "n_error", "mean"} for metric in metrics}
    for key in keys:
        metric, stat = split_aggregate_key(key)
        if stat in AGGREGATES:
            wanted.setdefault(metric, set()).add(stat)
    out = dict(logged)
    for metric, wanted_stats in wanted.items():
        recomputed = _table_figures(evaluation, metric)
        for stat in sorted(wanted_stats):
            key = f"{metric}/{stat}"
            if key in logged:
                why = _disagreement(evaluation.run_id, key, logged[key], recomputed.get(key))
                if why:
                    raise AlteredRun(why)
            if key in recomputed:
                out[key] = recomputed[key]
    for metric in metrics:  # NaN is ppi's own "no interval" (it cannot delete a metric): left to the checks
        for stat in (*PPI_STATS, "ppi_confidence"):
            value = logged.get(f"{metric}/{stat}")
            if value is not None and _is_infinite(value):
                raise AlteredRun(f"run {evaluation.run_id}: logged {metric}/{stat}={_shown(value)} is not a finite "
                                 "number; the gate cannot decide on it")
    return out


def metric_checks(metrics: Mapping[str, float], policy: GatePolicy) -> list[Check]:
    """Required metrics present, scored rows, error rate, floors and ceilings, per gated metric."""
    checks: list[Check] = []
    logged = sorted({k.rsplit("/", 1)[0] for k in metrics
                     if k.endswith(("/n_scored", "/mean")) and not is_slice_key(k)})
    for metric in policy.gated_metrics:
        n_scored = metrics.get(f"{metric}/n_scored")
        if n_scored is None:
            close = difflib.get_close_matches(metric, logged, n=1)
            hint = f" (did you mean {close[0]}?)" if close else f" (logged: {', '.join(logged) or 'none'})"
            checks.append(Check(metric, "required", "missing", "logged", False,
                                f"{metric} was not logged by the evaluation{hint}"))
            continue
        n_scored = int(n_scored)
        ok = n_scored >= policy.min_scored_rows
        checks.append(Check(metric, "min_scored_rows", n_scored, policy.min_scored_rows, ok,
                            "" if ok else f"{metric}: {n_scored} scored rows < {policy.min_scored_rows}"))
        n_error = metrics.get(f"{metric}/n_error")
        if n_error is None:  # unknown is not zero: a run that hides its failures must not pass
            checks.append(Check(metric, "max_error_rate", None, policy.max_error_rate, False,
                                f"{metric}/n_error was not logged: the error rate is unknown, so "
                                f"max_error_rate {policy.max_error_rate:g} cannot be checked"))
            continue
        n_error = int(n_error)
        total = n_scored + n_error
        rate = n_error / total if total else 0.0
        ok = rate <= policy.max_error_rate
        checks.append(Check(
            metric, "max_error_rate", rate, policy.max_error_rate, ok,
            "" if ok else f"{metric}: error rate {rate:.3f} ({n_error}/{total}) > {policy.max_error_rate:g}",
        ))
    for limits, kind in ((policy.floors, "floor"), (policy.ceilings, "ceiling")):
        for key, threshold in limits.items():
            metric, stat = split_aggregate_key(key)
            if f"{metric}/n_scored" not in metrics:
                continue  # reported once, as a missing required metric
            value = metrics.get(key)
            if value is None:
                why = _why_missing(stat, metrics[f"{metric}/n_scored"])
                checks.append(Check(metric, f"{kind} {stat}", None, threshold, False, f"{key} was not logged ({why})"))
                continue
            ok = value >= threshold if kind == "floor" else value <= threshold
            sign = "<" if kind == "floor" else ">"
            checks.append(Check(metric, f"{kind} {stat}", value, threshold, ok,
                                "" if ok else f"{key} = {value:.3f} {sign} {kind} {threshold:g}"))
    return checks


def _why_missing(stat: str, n_scored: int) -> str:
    if stat in PPI_STATS:
        return ("the gate recomputes it from the human labels on the run's traces, and found too few: "
                "see the notes")
    if not n_scored:
        return "no row scored"
    if stat in ("ci_low", "ci_high"):
        return "the CI is not computable: fewer than 2 scored rows, or all of them equal"
    return "not in the run's metrics"


def _slice_targets(by_value: Mapping[str, dict[str, float]],
                   logged: Mapping[str, Any] | None) -> list[tuple[str, dict[str, float]]]:
    """(value, limits) to check on one field: ``*`` becomes every slice the run has (a named
    value's limits replacing ``*``'s for the same key); ``*`` stays itself where there is no
    slice to expand it to, and so does a named value the run lacks, to be reported missing."""
    every = by_value.get(EVERY_SLICE)
    named = {v: limits for v, limits in by_value.items() if v != EVERY_SLICE}
    if every is None or logged is None or not logged:
        return list(by_value.items())
    expanded = [(v, {**every, **named.get(v, {})}) for v in logged]
    return expanded + [(v, limits) for v, limits in named.items() if v not in logged]


def slice_checks(slices: Mapping[str, Any] | None, policy: GatePolicy) -> list[Check]:
    """The policy's per-slice limits against a run's ``rag_eval/slices.json`` (None: the run
    was not sliced): per limited slice and metric, its scored rows, then each limit.

    Nothing passes by absence (see :mod:`mlflow_rag_eval.gate.policy`): a field the run was not
    sliced by, a value it has no slice of, ``*`` on a field without slices, a statistic the slice
    could not compute. A metric the run did not evaluate is left to :func:`metric_checks`, which
    reports it once as missing.
    """
    checks: list[Check] = []
    fields = (slices or {}).get("fields", {})
    sliced_by = ", ".join((slices or {}).get("slice_by", [])) or "none"
    minimum = policy.min_slice_rows
    counted: set[tuple[str, str]] = set()  # (slice, metric) whose rows were checked
    for limits_by_field, kind in ((policy.slice_floors, "floor"), (policy.slice_ceilings, "ceiling")):
        for field, by_value in limits_by_field.items():
            logged = fields[field]["slices"] if field in fields else None
            for value, limits in _slice_targets(by_value, logged):
                where = f"{field}={value}"
                stats = None if logged is None else logged.get(value)
                if stats is None:
                    if logged is None:
                        why = (f"the run was not sliced by {field!r} (sliced by: {sliced_by}); evaluate it with "
                               f"slice_by including {field!r}")
                    elif value == EVERY_SLICE:
                        why = f"the run has no slice of {field!r}: no row has a value"
                    else:
                        why = f"the run has no slice {where} (its values: {', '.join(logged) or 'none'})"
                    checks += [Check(split_aggregate_key(key)[0], f"{kind} {split_aggregate_key(key)[1]}", "missing",
                                     threshold, False, f"{key} on slice {where}: {why}", slice=where)
                               for key, threshold in limits.items()]
                    continue
                for key, threshold in limits.items():
                    metric, stat = split_aggregate_key(key)
                    figures = stats["metrics"].get(metric)
                    if figures is None:
                        continue  # not evaluated: reported once, as a missing required metric
                    n_scored = int(figures["n_scored"])
                    if (where, metric) not in counted:
                        counted.add((where, metric))
                        ok = n_scored >= minimum
                        checks.append(Check(metric, "min_scored_rows", n_scored, minimum, ok, "" if ok else (
                            f"{metric} on slice {where}: {n_scored} scored rows < {minimum} "
                            "(slice_min_scored_rows)"), slice=where))
                    value_seen = figures.get(stat)
                    if value_seen is None:
                        checks.append(Check(metric, f"{kind} {stat}", None, threshold, False,
                                            f"{key} on slice {where} was not logged ({_why_missing(stat, n_scored)})",
                                            slice=where))
                        continue
                    ok = value_seen >= threshold if kind == "floor" else value_seen <= threshold
                    sign = "<" if kind == "floor" else ">"
                    checks.append(Check(metric, f"{kind} {stat}", value_seen, threshold, ok, "" if ok else (
                        f"{key} on slice {where} = {value_seen:.3f} {sign} {kind} {threshold:g} "
                        f"(n={n_scored})"), slice=where))
    return checks


def regression_p_values(champion, candidate, deltas: dict, policy: GatePolicy) -> dict[str, tuple[float | None, float | None]]:
    """Per ``max_regression`` metric, the raw one-sided regression p-value
    (:func:`mlflow_rag_eval.stats.regression_p`) and the same after the policy's correction
    across those metrics (Holm, or none): the family is the metrics gated together."""
    from mlflow_rag_eval.compare import paired_scores

    raw: dict[str, float | None] = {}
    for metric, tolerance in policy.max_regression.items():
        delta = deltas.get(metric)
        if delta is None or delta.delta is None:
            raw[metric] = None
            continue
        sa, sb = paired_scores(champion, candidate, metric)
        raw[metric] = stats.regression_p(sa, sb, tolerance, greater_is_better=delta.greater_is_better)
    names = list(raw)
    adjusted = stats.holm([raw[m] for m in names]) if policy.regression_test.correction == "holm" else \
        [raw[m] for m in names]
    return {m: (raw[m], adj) for m, adj in zip(names, adjusted)}


def regression_check(metric: str, champion, candidate, delta, policy: GatePolicy,
                     p_values: tuple[float | None, float | None] = (None, None)) -> Check:
    """The paired regression rule (see :mod:`mlflow_rag_eval.gate.policy`).

    ``delta`` is the comparison's :class:`~mlflow_rag_eval.compare.MetricDelta` (or None
    when the metric is not in both evaluations). The CI is the comparison's (BCa, seeded; see
    :mod:`mlflow_rag_eval.stats`) at the policy's ``confidence``. Where it is not computable:
    with ``decide_on: ci_low``, every pair differing by the same amount decides on that amount
    (every resample would give it); a single pair cannot bound a drop and is refused.
    """
    from mlflow_rag_eval.compare import paired_scores

    tolerance = policy.max_regression[metric]
    test = policy.regression_test
    if delta is None or delta.delta is None:
        why = "not in both evaluations" if delta is None else "no row scored in both evaluations"
        return Check(metric, "regression", None, -tolerance, False, f"{metric}: cannot test a regression: {why}")
    sign = 1.0 if delta.greater_is_better else -1.0
    sa, sb = paired_scores(champion, candidate, metric)
    ci = stats.paired_difference_ci(sa, sb, confidence=test.confidence)
    adjusted = sign * delta.delta
    pct = f"{test.confidence:.0%}"
    p = "-" if delta.p_value is None else f"{delta.p_value:.3g}"
    if ci is not None:
        low, high = sorted((sign * ci[0], sign * ci[1]))
        shown = f"{pct} CI [{low:+.3f}, {high:+.3f}]"
        noise = "the CI excludes 0" if high < 0 else "the CI includes 0: the drop may be noise"
    else:
        low = high = None
        missing = stats.ci_missing(sb - sa, "paired differences") or "the BCa interval is undefined"
        shown = f"{pct} CI not computable ({missing})"
        noise = "no CI to tell a real drop from noise"
    raw_p, adjusted_p = p_values
    correction = "Holm-adjusted" if test.correction == "holm" else "uncorrected"
    regression = ("" if raw_p is None else
                  f", regression p={raw_p:.3g} ({correction} {adjusted_p:.3g})")
    detail = (f"{shown}, Wilcoxon p={p}{regression}, n={delta.n_pairs} "
              f"(champion {delta.mean_a:.3f} -> candidate {delta.mean_b:.3f})")
    if test.decide_on == "test":
        alpha = 1.0 - test.confidence
        if adjusted_p is None:
            return Check(metric, "regression", None, alpha, False,
                         f"{metric}: cannot test a regression: {detail}", delta=adjusted, detail=detail)
        shown_ci = _family_ci(sa, sb, sign, test, len(policy.max_regression), (low, high))
        if shown_ci is not None and shown_ci[1][1] < -tolerance:  # the CI says it: no p-value overrules it
            return Check(metric, "regression", adjusted_p, alpha, False,
                         f"{metric} regressed: the whole {shown_ci[0]} [{shown_ci[1][0]:+.3f}, {shown_ci[1][1]:+.3f}] "
                         f"lies below -{tolerance:g}, {correction} p={adjusted_p:.3g} ({detail})",
                         delta=adjusted, detail=detail)
        ok = adjusted_p >= alpha
        reason = "" if ok else (f"{metric} regressed: the drop beyond {tolerance:g} is significant, {correction} "
                                f"p={adjusted_p:.3g} < {alpha:g} ({detail})")
        return Check(metric, "regression", adjusted_p, alpha, ok, reason, delta=adjusted, detail=detail)
    from mlflow_rag_eval.metrics import is_judge_graded

    if test.decide_on == "ppi" and is_judge_graded(metric):
        return _ppi_regression_check(metric, champion, candidate, delta, tolerance, test, detail)
    if test.decide_on in ("point", "ppi") or (low is None and len(sa) >= 2 and stats.all_equal(sb - sa)):
        decided = adjusted  # ci_low without a CI: every pair moved by exactly this much
    elif low is None:
        return Check(metric, "regression", None, -tolerance, False,
                     f"{metric}: cannot decide on the {pct} CI lower bound: {detail}", delta=adjusted, detail=detail)
    else:
        decided = low
    ok = decided >= -tolerance
    reason = ""
    if not ok:
        what = "paired delta" if test.decide_on in ("point", "ppi") or low is None else f"{pct} CI lower bound"
        reason = (f"{metric} regressed: {what} {decided:+.3f} < -{tolerance:g} "
                  f"({detail}; {noise})")
    return Check(metric, "regression", decided, -tolerance, ok, reason, delta=adjusted, detail=detail)


def _family_ci(sa, sb, sign: float, test, n_metrics: int, ci: tuple[float | None, float | None]):
    """The CI that refuses a drop under ``decide_on: test`` whatever the p-value: the printed
    one for a single metric or ``correction: none``; with Holm over several metrics, the
    Bonferroni-widened one (``1 - (1 - confidence) / n``), so that the CI rule keeps the
    family-wise rate the correction promises (a 95% CI per metric would refuse an unchanged
    candidate on one of ten metrics in about a fifth of gates). (label, (low, high)) or None."""
    if test.correction != "holm" or n_metrics <= 1:
        return None if ci[0] is None else (f"{test.confidence:.0%} CI", ci)
    level = 1.0 - (1.0 - test.confidence) / n_metrics
    wide = stats.paired_difference_ci(sa, sb, confidence=level)
    if wide is None:
        return None
    return f"{level:.2%} CI (Bonferroni over {n_metrics} metrics)", tuple(sorted((sign * wide[0], sign * wide[1])))


def _ppi_regression_check(metric: str, champion, candidate, delta, tolerance: float, test, detail: str) -> Check:
    """``decide_on: ppi``: the lower bound of the CI of the PPI estimates' difference decides."""
    from mlflow_rag_eval.stats.ppi import ppi_difference

    sign = 1.0 if delta.greater_is_better else -1.0
    diff = ppi_difference(champion.metrics, candidate.metrics, metric, confidence=test.confidence)
    if isinstance(diff, str):
        return Check(metric, "regression", None, -tolerance, False, f"{metric}: cannot decide on PPI: {diff}",
                     delta=sign * delta.delta, detail=detail)
    low, high = sorted((sign * diff.ci_low, sign * diff.ci_high))
    shown = (f"PPI estimate {sign * diff.delta:+.3f}, {test.confidence:.0%} CI [{low:+.3f}, {high:+.3f}] "
             f"(champion {champion.metrics[f'{metric}/ppi_mean']:.3f} -> candidate "
             f"{candidate.metrics[f'{metric}/ppi_mean']:.3f}); judge: {detail}")
    ok = low >= -tolerance
    reason = "" if ok else f"{metric} regressed: the PPI CI lower bound {low:+.3f} < -{tolerance:g} ({shown})"
    return Check(metric, "regression", low, -tolerance, ok, reason, delta=sign * delta.delta, detail=shown)


def calibration_check(metric: str, run, judge_fingerprint: str, policy: GatePolicy, recomputed=None) -> Check:
    """The judge's latest calibration on ``metric`` (an MLflow run, or None) against the policy.

    ``recomputed``: its :class:`~mlflow_rag_eval.calibration.calibrate.CalibrationResult` made
    again from its labels at gate time
    (:func:`~mlflow_rag_eval.calibration.calibrate.recompute_calibration`), or why it could not
    be: the figures checked are those, never the run's metrics, which can be overwritten.
    """
    need = policy.calibration
    threshold = f"rho >= {need.min_spearman:g}, n >= {need.min_labels}"
    if run is None:
        return Check(metric, "calibration", None, threshold, False,
                     f"no calibration record for judge {judge_fingerprint} on {metric}")
    detail = f"run {run.info.run_id}, recomputed from its labels"
    if recomputed is None or isinstance(recomputed, str):
        why = recomputed or "no labels to recompute it from"
        return Check(metric, "calibration", None, threshold, False,
                     f"{metric}: calibration run {run.info.run_id} cannot be recomputed from its labels ({why})",
                     detail=detail)
    figure = recomputed.figures["spearman"]
    rho, n = figure["value"], recomputed.n_scored
    if rho is None or (isinstance(rho, float) and math.isnan(rho)):
        return Check(metric, "calibration", None, threshold, False,
                     f"{metric}: calibration rho is undefined on {n} labels (constant scores or labels)",
                     detail=detail)
    if figure["ci_low"] is not None and figure["ci_high"] is not None:
        detail += f", 95% CI [{figure['ci_low']:.3f}, {figure['ci_high']:.3f}]"
    reasons = []
    if rho < need.min_spearman:
        reasons.append(f"calibration rho {rho:.2f} < {need.min_spearman:g} on {n} labels")
    if n < need.min_labels:
        reasons.append(f"calibration on {n} labels < min_labels {need.min_labels} (rho {rho:.2f})")
    return Check(metric, "calibration", f"rho {rho:.3f} on {n}", threshold, not reasons,
                 f"{metric}: " + "; ".join(reasons) if reasons else "", detail=detail)


def table(checks: list[Check]) -> str:
    """The checks as a fixed-width text table (the decision's, as printed)."""
    rows = [[c.metric, c.label, _fmt(c.value), _fmt(c.threshold), None if c.delta is None else f"{c.delta:+.4f}",
             "ok" if c.passed else "FAIL"] for c in checks]
    return text_table(["metric", "check", "value", "threshold", "Δ vs champion", "result"], rows, align="<<>>><")
