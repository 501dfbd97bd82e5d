"""Calibrate a judge-graded metric against human labels, and log the result for the gate.

A judge is only worth gating on if its scores track human judgement. :func:`calibrate` runs
one metric with one judge over human-labelled rows and reports how well the scores agree
with the labels, each figure with a seeded percentile-bootstrap 95% CI (rows resampled with
replacement by :func:`mlflow_rag_eval.stats.resample_indices`, the rule every bootstrap of this
package follows; resamples where a figure is undefined are left out; no CI from fewer than two
rows, or when every resample gives the same value — a zero-width interval is not a CI):

- Spearman rho and Kendall tau-b between score and label (rank agreement; the gate uses rho);
- Cohen's kappa, accuracy and balanced accuracy of the binarised decisions: a score counts as
  "yes" when ``score >= threshold`` (default 0.5), a label when ``label >= label_threshold``
  (default 0.5; 0/1 labels are unchanged by it);
- AUROC of the score for the label, when every label is 0 or 1.

Rank figures (rho, tau, AUROC) rank rows by their support confidence where the judge gives one
(the local judge's weakest-claim support probability), else by the score.

Only rows the metric scored count; judge failures (``n_error``) and rows the metric does not
apply to (``n_skipped``, e.g. an answer with no claim) are reported, not imputed.

With ``log=True`` a run goes to the experiment ``rag_eval-calibration`` (by default) with tags
``rag_eval.calibration=true``, ``rag_eval.calibration.metric`` (the metric key),
``rag_eval.judge``, ``rag_eval.judge_fingerprint``, ``rag_eval.prompts_version``; metrics
``calibration/<figure>`` with ``_ci_low``/``_ci_high``, ``calibration/n_labels``,
``/n_scored``, ``/n_error``, ``/n_skipped``; artifacts ``rag_eval/calibration.json`` and
``rag_eval/calibration_rows.json`` (label, score, justification per row; its sha256 in param
``rag_eval.calibration.rows_sha256``). The gate looks up the newest such run for its judge,
prompts version and metric, and recomputes its figures from the labels
(:func:`recompute_calibration`), never reading them from the metrics.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from mlflow_rag_eval import stats
from mlflow_rag_eval._util.text_table import text_table
from mlflow_rag_eval.calibration.labels import labels_from_run, load_labels
from mlflow_rag_eval.keys import metric_key
from mlflow_rag_eval.tracking.search import CALIBRATION_TAG

__all__ = ["CalibrationResult", "DEFAULT_EXPERIMENT", "FIGURES", "ROWS_FILE", "calibrate", "calibrate_from_run",
           "recompute_calibration"]

DEFAULT_EXPERIMENT = "rag_eval-calibration"
#: a calibration's rows (label, score, support, status, justification), sealed by digest in its params
ROWS_FILE = "rag_eval/calibration_rows.json"
FIGURES = ("spearman", "kendall_tau", "cohen_kappa", "accuracy", "balanced_accuracy", "auroc")


# -- figures, vectorised over bootstrap resamples: rows of (n_boot, n) matrices ------------------
# scipy.stats.bootstrap computes one statistic per call and turns an undefined resample (a rank
# correlation of a resample with constant scores) into NaN bounds; here six figures share each
# resample, and undefined resamples are left out. The resamples themselves come from stats.
def _pearson(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    x = x - x.mean(axis=1, keepdims=True)
    y = y - y.mean(axis=1, keepdims=True)
    den = np.sqrt((x * x).sum(axis=1) * (y * y).sum(axis=1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, (x * y).sum(axis=1) / np.where(den > 0, den, 1), np.nan)


def _spearman(s, y, sb, yb):
    from scipy.stats import rankdata

    return _pearson(rankdata(s, axis=1), rankdata(y, axis=1))


def _kendall(s, y, sb, yb):
    from scipy.stats import kendalltau

    return np.array([kendalltau(a, b).statistic for a, b in zip(s, y)], dtype=float)


def _kappa(s, y, sb, yb):
    po = (sb == yb).mean(axis=1)
    pe = sb.mean(axis=1) * yb.mean(axis=1) + (1 - sb.mean(axis=1)) * (1 - yb.mean(axis=1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(pe < 1, (po - pe) / np.where(pe < 1, 1 - pe, 1), np.nan)


def _accuracy(s, y, sb, yb):
    return (sb == yb).mean(axis=1)


def _balanced_accuracy(s, y, sb, yb):
    pos, neg = yb.sum(axis=1), (1 - yb).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpr = np.where(pos > 0, (sb * yb).sum(axis=1) / np.where(pos > 0, pos, 1), np.nan)
        tnr = np.where(neg > 0, ((1 - sb) * (1 - yb)).sum(axis=1) / np.where(neg > 0, neg, 1), np.nan)
    return (tpr + tnr) / 2


def _auroc(s, y, sb, yb):
    # Mann-Whitney U over average ranks: ties count one half, as roc_auc_score counts them.
    from scipy.stats import rankdata

    ranks = rankdata(s, axis=1)
    pos, neg = yb.sum(axis=1), (1 - yb).sum(axis=1)
    u = (ranks * yb).sum(axis=1) - pos * (pos + 1) / 2
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where((pos > 0) & (neg > 0), u / np.where(pos * neg > 0, pos * neg, 1), np.nan)


_FUNCS: dict[str, Callable] = {
    "spearman": _spearman, "kendall_tau": _kendall, "cohen_kappa": _kappa, "accuracy": _accuracy,
    "balanced_accuracy": _balanced_accuracy, "auroc": _auroc,
}


#: figures of how scores rank rows: computed on the rank scores (a support confidence) when given
RANK_FIGURES = ("spearman", "kendall_tau", "auroc")


def agreement(scores, labels, *, threshold: float = 0.5, label_threshold: float = 0.5,
              n_boot: int = 1000, seed: int = 0, rank_scores=None) -> dict[str, dict[str, float | None]]:
    """Each figure's value and bootstrap 95% CI (None where undefined) for paired arrays.

    ``rank_scores`` (optional, paired with ``scores``): what ranks the rows for Spearman,
    Kendall and AUROC — the rows' support confidence, finer than a share of claims; the
    binarised figures (kappa, accuracy) always use ``scores >= threshold``.
    """
    s = np.asarray(scores, dtype=float)
    y = np.asarray(labels, dtype=float)
    r = s if rank_scores is None else np.asarray(rank_scores, dtype=float)
    binary = bool(np.isin(y, (0.0, 1.0)).all())
    # row 0: the rows as they are (the figure's value); rows 1..n_boot: the resamples
    idx = np.vstack([np.arange(len(s)), stats.resample_indices(len(s), n_boot, seed)])
    S, Y, R = s[idx], y[idx], r[idx]
    Sb, Yb = (S >= threshold).astype(float), (Y >= label_threshold).astype(float)
    out: dict[str, dict[str, float | None]] = {}
    for name in FIGURES:
        if name == "auroc" and not binary:
            out[name] = {"value": None, "ci_low": None, "ci_high": None}
            continue
        ranked = R if name in RANK_FIGURES else S
        values = _FUNCS[name](ranked, Y, Sb, Yb) if len(s) else np.full(n_boot + 1, np.nan)
        point = values[0]
        ci = stats.percentile_interval(values[1:]) if len(s) >= 2 else None
        out[name] = {"value": None if np.isnan(point) else float(point),
                     "ci_low": None if ci is None else ci[0], "ci_high": None if ci is None else ci[1]}
    return out


@dataclass
class CalibrationResult:
    """How a judge-graded metric agrees with human labels."""

    metric: str
    judge: str
    judge_fingerprint: str
    prompts_version: str
    n_labels: int
    n_scored: int
    n_error: int
    n_skipped: int
    threshold: float
    label_threshold: float
    binary_labels: bool
    figures: dict[str, dict[str, float | None]]
    n_boot: int
    seed: int
    labels_digest: str
    rows: pd.DataFrame = field(repr=False, default_factory=pd.DataFrame)
    run_id: str | None = None

    @property
    def spearman(self) -> float | None:
        """Spearman rho, the figure the gate checks."""
        return self.figures["spearman"]["value"]

    def as_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k != "rows"}
        out["schema_version"] = 1
        return out

    def to_text(self) -> str:
        rows = [[name, None if f["value"] is None else f"{f['value']:.3f}",
                 None if f["ci_low"] is None else f"[{f['ci_low']:.3f}, {f['ci_high']:.3f}]"]
                for name, f in self.figures.items()]
        lines = [
            f"calibration of {self.metric} by judge {self.judge} (fingerprint {self.judge_fingerprint}, "
            f"prompts {self.prompts_version})",
            f"labels: {self.n_labels}   scored: {self.n_scored}   errors: {self.n_error}   "
            f"not applicable: {self.n_skipped}   binarised at score >= {self.threshold:g}, "
            f"label >= {self.label_threshold:g}",
            f"95% CIs: percentile bootstrap, {self.n_boot} resamples, seed {self.seed} "
            "(- where undefined or every resample agrees)",
            text_table(["figure", "value", "95% CI"], rows),
        ]
        if self.run_id:
            lines.append(f"logged to run {self.run_id}")
        return "\n".join(lines)


def calibrate(labels: pd.DataFrame | str | Path, metric: str = "faithfulness", judge=None, *,
              threshold: float | None = None, label_threshold: float = 0.5, n_boot: int = 1000,
              seed: int = 0, limit: int | None = None, log: bool = True,
              experiment: str = DEFAULT_EXPERIMENT, client=None) -> CalibrationResult:
    """Score labelled rows with ``metric`` and ``judge`` and measure agreement with the labels.

    Args:
        labels: a DataFrame or a CSV/JSONL file (see :func:`load_labels`).
        judge: a judge name or object (default: the local MiniLM judge).
        threshold: score at or above which the metric says "yes" (default 0.5).
        limit: judge a seeded random sample of this many rows (``seed``), in file order.
        log: log a calibration run that the gate finds (see the module docstring).
    """
    from mlflow_rag_eval.evaluation.engine import evaluate_records
    from mlflow_rag_eval.records import records_from_frame

    threshold = 0.5 if threshold is None else float(threshold)
    frame = load_labels(labels)
    if limit is not None and limit < len(frame):
        frame = frame.sample(n=limit, random_state=seed).sort_index().reset_index(drop=True)
    records = records_from_frame(frame)
    available = {"answer", "contexts"} | ({"reference"} if "reference" in frame.columns else set())
    result = evaluate_records(records, metrics=[metric], judge=judge, available_fields=available)
    (scored,) = result.metrics
    rows = pd.DataFrame({
        "id": frame["id"] if "id" in frame.columns else range(len(frame)),
        "label": frame["label"],
        "score": [r.value for r in scored.rows],
        "support": [r.details.get("support", r.value) for r in scored.rows],
        "status": [r.status for r in scored.rows],
        "justification": [r.justification for r in scored.rows],
    })
    digest = hashlib.sha256(
        frame[["answer", "contexts", "label"]].to_json(orient="records").encode()).hexdigest()[:16]
    out = _result(rows, metric=metric_key(scored.name), judge=result.judge.name,
                  judge_fingerprint=result.judge.fingerprint, prompts_version=result.judge.prompts_version,
                  threshold=threshold, label_threshold=label_threshold, n_boot=n_boot, seed=seed,
                  labels_digest=digest)
    if log:
        out.run_id = _log(out, experiment, client, source=str(labels) if isinstance(labels, (str, Path)) else None)
    return out


def _result(rows: pd.DataFrame, *, metric: str, judge: str, judge_fingerprint: str, prompts_version: str,
            threshold: float, label_threshold: float, n_boot: int, seed: int,
            labels_digest: str) -> CalibrationResult:
    """Agreement figures over the scored rows of ``rows`` (label, score, status per row)."""
    ok = rows["status"] == "scored"
    ranks = rows["support"][ok].to_numpy(dtype=float) if "support" in rows else None
    figures = agreement(rows["score"][ok].to_numpy(dtype=float), rows["label"][ok].to_numpy(dtype=float),
                        threshold=threshold, label_threshold=label_threshold, n_boot=n_boot, seed=seed,
                        rank_scores=ranks)
    return CalibrationResult(
        metric=metric, judge=judge, judge_fingerprint=judge_fingerprint, prompts_version=prompts_version,
        n_labels=len(rows), n_scored=int(ok.sum()), n_error=int((rows["status"] == "error").sum()),
        n_skipped=int((rows["status"] == "skipped").sum()), threshold=threshold,
        label_threshold=label_threshold, binary_labels=bool(rows["label"].isin((0.0, 1.0)).all()),
        figures=figures, n_boot=n_boot, seed=seed, labels_digest=labels_digest, rows=rows,
    )


# -- human labels left on an evaluation run's traces -------------------------------------------

def calibrate_from_run(run_id: str, metric: str = "faithfulness", *, label_name: str | None = None,
                       threshold: float | None = None, label_threshold: float = 0.5, n_boot: int = 1000,
                       seed: int = 0, log: bool = True, experiment: str = DEFAULT_EXPERIMENT,
                       client=None) -> CalibrationResult:
    """Calibrate the judge of an evaluation run against the human labels left on its traces
    (in the MLflow UI, or with ``mlflow.log_feedback`` and a HUMAN source): the same record
    :func:`calibrate` makes from a labels file, for the run's judge fingerprint and prompts
    version, so the gate finds it. No judge call is made: the scores are the run's own."""
    rows, identity = labels_from_run(run_id, metric, label_name=label_name, client=client)
    if rows.empty:
        raise ValueError(
            f"run {run_id} has no human {label_name or metric_key(metric)!r} feedback on its traces; "
            "label rows in the MLflow UI (or with mlflow.log_feedback, source HUMAN) first"
        )
    digest = hashlib.sha256(
        rows[["id", "label"]].to_json(orient="records").encode()).hexdigest()[:16]
    out = _result(rows, metric=metric_key(metric), judge=identity["judge"],
                  judge_fingerprint=identity["judge_fingerprint"], prompts_version=identity["prompts_version"],
                  threshold=0.5 if threshold is None else float(threshold), label_threshold=label_threshold,
                  n_boot=n_boot, seed=seed, labels_digest=digest)
    if log:
        out.run_id = _log(out, experiment, client, source=f"run:{run_id}", label_name=label_name)
    return out


