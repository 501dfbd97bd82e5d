"""The ``rag`` evaluator plugin for ``mlflow.evaluate``.

Registered under the entry-point group ``mlflow.model_evaluator`` as ``rag``::

    mlflow.evaluate(model=model_uri, data=df, model_type="rag", evaluators="rag",
                    evaluator_config={"judge": "local:minilm-l6", "metrics": [...]})

``evaluator_config`` keys:
- ``judge``: a judge name (default ``local:minilm-l6``) or a Judge object;
- ``metrics``: metric names (default: the suite the data can feed, see ``DEFAULT_METRICS``);
- ``col_mapping``: record field -> column, e.g. ``{"question": "query"}``;
- ``model_input_columns``: the columns passed to the model (default: the question column);
- ``log_traces``: log one trace per row with its assessments (default true; false for runs too
  large to browse row by row: the metrics, table and report are logged either way);
- ``max_error_rate``: the evaluation fails (:class:`ErrorRateExceeded`, after logging, so the
  run keeps the evidence) when a metric's share of failed rows is above it (default: none);
- ``slice_by``: a list of fields, each a column of the data or a key of the ``metadata``
  column's dicts: the run also gets every metric's statistics per value of each field
  (:mod:`mlflow_rag_eval.evaluation.slices`). Checked on the data before the pipeline runs;
- ``run_metrics``: ``"means"`` (default: each metric's mean and CI bounds are the run's MLflow
  metrics, the other statistics and the slices' are in its statistics table) or ``"all"``
  (every statistic of the run and of each slice as an MLflow metric, for charting them);
- ``dataset_name``: the golden set's name in the store (the run's dataset input, which the
  Evaluation runs page shows; default: a dataset the caller named, else ``golden-<digest8>``,
  the same name every route gives the same rows);
- ``max_cost``: US dollars the LLM judge may cost at most (:mod:`mlflow_rag_eval.evaluation.budget`):
  the estimate (calls, tokens, cost) is printed before any judge call, a run estimated above it
  is refused then (:class:`BudgetExceeded`, nothing logged), and one that reaches it stops, the
  rows scored so far logged and the rest not applicable, the reason in the run's
  ``rag_eval.budget.stopped`` tag.

Every evaluation ends with a summary on stderr: per metric, rows scored, failed (the most
common error kinds with an example) and not applicable; a warning when any row failed.

The data is checked before the model is called, so bad input costs no prediction and leaves
no trace.

It only ever answers ``model_type="rag"``, so it never joins other evaluations.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from mlflow import MlflowClient
from mlflow.models.evaluation import EvaluationResult as MlflowEvaluationResult
from mlflow.models.evaluation import ModelEvaluator
from mlflow.models.evaluation.artifacts import JsonEvaluationArtifact

from mlflow_rag_eval._util.callers_state import callers_logging_kept
from mlflow_rag_eval._util.mlflow_compat import MLFLOW_VERSION, SUPPORTED

# The entry point must load on every MLflow release: were an import below to fail, MLflow would
# only warn (among its own start-up lines) and then say that no evaluator could evaluate the
# model. The failure is kept instead, and raised, naming its cause, when model_type="rag" asks.
try:
    from mlflow_rag_eval.evaluation.budget import Budget, check_max_cost
    from mlflow_rag_eval.evaluation.engine import evaluate_records
    from mlflow_rag_eval.evaluation.slices import attach_columns, check_frame, check_slice_by, slice_members
    from mlflow_rag_eval.evaluation.suite import prepare_suite
    from mlflow_rag_eval.keys import check_run_metrics
    from mlflow_rag_eval.records import (
        ColumnMapping,
        RecordError,
        dataset_digest,
        predictions_to_frame,
        records_from_frame,
        validate_inputs,
    )
    from mlflow_rag_eval.results import ErrorRateExceeded
    from mlflow_rag_eval.tracking.pipeline_traces import predict_with_traces
    from mlflow_rag_eval.tracking.run_logging import (
        TABLE_FILE,
        announce,
        assert_run_is_fresh,
        log_evaluation,
        log_golden_set_input,
    )
    from mlflow_rag_eval.tracking.traces import RowTraceStream
except ImportError as exc:
    _UNLOADABLE: ImportError | None = exc
else:
    _UNLOADABLE = None


__all__ = ["CONFIG_KEYS", "MODEL_TYPE", "RagEvaluator"]

MODEL_TYPE = "rag"
CONFIG_KEYS = frozenset({"judge", "metrics", "col_mapping", "model_input_columns", "log_traces", "max_error_rate",
                         "slice_by", "progress", "max_cost", "run_metrics", "dataset_name"})


def _dataset_frame(dataset) -> pd.DataFrame:
    """Rebuild the user's frame from MLflow's evaluation dataset (features + targets + preds)."""
    features = dataset.features_data
    frame = features.copy() if isinstance(features, pd.DataFrame) else pd.DataFrame(features)
    frame.columns = [str(c) for c in frame.columns]
    if getattr(dataset, "labels_data", None) is not None and dataset.targets_name:
        frame[dataset.targets_name] = list(dataset.labels_data)
    if getattr(dataset, "predictions_data", None) is not None and dataset.predictions_name:
        frame[dataset.predictions_name] = list(dataset.predictions_data)
    return frame.reset_index(drop=True)


#: above this many rows, {id: grade} dicts cost more in MLflow's schema inference than the
#: evaluation of retrieval metrics itself (mlflow.evaluate of retrieval metrics: 5.8 s at
#: 1,000 rows, 48.5 s at 3,000; 2.4 s at 3,000 as {"id", "grade"} lists; bench/scale.py)
DICT_GRADES_WARN_ROWS = 2000


def warn_about_dict_grades(frame: pd.DataFrame, column: str) -> None:
    """Warn when graded relevance comes as ``{id: grade}`` dicts in a large frame.

    ``mlflow.evaluate`` has already inferred the data's schema when an evaluator runs, and for
    dicts every distinct id becomes a field: a cost that grows with the square of the rows. The
    warning cannot save this run's time; it names the form that makes the next run linear.
    """
    if column not in frame.columns or len(frame) <= DICT_GRADES_WARN_ROWS:
        return
    if any(isinstance(v, Mapping) for v in frame[column].head(100)):
        warnings.warn(
            f"{len(frame):,} rows give {column!r} as {{id: grade}} dicts: MLflow's schema inference, which runs "
            "inside mlflow.evaluate before any evaluator, grows with the square of the rows for them (48.5 s "
            f"for 3,000 rows here, 2.4 s in a linear form). Give [{{\"id\": ..., \"grade\": ...}}] lists, or plain id lists with a "
            "'relevance_grades' column, or JSON strings: the same grades, read in linear time.",
            UserWarning, stacklevel=2)


class RagEvaluator(ModelEvaluator):
    """Evaluates a RAG pipeline (a pyfunc returning answer + contexts) or static predictions."""

    @classmethod
    def can_evaluate(cls, *, model_type, evaluator_config, **kwargs) -> bool:
        if model_type == MODEL_TYPE and _UNLOADABLE is not None:
            raise ImportError(f"the rag evaluator cannot run on MLflow {MLFLOW_VERSION} (mlflow-rag-eval supports "
                              f"mlflow{SUPPORTED}): {_UNLOADABLE}") from _UNLOADABLE
        return model_type == MODEL_TYPE

    @callers_logging_kept()
    def evaluate(
        self,
        *,
        model_type,
        dataset,
        run_id,
        evaluator_config,
        model=None,
        extra_metrics=None,
        custom_artifacts=None,
        predictions=None,
        **kwargs,
    ):
        config: Mapping[str, Any] = evaluator_config or {}
        _check_config(config, extra_metrics, custom_artifacts)
        mapping = _column_mapping(config, dataset)
        client = MlflowClient()
        assert_run_is_fresh(client, run_id)

        options = _options(config)

        frame = _dataset_frame(dataset)
        warn_about_dict_grades(frame, mapping.relevant_ids)
        if options.slice_by:  # slices are of the golden rows: fields the pipeline outputs are not among them
            check_frame(frame, options.slice_by, mapping.metadata)
        available = _available_fields(frame, mapping)
        # The configuration and the golden data are checked before the pipeline runs: an
        # unknown metric, a judge that cannot score it, or a bad cell costs no prediction
        # and leaves no trace.
        suite = prepare_suite(config.get("metrics"), config.get("judge"), available, mapping)
        pipeline_traces = None
        if model is not None:
            frame, pipeline_traces = _predict(model, frame, config, mapping, client, run_id, predictions)
        # Everything below the validation line is judged and logged; nothing above it is.
        records = records_from_frame(frame, mapping)
        if options.slice_by:
            records = attach_columns(records, frame, options.slice_by)
            slice_members(records, options.slice_by)  # a value that is no slice label costs no judge call
        budget = Budget(options.max_cost)  # refuses an estimate above max_cost before any judge call
        model_id = kwargs.get("model_id") or getattr(model, "model_id", None)
        # The rows' traces are written batch by batch while the next batches are judged.
        stream = RowTraceStream(records, suite, run_id, client, experiment_id=client.get_run(run_id).info.experiment_id,
                                fields=available, dataset_digest=dataset_digest(records), model_id=model_id,
                                existing=pipeline_traces) if options.log_traces else None
        with stream or contextlib.nullcontext():
            result = evaluate_records(records, available_fields=available, mapping=mapping, suite=suite,
                                      progress=options.progress, budget=budget, on_batch=stream)
        # The golden set under its own name and digest, the same on every route (MLflow logged a
        # bare frame as "dataset" under a digest of its own before this evaluator ran).
        log_golden_set_input(client, run_id, result.dataset_digest, options.dataset_name)
        # mlflow.evaluate logs the metrics an evaluator returns to the run (and links them to the
        # logged model) when it evaluates one: logged here too, each would have two entries.
        logged_by_mlflow = frozenset(result.run_metrics(options.run_metrics)) if kwargs.get("model_id") else frozenset()
        metrics = log_evaluation(
            result, run_id, client, model_id=model_id, log_traces=options.log_traces, pipeline_traces=pipeline_traces,
            slice_by=options.slice_by, tags=budget.run_tags(), progress=options.progress,
            run_metrics=options.run_metrics, skip_metrics=logged_by_mlflow,
            written_traces=stream.finish(result) if stream is not None else None,
        )
        # After logging: a failed evaluation keeps its evidence on the run.
        try:
            announce(result, max_error_rate=options.max_error_rate)
        except ErrorRateExceeded:
            if logged_by_mlflow:  # mlflow.evaluate logs nothing after an evaluator raised
                _log_metrics(client, run_id, {k: v for k, v in metrics.items() if k in logged_by_mlflow}, model_id)
            raise
        return MlflowEvaluationResult(metrics=metrics, artifacts=_artifacts(client, run_id), run_id=run_id)


def _check_config(config: Mapping[str, Any], extra_metrics, custom_artifacts) -> None:
    """Refuse unknown config keys, and MLflow's extra metrics and custom artifacts (not ours)."""
    unknown = set(config) - CONFIG_KEYS
    if unknown:
        raise ValueError(f"unknown evaluator_config key(s) {sorted(unknown)}; known: {sorted(CONFIG_KEYS)}")
    if extra_metrics or custom_artifacts:
        raise ValueError(
            "the rag evaluator takes metrics by name in evaluator_config['metrics']; "
            "extra_metrics and custom_artifacts belong to MLflow's default evaluator"
        )


