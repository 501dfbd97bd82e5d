"""Finding what the gate judges: a model version's evaluation runs, the champion, calibrations.

Everything is found by MLflow search on tags, across every active experiment, so evaluation
and calibration runs may live in any experiment:

- a version's evaluations: ``tags.`rag_eval.model_id` = '<model id>' and
  tags.`rag_eval.evaluated` = 'true'`` (the evaluator tags each run with the logged model it
  evaluated; a registered version's model id is ``mv.model_id`` or its ``models:/<id>``
  source); when none is found, the version's own ``mv.run_id`` if that run is evaluated;
- calibrations: ``tags.`rag_eval.calibration` = 'true'`` with the metric, the judge
  fingerprint and the prompts version as tags.

Newest first (``attributes.start_time DESC``). Calibrations leave failed and killed runs out.
A version's evaluations are every run that says it evaluated the version, whatever its state
(deleted, in a deleted experiment, failed, killed, still running): the gate judges the newest
and refuses it when it is no finished, live run (:func:`unusable_state`), rather than quietly
judging an older one. Otherwise deleting or failing the newest evaluation would choose which
evidence the gate sees.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = [
    "CALIBRATION_TAG", "UnsearchableValue", "calibration_records", "champion_version", "evaluation_runs",
    "find_calibration",
    "model_aliases", "model_id_of", "search_all_experiments", "unusable_state",
]

CALIBRATION_TAG = "rag_eval.calibration"


class UnsearchableValue(ValueError):
    """A tag value that cannot go into an MLflow search filter (empty, quotes, backslashes)."""


def _literal(value: str) -> str:
    """A value quoted for a search filter; MLflow filters have no escape for quotes."""
    if not value or any(ch in value for ch in "'\"\\\n"):
        raise UnsearchableValue(f"refusing to search for {value!r}: quotes or backslashes in a tag value")
    return f"'{value}'"


def search_all_experiments(client, filter_string: str, max_results: int = 50, *,
                           every_state: bool = False) -> list:
    """Runs matching ``filter_string`` in every active experiment, newest first, failed and
    killed runs left out; ``every_state``: in every experiment, deleted ones too, and runs in
    any state (deleted, failed, killed, running), for a caller that must see them to refuse them."""
    from mlflow.entities import ViewType

    view = ViewType.ALL if every_state else ViewType.ACTIVE_ONLY
    experiment_ids, token = [], None
    while True:
        page = client.search_experiments(view_type=view, page_token=token)
        experiment_ids += [e.experiment_id for e in page]
        token = page.token
        if not token:
            break
    runs: list = []
    for start in range(0, len(experiment_ids), 100):  # stores cap the ids per query
        runs += client.search_runs(
            experiment_ids[start : start + 100], filter_string, run_view_type=view, max_results=max_results,
            order_by=["attributes.start_time DESC"],
        )
    if not every_state:
        runs = [r for r in runs if r.info.status not in ("FAILED", "KILLED")]
    return sorted(runs, key=lambda r: r.info.start_time or 0, reverse=True)[:max_results]


def unusable_state(run) -> str | None:
    """Why ``run`` is no finished, live run to decide on (``deleted (lifecycle_stage deleted)``,
    ``FAILED, not FINISHED``...), or None when it is one. A run still RUNNING or SCHEDULED is
    an evaluation that has not ended (or a process killed before it could say so): its table
    and figures may be partial."""
    if run.info.lifecycle_stage != "active":
        return f"{run.info.lifecycle_stage} (lifecycle_stage {run.info.lifecycle_stage})"
    if run.info.status != "FINISHED":
        return f"{run.info.status}, not FINISHED"
    return None


def model_id_of(mv) -> str | None:
    """The logged model a registered version points at (``mv.model_id`` or its source)."""
    if getattr(mv, "model_id", None):
        return mv.model_id
    match = re.match(r"^models:/(m-[0-9a-f]+)$", mv.source or "")
    return match.group(1) if match else None


def evaluation_runs(client, mv, dataset_digest: str | None = None) -> list:
    """The version's evaluation runs, newest first, optionally only on one dataset digest; in
    every state (see the module docstring): the caller checks :func:`unusable_state`."""
    clauses = ["tags.`rag_eval.evaluated` = 'true'"]
    if dataset_digest:
        clauses.append(f"tags.`rag_eval.dataset_digest` = {_literal(dataset_digest)}")
    runs = []
    model_id = model_id_of(mv)
    if model_id:
        filt = " and ".join([f"tags.`rag_eval.model_id` = {_literal(model_id)}", *clauses])
        runs = search_all_experiments(client, filt, every_state=True)
    if not runs and mv.run_id:
        run = client.get_run(mv.run_id)
        tags = run.data.tags
        if tags.get("rag_eval.evaluated") == "true" and (
            not dataset_digest or tags.get("rag_eval.dataset_digest") == dataset_digest
        ):
            runs = [run]
    return runs


def model_aliases(client, model: str) -> dict[str, str]:
    """Every alias set on ``model``, mapped to the version holding it."""
    return {str(a): str(v) for a, v in (client.get_registered_model(model).aliases or {}).items()}


def champion_version(client, model: str, alias: str):
    """The version holding ``alias``, or None when the alias is not set."""
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version_by_alias(model, alias)
    except MlflowException as exc:
        if exc.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE", "NOT_FOUND"):
            return None
        raise


def find_calibration(client, metric: str, judge_fingerprint: str, prompts_version: str) -> Any | None:
    """The latest calibration run of ``metric`` (a metric key) for this judge, or None."""
    filt = " and ".join([
        f"tags.`{CALIBRATION_TAG}` = 'true'",
        f"tags.`{CALIBRATION_TAG}.metric` = {_literal(metric)}",
        f"tags.`rag_eval.judge_fingerprint` = {_literal(judge_fingerprint)}",
        f"tags.`rag_eval.prompts_version` = {_literal(prompts_version)}",
    ])
    runs = search_all_experiments(client, filt, max_results=1)
    return runs[0] if runs else None


def calibration_records(client, metric_keys, judge_fingerprint: str, prompts_version: str) -> dict[str, str | None]:
    """Per judge-graded metric key: the run id of the judge's latest calibration on it, or None.
    Metrics that need no judge (retrieval metrics compare ids) are left out."""
    from mlflow_rag_eval.metrics import is_judge_graded

    out: dict[str, str | None] = {}
    for key in metric_keys:
        if is_judge_graded(key):
            try:
                run = find_calibration(client, key, judge_fingerprint, prompts_version)
            except UnsearchableValue:
                run = None
            out[key] = run.info.run_id if run is not None else None
    return out
