"""``evaluate_spark``: validate every row, score partitions on the executors, log one run.

Order of work, as on the single-process route, so that bad input never costs a judge call and
never leaves half a run:

1. the suite, on the driver, from the data's columns (:func:`~mlflow_rag_eval.evaluation.suite.prepare_suite`);
2. every row read and checked in the executors, no judge called; the first bad cell is raised
   on the driver as the :class:`~mlflow_rag_eval.records.RecordError` the single-process route
   raises, naming the global row and the column;
3. the rows scored per partition (``mapInArrow``) and written as Parquet at ``output``;
4. the figures read back (only score columns come to the driver), the run logged.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import mlflow
import pandas as pd
from mlflow import MlflowClient
from pyspark.errors import PythonException
from pyspark.sql import DataFrame

from mlflow_rag_eval.evaluation.engine import no_judge
from mlflow_rag_eval.evaluation.result import EvaluationFigures, EvaluationResult
from mlflow_rag_eval.evaluation.slices import SLICE_BY_PARAM, SLICES_FILE, check_slice_by, check_value_count
from mlflow_rag_eval.evaluation.suite import Suite, prepare_suite
from mlflow_rag_eval.judges import DEFAULT_JUDGE, Judge, JudgeUnreachable, get_judge
from mlflow_rag_eval.judges.llm.judge import LLMJudge
from mlflow_rag_eval.keys import check_run_metrics
from mlflow_rag_eval.metrics import Metric
from mlflow_rag_eval.records import ColumnMapping, RecordError, dataset_digest, records_from_frame
from mlflow_rag_eval.report import render_figures_report
from mlflow_rag_eval.spark import _collect
from mlflow_rag_eval.spark._index import ROW, read_indexed, spread
from mlflow_rag_eval.spark._worker import FACTS_SCHEMA, Plan, SumParam, output_schema, score_batches, validate_batches
from mlflow_rag_eval.stats import SEED
from mlflow_rag_eval.tracking.run_logging import (
    REPORT_FILE,
    WORST_ROWS_FILE,
    announce,
    assert_run_is_fresh,
    log_dataset_input,
    log_evaluation,
    log_run_level,
)

__all__ = [
    "ROWS_ARTIFACT_DIR", "ROWS_ARTIFACT_LIMIT", "ROWS_PATH_TAG", "SparkEvaluation", "evaluate_spark", "worker_share",
]

_logger = logging.getLogger(__name__)

#: run tag: where the scored rows were written (Parquet, one row per input row)
ROWS_PATH_TAG = "rag_eval.rows_path"
#: the scored rows' Parquet files are logged as artifacts under this folder when small enough
ROWS_ARTIFACT_DIR = "rag_eval/rows"
#: ... that is, up to this many bytes (and written on a filesystem the driver can read)
ROWS_ARTIFACT_LIMIT = 64 * 1024 * 1024
_FIELDS = ("reference", "relevant_ids", "reference_contexts", "answerable")


@dataclass(frozen=True)
class SparkEvaluation:
    """What :func:`evaluate_spark` did: the run, where the scored rows are, the figures logged."""

    run_id: str
    #: the Parquet folder of scored rows (:func:`~mlflow_rag_eval.spark._worker.output_schema`)
    output: str
    figures: EvaluationFigures
    #: the metrics logged on the run
    metrics: dict[str, float]
    #: the run got the per-row table, traces and the full report (at most ``max_table_rows`` rows)
    rows_logged: bool


def evaluate_spark(
    data: DataFrame | str | os.PathLike,
    metrics: list[str | Metric] | None = None,
    judge: str = DEFAULT_JUDGE,
    *,
    col_mapping: dict[str, str] | None = None,
    output: str | None = None,
    run_id: str | None = None,
    max_table_rows: int = 100_000,
    seed: int = SEED,
    log_traces: bool = True,
    slice_by: list[str] | None = None,
    max_error_rate: float | None = None,
    judge_options: dict[str, Any] | None = None,
    run_name: str | None = None,
    run_metrics: str = "means",
    dataset_name: str | None = None,
) -> SparkEvaluation:
    """Evaluate a Spark DataFrame (or a Parquet path) of RAG rows into one MLflow run.

    The run holds what a single-process evaluation of the same rows holds (metric keys, params,
    tags, lineage, worst rows), with the same values. Up to ``max_table_rows`` rows it also gets
    the per-row table, a trace per row and the full report, exactly as on the single-process
    route (those rows come to the driver to be logged); above, the figures come from the score
    columns only, and the rows stay in the Parquet at ``output``.

    Args:
        data: a DataFrame, whose order (as ``collect()`` gives it) numbers the rows, or a Parquet
            path, numbered as ``pandas.read_parquet`` reads it.
        metrics: metric names (default: the suite the data can feed), as for ``evaluate_records``.
        judge: a judge *name*: it is rebuilt in each Python worker, never pickled.
        col_mapping: record field -> column, e.g. ``{"question": "query"}``.
        output: where to write the scored rows (a new folder; on a cluster, a path every executor
            can write). Default: a new temporary folder on the driver, fine for ``local[*]``.
        run_id: the run to log into (default: the active run, else a new one, started once the
            rows are scored: bad data leaves no run behind).
        max_table_rows: the most rows for which the per-row artifacts and traces are logged.
        seed: the bootstrap seed of the CIs (every route uses 0 unless told otherwise).
        log_traces: with the per-row artifacts, a trace per row (as ``log_traces`` of the evaluator).
        slice_by: metadata keys or columns to report every metric per value of
            (:mod:`mlflow_rag_eval.evaluation.slices`), checked on every row before any judge call.
        max_error_rate: raise :class:`~mlflow_rag_eval.results.ErrorRateExceeded` after logging
            when a metric's share of failed rows is above it (the run keeps the evidence).
        run_name: the name of the run this call starts (when there is no active run nor ``run_id``).
        run_metrics: the run's MLflow metrics, as on every route (:data:`~mlflow_rag_eval.keys.RUN_METRICS`).
        dataset_name: the golden set's name, its dataset input (default ``golden-<digest8>``, as on every route).
        judge_options: what the judge is built with (``get_judge(judge, **judge_options)``: an LLM
            judge's ``timeout``, ``deadline``, ``rate_limit``, ``concurrency``...), in every worker;
            ``rate_limit`` and ``concurrency`` are the provider's total, shared by the workers
            scoring at once (:func:`worker_share`).

    Raises:
        RecordError: the first bad cell (global row index and column), before any judge call and
            with nothing logged.
        JudgeUnreachable: a worker could not reach the judge; nothing is logged.
        ValueError: a ``slice_by`` field no row has, or with too many values, before any judge call.
    """
    _check_judge_name(judge)
    mapping = ColumnMapping.from_config(col_mapping)
    slice_fields, run_metrics = check_slice_by(slice_by), check_run_metrics(run_metrics)  # before any scoring
    client = MlflowClient()
    run_id = _run_to_log_into(client, run_id)

    indexed, n_rows, columns = _read(data, output)
    plan, suite, available = _plan(columns, metrics, judge, mapping, slice_fields, judge_options or {})
    indexed = spread(indexed, n_rows, whole_blocks=plan.judge is not None)
    plan = _validated(indexed, plan, suite, columns, n_rows)

    output = output or os.path.join(tempfile.mkdtemp(prefix="rag_eval_spark_"), "rows")
    out, context = _score(indexed, plan, suite, available, n_rows, output)
    log = partial(_log_with_input, out, indexed, plan, n_rows, context, output, client,
                  (_dataset_source(data), dataset_name),
                  max_table_rows=max_table_rows, seed=seed, log_traces=log_traces, run_metrics=run_metrics)
    if run_id is None:
        with mlflow.start_run(run_name=run_name) as run:
            done = log(run.info.run_id)
    else:
        done = log(run_id)
    announce(done.figures, max_error_rate=max_error_rate)
    return done


def _log_with_input(out, indexed, plan, n_rows, context, output, client, source: tuple[str | None, str | None],
                    run_id: str, **options: Any) -> SparkEvaluation:
    """Log the scored rows into ``run_id`` (:func:`_log`) with the data as the run's dataset input
    (``source``: its URI, None for a DataFrame built in code, and the name the caller gave)."""
    done = _log(out, indexed, plan, n_rows, context, output, run_id, client, **options)
    uri, name = source
    log_dataset_input(run_id, uri, done.figures.dataset_digest, client, name=name)
    return done


def _check_judge_name(judge: Any) -> None:
    """Refuse a judge object: on Spark it is rebuilt from its name in each worker, never pickled."""
    if not isinstance(judge, str):
        raise TypeError(f"on Spark a judge is given by name (it is rebuilt in each worker, never pickled), "
                        f"got {type(judge).__name__}")


def _run_to_log_into(client: MlflowClient, run_id: str | None) -> str | None:
    """The run given, else the active one, checked to be fresh; None when a new run is to be started."""
    active = mlflow.active_run()
    run_id = run_id or (active.info.run_id if active else None)
    if run_id is not None:
        assert_run_is_fresh(client, run_id)
    return run_id


def _read(data: DataFrame | str | os.PathLike, output: str | None) -> tuple[DataFrame, int, list[str]]:
    """The rows numbered, their count and the data's columns; refused on a cluster without ``output``."""
    indexed, n_rows = read_indexed(data)
    if output is None and not _on_one_machine(indexed.sparkSession):
        raise ValueError(f"on a cluster (master {indexed.sparkSession.sparkContext.master!r}) give output=: a folder "
                         "every executor can write and the driver can read (s3a://..., hdfs://..., a shared mount); "
                         "the default is a temporary folder on the driver, which executors elsewhere cannot reach")
    return indexed, n_rows, [c for c in indexed.columns if c != ROW]


def _plan(columns: list[str], metrics: list[str | Metric] | None, judge: str, mapping: ColumnMapping,
          slice_fields: tuple[str, ...], judge_options: dict[str, Any]) -> tuple[Plan, Suite, set[str]]:
    """The suite and the workers' plan from the data's columns alone, on the driver; the fields available."""
    # Whole-column problems (a required column missing, a name twice) from the schema alone,
    # by the single-process code: an empty frame with the data's columns.
    records_from_frame(pd.DataFrame(columns=columns), mapping)
    available = {"answer", "contexts"} | {f for f in _FIELDS if getattr(mapping, f) in columns}
    suite = prepare_suite(metrics, get_judge(judge, **judge_options) if judge_options else judge, available, mapping)
    plan = Plan(tuple(suite.metrics), judge if suite.judge is not None else None, mapping,
                evaluation=uuid.uuid4().hex, check_applicable=suite.default, slice_by=slice_fields,
                judge_options=tuple(sorted(judge_options.items())))
    return plan, suite, available


def _validated(indexed: DataFrame, plan: Plan, suite: Suite, columns: list[str], n_rows: int) -> Plan:
    """Every row checked in the executors (no judge called); the plan the scoring workers then follow."""
    start = time.perf_counter()
    _validate(indexed, plan, suite, columns)
    _logger.info("rag eval: %d rows read and checked in %.1f s", n_rows, time.perf_counter() - start)
    workers = min(indexed.sparkSession.sparkContext.defaultParallelism, indexed.rdd.getNumPartitions())
    # The user's options, with each worker's share of the rate limit and concurrency over them.
    options = {**dict(plan.judge_options), **dict(worker_share(suite.judge, workers))}
    return replace(plan, metrics=tuple(suite.metrics), check_applicable=False,
                   judge_options=tuple(sorted(options.items())))


def _score(indexed: DataFrame, plan: Plan, suite: Suite, available: set[str], n_rows: int,
           output: str) -> tuple[DataFrame, dict]:
    """The rows scored per partition and written to ``output``; the scored rows read back, and the
    result's context (judge, timings, usage, fields, suite)."""
    spark = indexed.sparkSession
    usage, timings = spark.sparkContext.accumulator({}, SumParam()), spark.sparkContext.accumulator({}, SumParam())
    start = time.perf_counter()
    with _judge_errors():
        indexed.mapInArrow(partial(score_batches, plan, usage, timings), output_schema(plan)).write.parquet(output)
    _logger.info("rag eval: %d rows scored in %.1f s, written to %s", n_rows, time.perf_counter() - start, output)
    out = spark.read.parquet(output)
    if isinstance(suite.judge, LLMJudge):
        # The workers' judges made the calls: what their replies show (the way the schema was
        # asked, the model reported) is part of the fingerprint, as on the single-process route.
        worker_usage = usage.value
        suite.judge.usage_.count(reply_formats=worker_usage.get("reply_formats"),
                                 reported_models=worker_usage.get("reported_models"))
    judge_info = suite.judge.info() if suite.judge is not None else no_judge()
    context = dict(judge=judge_info, timings=dict(timings.value), judge_usage=_usage(usage.value),
                   fields=frozenset(available), default_suite=suite.default, left_out=dict(suite.left_out))
    return out, context


def _dataset_source(data: DataFrame | str | os.PathLike) -> str | None:
    """The run's dataset input: the Parquet path given (absolute when local), None for a DataFrame."""
    source = None if isinstance(data, DataFrame) else os.fspath(data)
    if source is not None and "://" not in source:
        source = os.path.abspath(source)
    return source


def _on_one_machine(spark) -> bool:
    """Whether the executors run on the driver's machine (``local[...]``): only then can they
    write the scored rows to a temporary folder of the driver's."""
    return spark.sparkContext.master.startswith("local")


def worker_share(judge: Judge | None, workers: int) -> tuple[tuple[str, Any], ...]:
    """The options each of ``workers`` Python workers builds an LLM judge with, so that the
    provider sees the rate limit and concurrency the user set, not ``workers`` times them: the
    rate limit divided evenly, the concurrency divided and rounded down, at least 1 per worker
    (so with more workers than the concurrency, each has one request in flight). Other judges
    (the local judge, the scripted one) call no provider: no options."""
    if workers <= 1 or not isinstance(judge, LLMJudge):
        return ()
    options: dict[str, Any] = {"concurrency": max(1, judge.concurrency // workers)}
    if judge.rate_limit:
        options["rate_limit"] = judge.rate_limit / workers
    _logger.info("rag eval: judge %s shared by %d workers: each keeps to %s", judge.name, workers, options)
    return tuple(sorted(options.items()))


def _validate(indexed: DataFrame, plan: Plan, suite: Suite, columns: list[str]) -> None:
    """Raise the error the single-process route would raise first; drop, from a default suite,
    the metrics that apply to no row (as ``Suite.drop_inapplicable``)."""
    facts = indexed.mapInArrow(partial(validate_batches, plan), FACTS_SCHEMA).collect()
    record_errors = sorted((f for f in facts if f["kind"] == "record_error"), key=lambda f: f["row"])
    if record_errors:  # every record is read before any metric checks them
        f = record_errors[0]
        raise RecordError(f["reason"], row=f["row"], column=f["column"])
    _check_slices(facts, plan.slice_by, columns)
    if suite.default:
        applies: dict[str, list] = {}
        for f in facts:
            if f["kind"] == "applies":
                applies.setdefault(f["metric"], []).append(f)
        kept = []
        for metric in suite.metrics:
            seen = sorted(applies.get(metric.display_name, []), key=lambda f: f["row"])
            if seen and not any(f["applies"] for f in seen):
                suite.left_out[metric.display_name] = f"applies to no row ({seen[0]['reason']})"
            else:
                kept.append(metric)
        suite.metrics = kept
    for metric in suite.metrics:  # in suite order, each at its first refused row
        refused = sorted((f for f in facts if f["kind"] == "metric_error" and f["metric"] == metric.display_name),
                         key=lambda f: f["row"])
        if refused:
            raise RecordError(refused[0]["reason"], row=refused[0]["row"], column=refused[0]["column"])


def _check_slices(facts: list, slice_by: tuple[str, ...], columns: list[str]) -> None:
    """The single-process route's checks of ``slice_by`` (:func:`mlflow_rag_eval.evaluation.slices.check_frame`,
    :func:`~mlflow_rag_eval.evaluation.slices.slice_members`) from the workers' facts: a field both a column
    and a metadata key, or neither, or with too many values; a value that is no label."""
    for field in slice_by:
        seen = [f for f in facts if f["metric"] == field and f["kind"] in ("slice", "slice_error")]
        errors = sorted((f for f in seen if f["kind"] == "slice_error"), key=lambda f: f["row"])
        in_metadata = any(f["applies"] for f in seen if f["kind"] == "slice")
        if field in columns and in_metadata:
            raise ValueError(f"slice_by field {field!r} is both a column and a metadata key; rename one")
        if field not in columns and not in_metadata:
            raise ValueError(f"slice_by field {field!r} is neither a column (columns: {columns}) nor a metadata "
                             "key of any row")
        if errors:
            raise RecordError(errors[0]["reason"], row=errors[0]["row"], column=errors[0]["column"])
        labels = {label for f in seen if f["kind"] == "slice" for label in json.loads(f["reason"])}
        check_value_count(field, len(labels))


@contextlib.contextmanager
def _judge_errors() -> Iterator[None]:
    """A worker that could not reach the judge fails its task; the driver raises what the
    single-process route raises, :class:`JudgeUnreachable`, rather than Spark's wrapper."""
    try:
        yield
    except PythonException as exc:
        lines = [line for line in str(exc).splitlines() if "JudgeUnreachable" in line]
        if lines:
            raise JudgeUnreachable(lines[-1].strip()) from exc
        raise


def _usage(usage: dict[str, Any]) -> dict[str, Any]:
    """Judge usage summed over the workers, rounded as a judge rounds its own."""
    out = dict(usage)
    for key, digits in (("cost_usd", 6), ("latency_s", 3)):
        if isinstance(out.get(key), float):
            out[key] = round(out[key], digits)
    return out


def _log(out: DataFrame, indexed: DataFrame, plan: Plan, n_rows: int, context: dict, output: str, run_id: str,
         client: MlflowClient, *, max_table_rows: int, seed: int, log_traces: bool,
         run_metrics: str = "means") -> SparkEvaluation:
    tags = {ROWS_PATH_TAG: output}
    if n_rows <= max_table_rows:
        figures, metrics = _log_held(out, indexed, plan, n_rows, context, run_id, client, tags=tags, seed=seed,
                                     log_traces=log_traces, run_metrics=run_metrics)
    else:
        _logger.warning("rag eval: %d rows > max_table_rows=%d: the run gets the figures, worst rows and report, "
                        "not the per-row table or traces; every row's results are in %s", n_rows, max_table_rows,
                        output)
        figures, metrics = _log_figures(out, plan, n_rows, context, run_id, client, tags=tags, seed=seed,
                                        run_metrics=run_metrics)
    _log_rows(client, run_id, output)
    return SparkEvaluation(run_id=run_id, output=output, figures=figures, metrics=metrics,
                           rows_logged=n_rows <= max_table_rows)


def _log_held(out: DataFrame, indexed: DataFrame, plan: Plan, n_rows: int, context: dict, run_id: str,
              client: MlflowClient, *, tags: dict[str, str], seed: int, log_traces: bool,
              run_metrics: str) -> tuple[EvaluationFigures, dict[str, float]]:
    """A run small enough to hold: the records and row results come to the driver and the run is
    logged by the single-process route's :func:`log_evaluation` (table, traces, report and all)."""
    records = _collect.records(indexed, plan)
    result = EvaluationResult(records=records, metrics=_collect.metric_results(out, plan.metrics, n_rows, seed=seed),
                              dataset_digest=dataset_digest(records), **context)
    metrics = log_evaluation(result, run_id, client, tags=tags, log_traces=log_traces, slice_by=plan.slice_by,
                             run_metrics=run_metrics)
    return result.figures(), metrics


def _log_figures(out: DataFrame, plan: Plan, n_rows: int, context: dict, run_id: str, client: MlflowClient, *,
                 tags: dict[str, str], seed: int, run_metrics: str) -> tuple[EvaluationFigures, dict[str, float]]:
    """A run too large to hold: figures from the score columns, the run-level contents as every
    route logs them, the worst rows capped, the report from the score columns."""
    scores, errors = _collect.score_arrays(out, plan.metrics, n_rows)
    figures = EvaluationFigures(n_rows=n_rows, metrics=_collect.metric_figures(out, plan.metrics, scores, n_rows,
                                                                                seed=seed),
                                dataset_digest=_collect.digest(out), **context)
    slices = None
    if plan.slice_by:
        slices = _collect.slice_summaries(_collect.slice_members(out, plan.slice_by, n_rows), figures.metrics,
                                          scores, errors, n_rows, seed=seed)
    metrics, lineage_doc = log_run_level(
        figures, run_id, client, tags=tags, table=False, slices=slices, run_metrics=run_metrics,
        extra_params={SLICE_BY_PARAM: json.dumps(list(plan.slice_by), ensure_ascii=False)} if slices else None)
    worst = _collect.worst_rows(out, figures.metrics, scores, n_rows)
    client.log_text(run_id, json.dumps(worst), WORST_ROWS_FILE)
    if slices:
        client.log_text(run_id, slices.to_json(), SLICES_FILE)
    client.log_text(run_id, render_figures_report(figures, scores, lineage_doc, worst=worst, slices=slices),
                    REPORT_FILE)
    return figures, metrics


def _log_rows(client: MlflowClient, run_id: str, output: str) -> None:
    """The scored rows' Parquet files as artifacts, when the driver can read them and they are small."""
    path = output.removeprefix("file:")
    if "://" in path or not os.path.isdir(path):
        _logger.info("rag eval: scored rows at %s (tag %s), not logged as artifacts", output, ROWS_PATH_TAG)
        return
    files = [os.path.join(path, f) for f in os.listdir(path) if f.endswith(".parquet")]
    size = sum(os.path.getsize(f) for f in files)
    if size > ROWS_ARTIFACT_LIMIT:
        _logger.warning("rag eval: the scored rows (%.0f MB) are not logged as artifacts (limit %.0f MB); they are "
                        "at %s (tag %s)", size / 2**20, ROWS_ARTIFACT_LIMIT / 2**20, output, ROWS_PATH_TAG)
        return
    for f in sorted(files):
        client.log_artifact(run_id, f, ROWS_ARTIFACT_DIR)