def _log(result: CalibrationResult, experiment: str, client, source: str | None,
         label_name: str | None = None) -> str:
    import mlflow
    from mlflow.entities import Metric, Param

    client = client or mlflow.MlflowClient()
    found = client.get_experiment_by_name(experiment)
    experiment_id = found.experiment_id if found else client.create_experiment(experiment)
    tags = {
        CALIBRATION_TAG: "true", f"{CALIBRATION_TAG}.metric": result.metric, "rag_eval.judge": result.judge,
        "rag_eval.judge_fingerprint": result.judge_fingerprint, "rag_eval.prompts_version": result.prompts_version,
    }
    run = client.create_run(experiment_id, tags=tags, run_name=f"calibrate-{result.metric}-{result.judge}")
    run_id = run.info.run_id
    now = int(time.time() * 1000)
    metrics = {f"calibration/{k}": float(getattr(result, k))
               for k in ("n_labels", "n_scored", "n_error", "n_skipped")}
    for name, figure in result.figures.items():
        for stat, suffix in (("value", ""), ("ci_low", "_ci_low"), ("ci_high", "_ci_high")):
            if figure[stat] is not None:  # undefined figures are left out, never NaN
                metrics[f"calibration/{name}{suffix}"] = figure[stat]
    rows_text = json.dumps(result.rows.to_dict(orient="records"), default=str)
    params = {"threshold": result.threshold, "label_threshold": result.label_threshold,
              "n_boot": result.n_boot, "seed": result.seed, "labels_digest": result.labels_digest,
              "labels_source": source or "DataFrame", "judge": result.judge,
              "rows_sha256": hashlib.sha256(rows_text.encode("utf-8")).hexdigest(),
              **({"label_name": label_name} if label_name else {})}
    client.log_batch(run_id, metrics=[Metric(k, v, now, 0) for k, v in metrics.items()],
                     params=[Param(f"rag_eval.calibration.{k}", str(v)[:6000]) for k, v in params.items()])
    client.log_dict(run_id, result.as_dict(), "rag_eval/calibration.json")
    client.log_text(run_id, rows_text, ROWS_FILE)
    client.set_terminated(run_id)
    return run_id