def _column_mapping(config: Mapping[str, Any], dataset) -> ColumnMapping:
    """The config's ``col_mapping``, the answer column defaulting to MLflow's predictions column."""
    col_mapping = dict(config.get("col_mapping") or {})
    if getattr(dataset, "predictions_name", None):
        # mlflow.evaluate(..., predictions="col") names the answer column of static data.
        col_mapping.setdefault("answer", dataset.predictions_name)
    return ColumnMapping.from_config(col_mapping)


@dataclass(frozen=True)
class _Options:
    """The config's run options, checked."""

    log_traces: bool
    max_error_rate: float | None
    slice_by: tuple[str, ...]
    #: a progress bar on stderr: True, False, or None (the environment, else whether stderr is a terminal)
    progress: bool | None
    #: US dollars the judge may cost at most (None: no cap)
    max_cost: float | None = None
    #: which statistics are the run's MLflow metrics (:data:`~mlflow_rag_eval.keys.RUN_METRICS`)
    run_metrics: str = "means"
    #: the golden set's name in the store (None: the caller's named dataset, else golden-<digest8>)
    dataset_name: str | None = None


def _options(config: Mapping[str, Any]) -> _Options:
    """``log_traces``, ``max_error_rate``, ``slice_by``, ``progress``, ``max_cost`` and ``run_metrics`` from the
    config, refused when malformed."""
    log_traces = config.get("log_traces", True)
    if not isinstance(log_traces, bool):
        raise ValueError(f"evaluator_config['log_traces'] must be true or false, got {log_traces!r}")
    max_error_rate = config.get("max_error_rate")
    if max_error_rate is not None and (
        isinstance(max_error_rate, bool) or not isinstance(max_error_rate, (int, float))
        or not 0 <= max_error_rate <= 1
    ):
        raise ValueError(f"evaluator_config['max_error_rate'] must be a number in [0, 1], got {max_error_rate!r}")
    slice_by = check_slice_by(config.get("slice_by"), "evaluator_config['slice_by']")
    progress = config.get("progress")
    if progress is not None and not isinstance(progress, bool):
        raise ValueError(f"evaluator_config['progress'] must be true or false, got {progress!r}")
    max_cost = check_max_cost(config.get("max_cost"), "evaluator_config['max_cost']")
    run_metrics = check_run_metrics(config.get("run_metrics", "means"), "evaluator_config['run_metrics']")
    dataset_name = config.get("dataset_name")
    if dataset_name is not None and (not isinstance(dataset_name, str) or not dataset_name.strip()):
        raise ValueError(f"evaluator_config['dataset_name'] must be a non-empty string, got {dataset_name!r}")
    return _Options(log_traces, max_error_rate, slice_by, progress, max_cost, run_metrics, dataset_name)


