"""Every MLflow name or behaviour that differs across the releases this package supports
(MLflow 3.4 to the newest 3.x, ``SUPPORTED``), in one place: the rest of the package imports
those names from here, never from MLflow, so a release that lacks one cannot break an import.

A feature an older release lacks is detected by asking MLflow for it (not by comparing version
numbers); its adaptation logs what that release can hold, and says so once per process with an
:class:`MlflowReleaseWarning` naming the feature and the first release that has it.
``bench/compat.py`` runs the smoke suite on every release of the range.
"""

from __future__ import annotations

import inspect
import threading
import warnings
from typing import Any

import mlflow.utils.mlflow_tags as _tags
from mlflow.version import VERSION as MLFLOW_VERSION

__all__ = [
    "MLFLOW_VERSION",
    "MlflowReleaseWarning",
    "RUN_TYPE_GENAI_EVALUATE",
    "RUN_TYPE_TAG",
    "SUPPORTED",
    "batch_get_traces",
    "evaluation_run_tags",
    "log_spans",
    "read_run_artifact",
    "search_traces",
    "warn_missing",
]

#: the MLflow releases this package runs on, as pyproject.toml declares them
SUPPORTED = ">=3.4,<4"

#: The Evaluation runs page lists the runs tagged so (``mlflow.utils.mlflow_tags`` names them from
#: 3.11.0 on; the literal values are the same, so older clients tag runs for newer servers too).
RUN_TYPE_TAG: str = getattr(_tags, "MLFLOW_RUN_TYPE", "mlflow.runType")
RUN_TYPE_GENAI_EVALUATE: str = getattr(_tags, "MLFLOW_RUN_TYPE_GENAI_EVALUATE", "genai_evaluate")
_HAS_RUN_TYPE = hasattr(_tags, "MLFLOW_RUN_TYPE")


class MlflowReleaseWarning(UserWarning):
    """The installed MLflow lacks a feature of a newer release: the evaluation runs and logs
    what this release can hold."""


_WARNED: set[str] = set()
_WARNED_LOCK = threading.Lock()


def warn_missing(feature: str, since: str, consequence: str) -> None:
    """Warn, once per process and feature, that the installed MLflow lacks ``feature``, which
    MLflow ``since`` and later have; ``consequence`` says what the evaluation does instead."""
    with _WARNED_LOCK:
        if feature in _WARNED:
            return
        _WARNED.add(feature)
    warnings.warn(f"MLflow {MLFLOW_VERSION} has no {feature} (MLflow {since} and later): {consequence}",
                  MlflowReleaseWarning, stacklevel=3)


def evaluation_run_tags() -> dict[str, str]:
    """The tags that make a run an MLflow evaluation run (the Evaluation runs page lists it)."""
    if not _HAS_RUN_TYPE:
        warn_missing("evaluation run type tag", "3.11.0",
                     f"runs are tagged {RUN_TYPE_TAG}={RUN_TYPE_GENAI_EVALUATE} anyway; the Evaluation runs page of "
                     "a 3.11.0 or later server lists them")
    return {RUN_TYPE_TAG: RUN_TYPE_GENAI_EVALUATE}


def batch_get_traces(tracing_client: Any, trace_ids: list[str]) -> list:
    """The traces of ``trace_ids`` (at most 100), in one call where the release has one
    (``TracingClient.batch_get_traces``, 3.11.0 and later), else one ``get_trace`` each."""
    batch = getattr(tracing_client, "batch_get_traces", None)
    if batch is not None:
        return batch(trace_ids)
    return [tracing_client.get_trace(trace_id) for trace_id in trace_ids]


def search_traces(client: Any, experiment_id: str, **kwargs: Any):
    """``MlflowClient.search_traces`` in one experiment: ``locations=[...]`` from 3.5.0 on,
    ``experiment_ids=[...]`` before (3.4.0 has no ``locations``); other keywords pass on."""
    if "locations" in inspect.signature(client.search_traces).parameters:
        return client.search_traces(locations=[experiment_id], **kwargs)
    return client.search_traces(experiment_ids=[experiment_id], **kwargs)


#: what a store says when one ``log_spans`` call holds spans of several traces (SQL and REST
#: stores before 3.12.0; a server of that age refuses it too, whatever the client's release)
_ONE_TRACE_PER_CALL = "All spans must belong to the same trace"


def log_spans(tracing_client: Any, experiment_id: str, spans: list) -> None:
    """Write ``spans`` (of any number of traces) in one call where the store takes them so,
    else one call per trace. The store checks before it writes anything, so the retry writes no
    span twice."""
    from mlflow.exceptions import MlflowException

    try:
        tracing_client.log_spans(experiment_id, spans)
        return
    except MlflowException as exc:
        if _ONE_TRACE_PER_CALL not in str(exc):
            raise
    by_trace: dict[str, list] = {}
    for span in spans:
        by_trace.setdefault(span.trace_id, []).append(span)
    for trace_spans in by_trace.values():
        tracing_client.log_spans(experiment_id, trace_spans)


def read_run_artifact(client: Any, run_id: str, path: str) -> bytes:
    """The bytes of the file ``path`` among the run's artifacts, read without MLflow's
    "Downloading artifacts" progress bar: a read the package makes for itself (the gate's history
    and evidence, a comparison, a calibration's rows) is no download the user asked for, and the
    bar's switch is an environment variable, the caller's to set, not ours.

    The file is fetched through the run's artifact repository one file at a time (what
    ``client.download_artifacts`` does for a file, less the bar). Whatever that way cannot do (a
    release or repository without those methods, a file that is not there) goes to
    ``client.download_artifacts``, which raises what it always raised.
    """
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        local = Path(tmp) / Path(path).name
        try:
            repo = client._tracking_client._get_artifact_repo(run_id)
            repo._download_file(remote_file_path=path, local_path=str(local))
        except Exception:  # noqa: BLE001 - MLflow's own way says what went wrong
            local = Path(client.download_artifacts(run_id, path, tmp))
        return local.read_bytes()