def recompute_calibration(run, client=None) -> CalibrationResult:
    """A logged calibration's figures recomputed from its labels, never read from its metrics
    (which anyone who can write to the run can overwrite): for a calibration made from an
    evaluation run's HUMAN feedback (``labels_source`` ``run:<id>``), from that feedback and the
    run's scores again; for one made from a labels file, from its ``rag_eval/calibration_rows.json``
    (label and judge score per row), checked against the sha256 sealed in its params
    (``rag_eval.calibration.rows_sha256``; calibrations logged before it are recomputed unchecked).

    Raises:
        ValueError: the rows are not the sealed ones, the labels are gone, or they are another
            judge's than the calibration says.
    """

    import mlflow

    client = client or mlflow.MlflowClient()
    params, tags = run.data.params, run.data.tags

    def param(name: str, default: Any = None) -> Any:
        return params.get(f"{CALIBRATION_TAG}.{name}", default)

    metric = tags[f"{CALIBRATION_TAG}.metric"]
    settings = {"threshold": float(param("threshold", 0.5)), "label_threshold": float(param("label_threshold", 0.5)),
                "n_boot": int(param("n_boot", 1000)), "seed": int(param("seed", 0))}
    source = param("labels_source", "")
    if source.startswith("run:"):
        out = calibrate_from_run(source[4:], metric, label_name=param("label_name"), log=False, client=client,
                                 **settings)
    else:
        from mlflow_rag_eval._util.mlflow_compat import read_run_artifact  # imports MLflow
        raw = read_run_artifact(client, run.info.run_id, ROWS_FILE)
        sealed = param("rows_sha256")
        if sealed and hashlib.sha256(raw).hexdigest() != sealed:
            raise ValueError(f"calibration run {run.info.run_id}: its {ROWS_FILE} is not the one sealed when it was "
                             "logged (param rag_eval.calibration.rows_sha256): it was edited afterwards")
        out = _result(pd.DataFrame(json.loads(raw)), metric=metric, judge=param("judge", tags.get("rag_eval.judge")),
                      judge_fingerprint=tags.get("rag_eval.judge_fingerprint"),
                      prompts_version=tags.get("rag_eval.prompts_version"), labels_digest=param("labels_digest", ""),
                      **settings)
    claimed = (tags.get("rag_eval.judge_fingerprint"), tags.get("rag_eval.prompts_version"))
    if (out.judge_fingerprint, out.prompts_version) != claimed:
        raise ValueError(f"calibration run {run.info.run_id} says judge {claimed[0]} ({claimed[1]}), but its labels "
                         f"were scored by {out.judge_fingerprint} ({out.prompts_version})")
    out.run_id = run.info.run_id
    return out