def _log_metrics(client: MlflowClient, run_id: str, metrics: dict[str, float], model_id: str | None) -> None:
    """The run's metrics, linked to the evaluated logged model, as mlflow.evaluate logs them."""
    import time

    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    client.log_batch(run_id, metrics=[Metric(k, v, now, 0, model_id=model_id) for k, v in metrics.items()])


def _available_fields(frame: pd.DataFrame, mapping: ColumnMapping) -> set[str]:
    """The record fields the data can feed: answer and contexts, and the golden columns present."""
    return {"answer", "contexts"} | {
        field
        for field in ("reference", "relevant_ids", "reference_contexts", "answerable")
        if getattr(mapping, field) in frame.columns
    }


def _predict(model, frame: pd.DataFrame, config: Mapping[str, Any], mapping: ColumnMapping, client: MlflowClient,
             run_id: str, predictions) -> tuple[pd.DataFrame, Any]:
    """The frame with the model's outputs in place of any same-named columns, and the pipeline's traces."""
    validate_inputs(frame, mapping)
    inputs = frame[list(config.get("model_input_columns") or [mapping.question])]
    experiment_id = client.get_run(run_id).info.experiment_id
    output, pipeline_traces = predict_with_traces(
        model, inputs, [str(q) for q in frame[mapping.question]], experiment_id
    )
    outputs = predictions_to_frame(output, len(frame), mapping)
    _refuse_outputs_without_contexts(output, outputs, frame, mapping)
    if predictions is not None and predictions != mapping.answer and predictions in outputs:
        outputs = outputs.rename(columns={predictions: mapping.answer})
    frame = pd.concat(
        [frame.drop(columns=[c for c in outputs.columns if c in frame.columns]), outputs],
        axis=1,
    )
    return frame, pipeline_traces


