"""A generated golden set, versioned in MLflow under its digest.

:func:`log_golden_set` records the set in the experiment in one of two ways, by what the
tracking store can hold:

- a database store (sqlite, PostgreSQL, ...): an **MLflow evaluation dataset** named after the
  set, linked to the experiment (the experiment's Datasets page lists it), one record per row
  (inputs ``question``; expectations ``expected_response``, ``relevant_ids``, ``answerable``;
  tags ``question_type``, ``difficulty``, ``tags``), tagged with the digest, the generator
  and the drop counts. ``mlflow.genai.evaluate(data=dataset)`` reads it back as it is. The
  same set logged again under the same name (same digest) reuses that dataset.
- a file store (no evaluation datasets there): a **run** named ``golden set: <name>`` with the
  set as a dataset input (context ``golden_set``, MLflow's dataset digest = ours), the rows as
  ``rag_eval/golden_set.jsonl``, the drop report as ``rag_eval/golden_set_report.json``, the
  generator as params and the kept/dropped counts as metrics.

:func:`golden_dataset` is the set as the data of an evaluation, an MLflow dataset named after
the set with its digest (``mlflow.evaluate(data=golden_dataset(golden, name), ...)``): the
evaluation run's dataset input, which the Evaluation runs page shows, is then the golden set
by name and digest, not MLflow's default ``dataset``.

Not both: MLflow's Evaluation runs page lists every run of the experiment that logged no
model, so a run for the set would sit among the evaluations as one more "evaluation" with no
figures. Either way the record carries ``rag_eval.dataset_digest``, the digest every
evaluation on the set logs, which ``compare`` and the gate pair runs on.
"""

from __future__ import annotations

import json
import re
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

from mlflow import MlflowClient
from mlflow.entities import DatasetInput, InputTag, Metric, Param
from mlflow.exceptions import MlflowException
from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

from mlflow_rag_eval.golden.generate import DROP_REASONS, QUESTION_TYPES, GoldenSet

__all__ = ["GOLDEN_SET_FILE", "GOLDEN_SET_REPORT_FILE", "GOLDEN_SET_TAG", "LoggedGoldenSet", "golden_dataset",
           "log_golden_set"]

GOLDEN_SET_FILE = "rag_eval/golden_set.jsonl"
GOLDEN_SET_REPORT_FILE = "rag_eval/golden_set_report.json"
GOLDEN_SET_TAG = "rag_eval.golden_set"


@dataclass(frozen=True)
class LoggedGoldenSet:
    """Where a golden set went: an MLflow evaluation dataset (``dataset_id``), or on a store
    without them, a run (``run_id``) with the rows at ``artifact_uri``."""

    name: str
    digest: str
    experiment_id: str
    dataset_id: str | None = None
    run_id: str | None = None
    artifact_uri: str | None = None


def golden_dataset(golden, name: str | None = None, **from_pandas):
    """A golden set as an MLflow ``PandasDataset`` named ``name`` whose digest is the set's (the
    ``rag_eval.dataset_digest`` of every evaluation on it): ``mlflow.evaluate`` logs its
    ``data`` as the run's dataset input, so pass this rather than the bare frame, which MLflow
    names ``dataset`` under a digest of its own.

    ``golden``: a :class:`GoldenSet` (its rows, :meth:`GoldenSet.to_frame`), or a DataFrame of
    golden rows written by hand (``question`` and whatever it expects: ``reference``,
    ``relevant_ids``...; predictions too, which the digest leaves out). ``name`` defaults to
    ``golden-<digest8>``, the name every route gives the same rows; ``from_pandas`` goes to
    ``mlflow.data.from_pandas`` (``predictions="answer"`` for static predictions)."""
    import mlflow.data
    import pandas as pd

    from mlflow_rag_eval.records import dataset_digest, golden_set_name, records_from_frame

    if isinstance(golden, pd.DataFrame):
        frame = golden
        read = frame if "contexts" in frame.columns else frame.assign(contexts=[[] for _ in range(len(frame))])
        digest = dataset_digest(records_from_frame(read, require_answer=False))
    else:
        frame, digest = golden.to_frame(), golden.digest
    return mlflow.data.from_pandas(frame, name=golden_set_name(digest, name), digest=digest, **from_pandas)


def _experiment_id(experiment_id: str | None) -> str:
    if experiment_id is not None:
        return str(experiment_id)
    from mlflow.tracking.fluent import _get_experiment_id

    return _get_experiment_id() or "0"


def log_golden_set(golden: GoldenSet, name: str = "golden-set", *, experiment_id: str | None = None,
                   client: MlflowClient | None = None) -> LoggedGoldenSet:
    """Log ``golden`` in the experiment (default: the active one); see the module docstring."""
    client = client or MlflowClient()
    experiment_id = _experiment_id(experiment_id)
    dataset_id = _evaluation_dataset(golden, name, experiment_id)
    if dataset_id is not None:
        return LoggedGoldenSet(name, golden.digest, experiment_id, dataset_id=dataset_id)
    return _golden_set_run(golden, name, experiment_id, client)


