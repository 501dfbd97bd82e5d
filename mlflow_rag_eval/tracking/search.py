"""Finding what the gate judges: a model version's evaluation runs, the champion, calibrations.

Calibrations are found by MLflow search on tags across every active experiment; a version's
evaluations only where the registry points:

- a version's evaluations are its own (:func:`evaluation_runs`): ``mv.run_id`` when it is an
  evaluation, and the runs of the version's logged model (``mv.model_id`` or its
  ``models:/<id>`` source) in that model's experiment which name it as their model input;
- calibrations: ``tags.`rag_eval.calibration` = 'true'`` with the metric, the judge
  fingerprint and the prompts version as tags.

Which runs evaluated a version is decided only from what MLflow lets no one change: a run's
params (an evaluation logs ``rag_eval.metrics`` and ``rag_eval.dataset_digest`` as params,
:func:`is_evaluation_run`), its inputs (the logged model it evaluated) and the version's
``run_id``. Tags (``rag_eval.evaluated``, ``rag_eval.model_id``) are for people to read: any
writer of the experiment can delete or rewrite them, which used to choose the evidence.

Newest first (``attributes.start_time DESC``). Calibrations leave failed and killed runs out.
A version's evaluations are every run that evaluated the version, whatever its state
(deleted, in a deleted experiment, failed, killed, still running): the gate judges the newest
and refuses it when it is no finished, live run (:func:`unusable_state`), rather than quietly
judging an older one. Otherwise deleting or failing the newest evaluation would choose which
evidence the gate sees.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = [
    "CALIBRATION_TAG", "GATED_ALIAS_TAG", "UnsearchableValue", "gated_alias_holder", "calibration_records", "champion_version", "evaluation_runs",
    "find_calibration", "is_evaluation_run",
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


def _on_digest(run, dataset_digest: str | None) -> bool:
    """Whether ``run`` evaluated the dataset ``dataset_digest`` (None: any), by its param, which
    cannot change once logged (a tag can)."""
    return not dataset_digest or run.data.params.get("rag_eval.dataset_digest") == dataset_digest


#: the params every evaluation logs (:mod:`mlflow_rag_eval.tracking.run_logging`), on every route
EVALUATION_PARAMS = ("rag_eval.metrics", "rag_eval.dataset_digest")


def is_evaluation_run(run) -> bool:
    """Whether ``run`` holds a rag evaluation, by its params (immutable once logged), never by
    its ``rag_eval.evaluated`` tag, which anyone who can write to the run can delete."""
    return all(run.data.params.get(name) for name in EVALUATION_PARAMS)


def evaluation_runs(client, mv, dataset_digest: str | None = None) -> list:
    """The version's own evaluation runs, newest first, optionally only on one dataset digest
    (by param); in every state (see the module docstring): the caller checks :func:`unusable_state`.

    A version's own runs are named by the registry and by what no one can edit, never chosen by
    a search across experiments or by tags:

    1. ``mv.run_id``, when that run is an evaluation (a version registered from its evaluation run);
    2. the logged model's evaluations: its ``source_run_id`` when that run is an evaluation, and
       the evaluation runs (by params) *in the logged model's experiment* whose run inputs name
       the model (the evaluator logs ``LoggedModelInput``; inputs cannot be removed). A run
       elsewhere is not the version's, however it is tagged; a run of the experiment whose
       ``rag_eval.model_id`` tag was deleted or rewritten still is.
    """
    runs: dict[str, Any] = {}
    if mv.run_id:
        run = client.get_run(mv.run_id)
        if is_evaluation_run(run):
            runs[run.info.run_id] = run
    model_id = model_id_of(mv)
    if model_id:
        model = client.get_logged_model(model_id)
        source = getattr(model, "source_run_id", None)
        if source and source not in runs:
            run = client.get_run(source)
            if is_evaluation_run(run):
                runs[source] = run
        for run in _model_input_runs(client, model.experiment_id, model_id, dataset_digest):
            runs.setdefault(run.info.run_id, run)
    found = [r for r in runs.values() if _on_digest(r, dataset_digest)]
    return sorted(found, key=lambda r: r.info.start_time or 0, reverse=True)


def _model_input_runs(client, experiment_id: str, model_id: str, dataset_digest: str | None) -> list:
    """The evaluation runs (by params) of ``experiment_id``, in every state, whose inputs name
    the logged model ``model_id``."""
    from mlflow.entities import ViewType

    wanted = (f"params.`rag_eval.dataset_digest` = {_literal(dataset_digest)}" if dataset_digest
              else "params.`rag_eval.metrics` LIKE '%'")
    runs, token = [], None
    while True:
        page = client.search_runs([experiment_id], wanted, run_view_type=ViewType.ALL, max_results=500,
                                  order_by=["attributes.start_time DESC"], page_token=token)
        for hit in page:
            if not is_evaluation_run(hit):
                continue
            run = client.get_run(hit.info.run_id)  # search results leave the run's model inputs out
            if any(i.model_id == model_id for i in getattr(run.inputs, "model_inputs", None) or []):
                runs.append(run)
        token = page.token
        if not token:
            return runs


def model_aliases(client, model: str) -> dict[str, str]:
    """Every alias set on ``model``, mapped to the version holding it."""
    return {str(a): str(v) for a, v in (client.get_registered_model(model).aliases or {}).items()}


#: registered model tag ``rag_eval.gate.alias.<alias>``: the version the gate last gave ``<alias>``
GATED_ALIAS_TAG = "rag_eval.gate.alias"


def gated_alias_holder(client, model: str, alias: str) -> str | None:
    """The version the gate last moved ``alias`` to (its registered model tag), or None."""
    return (client.get_registered_model(model).tags or {}).get(f"{GATED_ALIAS_TAG}.{alias}")


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