def _output_shape(output: Any) -> str:
    """What a model returned, in a few words: ``a list of 3 str``, ``a DataFrame with columns ['answer']``."""
    if isinstance(output, pd.DataFrame):
        return f"a DataFrame with columns {list(map(str, output.columns))}"
    if isinstance(output, Mapping):
        return f"a dict with keys {list(map(str, output))}"
    if isinstance(output, (list, tuple, np.ndarray, pd.Series)):
        kinds = sorted({type(item).__name__ for item in output})
        return f"a {type(output).__name__} of {len(output)} {' / '.join(kinds) or 'items'}"
    return f"a {type(output).__name__}"


def _refuse_outputs_without_contexts(output: Any, outputs: pd.DataFrame, frame: pd.DataFrame,
                                     mapping: ColumnMapping) -> None:
    """A model whose output carries no contexts, where the data has none either: the model's
    output shape is the problem (plain answers), not a column to map, so say what it returned
    and the shape the evaluator reads."""
    if mapping.contexts in outputs.columns or mapping.contexts in frame.columns:
        return
    raise RecordError(
        f"the model returned {_output_shape(output)}: answers without the retrieved contexts the RAG "
        f"metrics read. Return, per input row, the answer and its contexts: a DataFrame or a list of "
        f"dicts with {mapping.answer!r} and {mapping.contexts!r} (each context a string or a dict with "
        f"'id' and 'text'), e.g. [{{{mapping.answer!r}: '...', {mapping.contexts!r}: [{{'id': 'p1', 'text': '...'}}]}}]"
        " as examples/rag_pipeline/pipeline.py does; or give the contexts as a column of the data",
        row=None,
        column=mapping.contexts,
    )


def _artifacts(client: MlflowClient, run_id: str) -> dict[str, JsonEvaluationArtifact]:
    """The run's results table, as MLflow's evaluation artifact. Only tables: MLflow's
    ``result.tables`` reads every artifact as one, and the judge lineage (a JSON document, on
    the run as ``rag_eval/judge_lineage.json``) made it warn "Not all runs have the specified
    table artifact"."""
    artifact_uri = client.get_run(run_id).info.artifact_uri
    return {"eval_results_table": JsonEvaluationArtifact(uri=f"{artifact_uri}/{TABLE_FILE}")}
