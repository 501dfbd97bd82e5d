"""What the gate believes of an evaluation run, and why: its artifacts checked against the seal.

An evaluation run holds artifacts (rows table, slices, lineage) and metrics that anyone who can
write to the run may replace; its params cannot change once logged. At evaluation time the run
seals its artifacts in params (:mod:`mlflow_rag_eval.tracking.seal`). Before deciding, the gate:

1. checks the rows table, the slice table and the lineage it read against the sealed sha256
   digests: a table copied from another run, slices or a lineage edited afterwards are refused;
2. checks the table's trace ids against the run's own traces: each row of an evaluation is a
   trace of its run, so a table made of another run's rows (a trace id that exists under another
   run) is refused even where no seal exists. A trace id that exists nowhere was deleted (a
   retention job: MLflow's ``delete_traces``): counted and shown in the notes, and passing when
   the table's seal holds; ``require_traces: true`` refuses it, and so does an unsealed run;
3. takes each metric's direction from the metric registry (built-in metrics), else from the
   seal; a lineage (or a seal) that disagrees with the registry is refused: a direction decides
   which way a delta counts.

A run logged before the seal existed (no ``rag_eval.seal.*`` params) gets checks 2 and 3 and a
one-line notice that its artifacts are not sealed; a policy with ``require_seal: true`` refuses it.
The figures are then recomputed from the table (:func:`~mlflow_rag_eval.gate.checks.verified_figures`).
"""

from __future__ import annotations

import dataclasses
import json

from mlflow_rag_eval.gate.checks import AlteredRun
from mlflow_rag_eval.keys import display_name
from mlflow_rag_eval.tracking import seal

__all__ = ["registry_direction", "run_trace_ids", "verify_evidence"]


def registry_direction(key: str) -> bool | None:
    """Whether a metric is greater-is-better by the metric registry (None: a metric the
    registry does not know, such as a rubric or an adapter's)."""
    from mlflow_rag_eval.metrics import registered_metrics, resolve_metric

    name = display_name(key)
    if name.split("@")[0] not in registered_metrics():
        return None
    try:
        return bool(resolve_metric(name).greater_is_better)
    except (ValueError, TypeError):
        return None


def run_trace_ids(client, run) -> set[str]:
    """The ids of the traces of ``run`` (linked to it, or logged under it)."""
    from mlflow_rag_eval._util.mlflow_compat import search_traces

    ids, token = set(), None
    while True:
        page = search_traces(client, run.info.experiment_id, run_id=run.info.run_id,
                             include_spans=False, max_results=500, page_token=token)
        ids.update(t.info.trace_id for t in page)
        token = page.token
        if not token:
            return ids


def _artifact(client, run_id: str, path: str) -> bytes:
    """The bytes of one artifact of the run."""
    from mlflow_rag_eval._util.mlflow_compat import read_run_artifact  # imports MLflow
    return read_run_artifact(client, run_id, path)


def _short(digest: str | None) -> str:
    return "none" if digest is None else digest[:12]


def _check_digest(run_id: str, what: str, actual: str | None, sealed: str) -> None:
    expected = None if sealed == seal.NOT_SLICED else sealed
    if actual != expected:
        raise AlteredRun(f"run {run_id}: its {what} is not the one sealed when it was evaluated (sha256 "
                         f"{_short(actual)} vs sealed {_short(expected)}, param): it was replaced or edited "
                         "afterwards; evaluate the version again")


def _trace_exists(client, trace_id: str) -> bool:
    """Whether a trace of that id exists anywhere in the store (False: deleted)."""
    from mlflow.exceptions import MlflowException

    try:
        client.get_trace(trace_id, display=False)
    except MlflowException as exc:
        if exc.error_code in ("RESOURCE_DOES_NOT_EXIST", "NOT_FOUND"):
            return False
        raise
    return True


def _check_trace_ids(client, run, evaluation, *, sealed: bool, require_traces: bool) -> list[str]:
    """Refuse a table whose trace ids are another run's; count those that exist nowhere.

    Each row of an evaluation is a trace of its run. A trace id the run does not have is either
    a trace of another run (the table holds another run's rows: refused), or a trace that no
    longer exists (a retention job, MLflow's ``delete_traces``): those are counted and shown,
    and pass when the table's seal binds it (``require_traces`` refuses them; an unsealed run,
    which its traces alone bind, is refused too). Returns the notes."""
    table = evaluation.table
    if "trace_id" not in table:
        return []
    listed = [str(t) for t in table["trace_id"] if isinstance(t, str) and t]
    if not listed:
        return []  # logged without traces (log_traces=False): the seal alone binds the table
    own = run_trace_ids(client, run)
    missing = [t for t in listed if t not in own]
    if not missing:
        return []
    run_id = run.info.run_id
    for trace_id in missing:
        if _trace_exists(client, trace_id):
            raise AlteredRun(f"run {run_id}: {len(missing)} of the {len(listed)} trace ids of its rows table are not "
                             f"traces of the run, and {trace_id} is a trace of another run: the table holds another "
                             "run's rows")
    deleted = f"{len(missing)} of the {len(listed)} trace ids of its rows table (first: {missing[0]}) are deleted " \
              "(retention: they exist nowhere in the store)"
    if require_traces:
        raise AlteredRun(f"run {run_id}: {deleted}, and the policy says require_traces: true; evaluate the version "
                         "again")
    if not sealed:
        raise AlteredRun(f"run {run_id}: {deleted}, and the run has no seal to bind its table instead (it was "
                         "logged before evaluations were sealed); evaluate the version again")
    return [f"run {run_id}: {deleted}; its table is bound by its seal (require_traces: true refuses it)"]