def _summary_tags(golden: GoldenSet) -> dict[str, str]:
    report = golden.report
    return {
        "rag_eval.dataset_digest": golden.digest,
        "rag_eval.golden_set_rows": str(len(golden.rows)),
        "rag_eval.generator": json.dumps(golden.generator, sort_keys=True),
        "rag_eval.kept": json.dumps(report.kept),
        "rag_eval.dropped": json.dumps(report.drop_counts(), sort_keys=True),
        "rag_eval.unused": json.dumps(report.unused),
    }


def _golden_set_run(golden: GoldenSet, name: str, experiment_id: str, client: MlflowClient) -> LoggedGoldenSet:
    import mlflow.data

    digest, report = golden.digest, golden.report
    run = client.create_run(experiment_id, run_name=f"golden set: {name}", tags={
        GOLDEN_SET_TAG: name,
        **_summary_tags(golden),
        "mlflow.note.content": f"Golden set {name!r}, digest {digest}, {len(golden.rows)} rows.\n\n"
                               f"```\n{report.to_text()}\n```",
    })
    run_id = run.info.run_id
    try:
        with tempfile.TemporaryDirectory() as tmp:
            rows_path = golden.to_jsonl(Path(tmp) / Path(GOLDEN_SET_FILE).name)
            report_path = Path(tmp) / Path(GOLDEN_SET_REPORT_FILE).name
            report_path.write_text(json.dumps({"name": name, "digest": digest, "generator": golden.generator,
                                               **report.as_dict()}, indent=2, ensure_ascii=False))
            client.log_artifact(run_id, str(rows_path), "rag_eval")
            client.log_artifact(run_id, str(report_path), "rag_eval")
        artifact_uri = f"{run.info.artifact_uri.rstrip('/')}/{GOLDEN_SET_FILE}"
        with warnings.catch_warnings():  # MLflow warns that two source types claim an artifact URI
            warnings.simplefilter("ignore", UserWarning)
            dataset = mlflow.data.from_pandas(golden.to_frame(), source=artifact_uri, name=name, digest=digest)
        client.log_inputs(run_id, datasets=[DatasetInput(
            dataset._to_mlflow_entity(), tags=[InputTag(MLFLOW_DATASET_CONTEXT, "golden_set")])])
        counts = report.drop_counts()
        metrics = [("golden_set/n_rows", len(golden.rows))]
        metrics += [(f"golden_set/kept/{k}", report.kept[k]) for k in QUESTION_TYPES]
        metrics += [(f"golden_set/dropped/{r}", sum(counts.get(r, {}).values())) for r in DROP_REASONS]
        client.log_batch(
            run_id,
            metrics=[Metric(k, float(v), 0, 0) for k, v in metrics],
            params=[Param(f"golden.{k}", json.dumps(v) if isinstance(v, (list, dict)) else str(v))
                    for k, v in golden.generator.items()],
        )
    except BaseException:
        client.set_terminated(run_id, "FAILED")
        raise
    client.set_terminated(run_id, "FINISHED")
    return LoggedGoldenSet(name, digest, experiment_id, run_id=run_id, artifact_uri=artifact_uri)


def _evaluation_dataset(golden: GoldenSet, name: str, experiment_id: str) -> str | None:
    """An MLflow evaluation dataset with the rows, or None where the store has no such thing."""
    from mlflow.genai.datasets import create_dataset

    try:
        existing = _existing_dataset(name, experiment_id, golden.digest)
        if existing is not None:  # the same set logged before (a second `make demo`): one dataset
            return existing
        dataset = create_dataset(name=name, experiment_id=[experiment_id], tags=_summary_tags(golden))
    except (MlflowException, NotImplementedError) as exc:
        # A file store (here, or behind a tracking server) has no evaluation datasets; anything
        # else is a real error and is raised.
        if isinstance(exc, NotImplementedError) or re.search(r"file ?store|filesystem", str(exc), re.I):
            return None
        raise
    dataset.merge_records([
        {"inputs": {"question": r.question},
         "expectations": {"expected_response": r.reference, "relevant_ids": r.relevant_ids, "answerable": r.answerable},
         "tags": {"question_type": r.metadata.question_type, "difficulty": r.metadata.difficulty,
                  "tags": ",".join(r.metadata.tags)}}
        for r in golden.rows
    ])
    return dataset.dataset_id


def _existing_dataset(name: str, experiment_id: str, digest: str) -> str | None:
    """The id of the experiment's evaluation dataset named ``name`` that holds the set of this
    digest already, if any: logging the same set twice reuses it rather than making a second
    dataset of the same name."""
    from mlflow.genai.datasets import search_datasets

    quoted = name.replace("'", "\\'")
    for dataset in search_datasets(experiment_ids=[experiment_id], filter_string=f"name = '{quoted}'"):
        if dataset.name == name and (dataset.tags or {}).get("rag_eval.dataset_digest") == digest:
            return dataset.dataset_id
    return None