def _directions(run_id: str, lineage: dict[str, bool], sealed: dict[str, bool] | None) -> dict[str, bool]:
    """Each metric's direction: the registry's, else the seal's, else (an unsealed run) the
    lineage's; refuses a lineage or seal that disagrees with the registry, or a lineage that
    disagrees with the seal."""
    word = {True: "higher-is-better", False: "lower-is-better"}
    out: dict[str, bool] = {}
    for key in sorted({*lineage, *(sealed or {})}):
        known = registry_direction(key)
        claims = [("lineage", lineage.get(key)), ("seal", (sealed or {}).get(key))]
        truth, source = (known, "the metric registry") if known is not None else (
            ((sealed or {}).get(key), "the seal") if sealed and key in sealed else (lineage.get(key), "the lineage"))
        for where, claimed in claims:
            if claimed is not None and claimed != truth:
                raise AlteredRun(f"run {run_id}: its {where} marks {key} {word[claimed]}, but {source} says "
                                 f"{word[truth]}: a direction decides which way a delta counts; the run was "
                                 "altered after it was evaluated")
        out[key] = truth
    return out


def verify_evidence(client, run, evaluation, *, require_seal: bool = False, require_traces: bool = False):
    """``evaluation`` (:func:`~mlflow_rag_eval.compare.load_evaluation` of ``run``) checked as
    the module docstring says, with its directions replaced by the verified ones; and the notes
    for the decision (the one-line notice of an unsealed run).

    Raises:
        AlteredRun: an artifact that is not the sealed one, rows of another run, a direction
            that disagrees with the registry, (``require_seal``) a run without a seal, or
            (``require_traces``, or an unsealed run) trace ids that no longer exist.
    """
    from mlflow_rag_eval.tracking.run_logging import LINEAGE_FILE, SLICES_FILE  # imports MLflow

    params, run_id, notes = run.data.params, run.info.run_id, []
    sealed_directions = None
    if seal.ROWS in params:
        _check_digest(run_id, "rows table (eval_results_table.json)", evaluation.table_sha256, params[seal.ROWS])
        sealed_slices = params.get(seal.SLICES, seal.NOT_SLICED)
        raw_slices = None
        if sealed_slices != seal.NOT_SLICED or evaluation.slices is not None:
            raw_slices = _artifact(client, run_id, SLICES_FILE)
        _check_digest(run_id, f"slice table ({SLICES_FILE})", raw_slices and seal.sha256(raw_slices), sealed_slices)
        if raw_slices is not None and json.loads(raw_slices) != evaluation.slices:
            raise AlteredRun(f"run {run_id}: its {SLICES_FILE} changed while the gate read it")
        _check_digest(run_id, f"lineage ({LINEAGE_FILE})", evaluation.lineage_sha256, params.get(seal.LINEAGE, ""))
        try:
            sealed_directions = seal.read_directions(params.get(seal.DIRECTIONS, ""))
        except ValueError as exc:
            raise AlteredRun(f"run {run_id}: param {seal.DIRECTIONS} is unreadable ({exc})") from None
    elif require_seal:
        raise AlteredRun(f"run {run_id} was logged before evaluations were sealed (no {seal.ROWS} param), and the "
                         "policy says require_seal: true; evaluate the version again")
    else:
        notes.append(f"run {run_id} was logged before evaluations were sealed: its table, slices and lineage are "
                     "checked against its traces, metrics and the metric registry only (require_seal: true refuses it)")
    notes += _check_trace_ids(client, run, evaluation, sealed=seal.ROWS in params, require_traces=require_traces)
    directions = _directions(run_id, dict(evaluation.greater_is_better), sealed_directions)
    return dataclasses.replace(evaluation, greater_is_better=directions), notes


#: every figure ``mlflow-rag-eval ppi`` logs per metric, besides :data:`~mlflow_rag_eval.keys.PPI_STATS`
_PPI_EXTRA = ("ppi_se", "ppi_unclipped_mean", "n_human", "ppi_lambda", "ppi_confidence")


def recompute_ppi(client, evaluation, metrics, confidence: float):
    """``evaluation`` with the PPI figures of ``metrics`` (keys) recomputed from the HUMAN
    feedback on the run's traces (:func:`~mlflow_rag_eval.calibration.ppi.ppi_from_run`, at
    ``confidence``), the logged ones dropped: a hand-logged ``<metric>/ppi_ci_low`` is not an
    estimate. Where the labels give none, the figures stay missing, and a note says why."""
    from mlflow_rag_eval.calibration.ppi import ppi_from_run
    from mlflow_rag_eval.keys import PPI_STATS

    figures, notes = dict(evaluation.metrics), []
    for metric in metrics:
        for stat in (*PPI_STATS, *_PPI_EXTRA):
            figures.pop(f"{metric}/{stat}", None)
        try:
            estimate = ppi_from_run(evaluation.run_id, metric, confidence=confidence, log=False, client=client)
        except ValueError as exc:
            notes.append(f"no PPI estimate of {metric} on run {evaluation.run_id}, recomputed from the human labels "
                         f"on its traces: {exc}")
            continue
        if estimate.reason:
            notes.append(f"the PPI estimate of {metric} on run {evaluation.run_id}, recomputed from the human labels "
                         f"on its traces, has no interval: {estimate.reason}")
        figures.update(estimate.as_metrics(metric))
        figures[f"{metric}/ppi_confidence"] = confidence
    return dataclasses.replace(evaluation, metrics=figures), notes
