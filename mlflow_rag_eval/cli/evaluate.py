"""``mlflow-rag-eval evaluate``: rows from a file, traces from an experiment, or rows on Spark."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from mlflow_rag_eval.cli._main import UNUSABLE, _one_line, main
from mlflow_rag_eval.cli._options import (
    _column_mapping,
    _judge,
    _judge_limit_options,
    _read_rows,
    _tracking_option,
    _use_store,
)
from mlflow_rag_eval.keys import RUN_METRICS


@main.command("evaluate")
@click.option("--data", "data_path", default=None,
              help="Rows with their predictions (question, answer, contexts, and what a golden set holds): "
                   ".parquet (a file or a folder of them), .jsonl or .csv; with --spark, any Parquet path "
                   "Spark reads (s3a://..., hdfs://...).")
@click.option("--traces", "traces_experiment", default=None, metavar="EXPERIMENT",
              help="Instead of --data: score the traces an app logged to this experiment (id:ID, name:NAME, or a "
                   "bare name or id that is not both) in place, each verdict a Feedback on its trace.")
@click.option("--filter", "trace_filter", default=None,
              help="With --traces: a search_traces filter in MLflow's grammar (clauses joined by AND, no "
                   "parentheses), e.g. \"tags.env = 'prod' AND trace.status = 'OK'\".")
@click.option("--lag", default=None, metavar="DURATION",
              help="With --traces: the lag window (default 10m): the longest a request runs plus the time its "
                   "trace takes to land; --since-last reads this far behind the newest end time again.")
@click.option("--lease-wait", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
              help="With --traces: wait this long for another run scoring the same traces (default: exit 2 at "
                   "once, naming it).")
@click.option("--since", default=None,
              help="With --traces: only traces started after this (epoch ms, ISO 8601, or 90m / 24h / 7d ago).")
@click.option("--since-last", is_flag=True,
              help="With --traces: only traces after the last run's checkpoint (same filter, metrics and judge).")
@click.option("--sample", type=click.IntRange(min=1), default=None,
              help="With --traces: score at most N traces (drawn by trace id hash: a rerun draws the same).")
@click.option("--sample-fraction", type=click.FloatRange(min=0, max=1, min_open=True), default=None,
              help="With --traces: score this share of the traces (drawn by trace id hash).")
@click.option("--max-cost", type=click.FloatRange(min=0), default=None, metavar="USD",
              help="Refuse a run whose estimated LLM judge cost is above this (exit 2, before any call), and stop "
                   "one that reaches it (what was scored is logged, with the reason).")
@click.option("--metrics", default=None, help="Metric names, comma-separated (default: all the data can feed).")
@click.option("--judge", default="local:minilm-l6", show_default=True, help="Judge name.")
@click.option("--slice-by", "slice_by", multiple=True,
              help="A metadata key or column to report every metric per value of. Repeatable.")
@click.option("--run-metrics", type=click.Choice(RUN_METRICS), default="means", show_default=True,
              help="The run's MLflow metrics: each metric's mean and CI bounds (the counts, quantiles and slices "
                   "are in its statistics table and report), or every statistic of the run and of each slice, "
                   "for charting them.")
@click.option("--col", "columns", multiple=True, metavar="FIELD=COLUMN",
              help="Read a record field from another column, e.g. --col question=query. Repeatable.")
@click.option("--experiment", default=None, help="Experiment of the run (default: the active one).")
@click.option("--run-name", default=None, help="Name of the evaluation run.")
@click.option("--dataset-name", default=None,
              help="With --data: the golden set's name in the store, the run's dataset input (default: "
                   "golden-DIGEST8, the first 8 characters of the rows' digest: the name every route gives the "
                   "same rows).")
@click.option("--no-traces", is_flag=True, help="Log no per-row traces (very large runs).")
@click.option("--no-progress", is_flag=True,
              help="No progress bar on stderr (default: one when stderr is a terminal; $MLFLOW_RAG_EVAL_PROGRESS).")
@click.option("--max-error-rate", type=float, default=None,
              help="Fail (exit 2, after logging) when a metric's share of failed rows is above this.")
@click.option("--spark", "spark_master", default=None, metavar="MASTER",
              help="Score on Spark (the [spark] extra): local[*] for this machine's cores, or a cluster's "
                   "master URL (spark://host:7077, yarn, k8s://...). --data is then a Parquet file or folder.")
@click.option("--output", default=None,
              help="With --spark: where the scored rows are written as Parquet (a new folder every executor can "
                   "write; default: a temporary folder on this machine).")
@click.option("--max-table-rows", type=int, default=100_000, show_default=True,
              help="With --spark: above this many rows the run gets no per-row table or traces (the rows stay "
                   "in --output).")
@_tracking_option
@_judge_limit_options
def evaluate_command(data_path, traces_experiment, trace_filter, lag, lease_wait, since, since_last, sample,
                     sample_fraction, max_cost, metrics, judge, slice_by, run_metrics, columns, experiment, run_name,
                     dataset_name, no_traces,
                     no_progress, max_error_rate, spark_master, output, max_table_rows, tracking_uri,
                     judge_options) -> None:
    """Evaluate rows that already hold the pipeline's answers into a new MLflow evaluation run:
    the same metrics, traces, table, lineage, worst rows, report and slices as
    mlflow.evaluate(model_type="rag") logs. Prints the run id last.

    With --spark MASTER, the rows are read and scored on Spark
    (mlflow_rag_eval.spark.evaluate_spark): the same run, for 100k to millions of rows.

    With --traces EXPERIMENT instead of --data, the traces an app logged there are scored in
    place (mlflow_rag_eval.evaluate_traces): each verdict a
    Feedback on its trace, an evaluation run for the sample; prints the run id last (nothing
    when no trace was left to score).

    Before any judge call, the estimated calls, tokens and cost are printed on stderr.

    Exit code 2: unreadable data, a bad cell (named by row and column), an unknown metric or
    field, an estimate above --max-cost, or a failed-row share above --max-error-rate (the run
    keeps the evidence).
    """

    _check_evaluate_route(data_path, traces_experiment,
                          spark_master or columns or no_traces or output is not None or dataset_name is not None,
                          {"--filter": trace_filter, "--since": since, "--since-last": since_last or None,
                           "--sample": sample, "--sample-fraction": sample_fraction, "--lag": lag,
                           "--lease-wait": lease_wait}, spark_master, max_cost)
    if traces_experiment is not None:
        _evaluate_traces(traces_experiment, trace_filter, since, since_last, sample, sample_fraction, max_cost,
                         metrics, judge, slice_by, experiment, run_name, no_progress, max_error_rate, tracking_uri,
                         judge_options, lag=lag, lease_wait=lease_wait, run_metrics=run_metrics)
        return
    remote = "://" in data_path
    if not (remote and spark_master) and not Path(data_path).exists():
        raise click.BadParameter(f"{data_path!r} does not exist", param_hint="--data")
    if spark_master:
        _evaluate_on_spark(data_path, metrics, judge, slice_by, columns, experiment, run_name, dataset_name, no_traces,
                           max_error_rate, spark_master, output, max_table_rows, tracking_uri, judge_options,
                           progress=False if no_progress else None, run_metrics=run_metrics)
        return
    if output is not None:
        raise click.UsageError("--output is for --spark (the scored rows' Parquet folder)")

    from mlflow_rag_eval.evaluation.budget import Budget
    from mlflow_rag_eval.evaluation.engine import evaluate_records
    from mlflow_rag_eval.evaluation.slices import attach_columns, check_frame, check_slice_by, slice_members
    from mlflow_rag_eval.records import ColumnMapping, records_from_frame

    try:
        mapping = ColumnMapping.from_config(_column_mapping(columns))
        frame = _read_rows(data_path, mapping)
        slice_fields = check_slice_by(list(slice_by) or None, "--slice-by")
        if slice_fields:
            check_frame(frame, slice_fields, mapping.metadata)
        records = records_from_frame(frame, mapping)
        if slice_fields:
            records = attach_columns(records, frame, slice_fields)
            slice_members(records, slice_fields)
        names = [m.strip() for m in metrics.split(",") if m.strip()] if metrics else None
        budget = Budget(max_cost)  # the estimate is printed; above max_cost: BudgetExceeded, before any call
        result = evaluate_records(records, names, _judge(judge, judge_options), mapping=mapping,
                                  progress=False if no_progress else None, budget=budget)
    except ValueError as exc:
        click.echo(f"cannot evaluate: {_one_line(exc)}", err=True)
        raise SystemExit(UNUSABLE) from None
    _use_store(tracking_uri, experiment)
    _log_and_announce(result, budget, data_path, dataset_name, run_name, slice_fields, no_traces=no_traces,
                      progress=False if no_progress else None, run_metrics=run_metrics, max_error_rate=max_error_rate)


def _log_and_announce(result, budget, data_path, dataset_name, run_name, slice_fields, *, no_traces, progress,
                      run_metrics, max_error_rate) -> None:
    """Log an evaluation of rows read from ``data_path`` into a new run, print its summary and
    its run id last; exit 2 when the judge stopped or too many rows failed (the run is logged
    either way: it keeps the evidence)."""
    import mlflow

    from mlflow_rag_eval.results import ErrorRateExceeded
    from mlflow_rag_eval.tracking.run_logging import announce, log_dataset_input, log_evaluation

    with mlflow.start_run(run_name=run_name) as run:
        # The dataset first: the run's description names it.
        log_dataset_input(run.info.run_id, str(Path(data_path).resolve()), result.dataset_digest, name=dataset_name)
        log_evaluation(result, run.info.run_id, log_traces=not no_traces, slice_by=slice_fields,
                       tags=budget.run_tags(), progress=progress, run_metrics=run_metrics)
    figures = result.figures()
    if figures.stopped:  # logged with every row judged; not done, so not exit 0
        announce(figures)
        click.echo(f"evaluation stopped: run {run.info.run_id} holds the rows judged, {figures.rows_not_judged} "
                   f"rows not judged: {figures.stopped}", err=True)
        raise SystemExit(UNUSABLE)
    try:
        announce(figures, max_error_rate=max_error_rate)
    except ErrorRateExceeded as exc:
        click.echo(f"evaluation failed: {exc} (run {run.info.run_id} keeps the evidence)", err=True)
        raise SystemExit(UNUSABLE) from None
    click.echo(run.info.run_id)


def _check_evaluate_route(data_path, traces_experiment, data_options: bool, trace_options: dict, spark_master,
                          max_cost) -> None:
    """``evaluate`` reads --data or --traces, each with its own options (a usage error otherwise)."""
    if (data_path is None) == (traces_experiment is None):
        raise click.UsageError("give --data (rows with their predictions) or --traces EXPERIMENT, one of them")
    if traces_experiment is not None and data_options:
        raise click.UsageError("--spark, --col, --no-traces, --output and --dataset-name are for --data")
    given = [name for name, value in trace_options.items() if value is not None]
    if data_path is not None and given:
        raise click.UsageError(f"{', '.join(given)}: for --traces only")
    if spark_master and max_cost is not None:
        raise click.UsageError("--max-cost is not available with --spark (its workers cannot share one budget)")


def _evaluate_traces(traces_experiment, trace_filter, since, since_last, sample, sample_fraction, max_cost,
                     metrics, judge, slice_by, experiment, run_name, no_progress, max_error_rate, tracking_uri,
                     judge_options, *, lag=None, lease_wait=None, run_metrics="means") -> None:
    """``evaluate --traces EXPERIMENT``: the experiment's traces scored in place."""
    from mlflow import MlflowClient

    from mlflow_rag_eval.results import ErrorRateExceeded
    from mlflow_rag_eval.routes.production_traces import LeaseHeld, TrackingServerError, evaluate_traces

    if experiment:
        raise click.UsageError("--experiment names where --data is logged; with --traces the run goes to that "
                               "experiment")
    names = [m.strip() for m in metrics.split(",") if m.strip()] if metrics else None
    try:
        done = evaluate_traces(traces_experiment, metrics=names, judge=_judge(judge, judge_options),
                               filter_string=trace_filter, since=since, since_last=since_last, sample=sample,
                               sample_fraction=sample_fraction, max_cost=max_cost, slice_by=list(slice_by),
                               run_name=run_name, progress=False if no_progress else None,
                               lag="10m" if lag is None else lag, lease_wait=lease_wait or 0.0,
                               client=MlflowClient(tracking_uri), run_metrics=run_metrics)
    except (ValueError, LeaseHeld, TrackingServerError) as exc:  # BudgetExceeded too
        click.echo(f"cannot evaluate: {_one_line(exc)}", err=True)
        raise SystemExit(UNUSABLE) from None
    if done.result is not None and max_error_rate is not None:
        over = done.result.failed_metrics(max_error_rate)
        if over:
            exc = ErrorRateExceeded(", ".join(f"{m.name} {m.error_rate:.1%}" for m in over))
            click.echo(f"evaluation failed: more rows failed than --max-error-rate={max_error_rate:g} allows: {exc} "
                       f"(run {done.run_id} keeps the evidence)", err=True)
            raise SystemExit(UNUSABLE)
    if done.run_id:
        click.echo(done.run_id)




def _local_workers_run_this_python(local: bool, start):
    """``start()`` (a new SparkSession), its workers running this interpreter when they run on
    this machine: Spark's default, the first ``python3`` on PATH, lacks the package when the CLI
    is started as ``.venv/bin/mlflow-rag-eval`` without an activated venv. PySpark reads
    ``PYSPARK_PYTHON`` (not ``spark.pyspark.python``) once, when the context starts: set for that
    moment only, unless the user set it."""
    if not local or os.environ.get("PYSPARK_PYTHON"):
        return start()
    os.environ["PYSPARK_PYTHON"] = sys.executable
    try:
        return start()
    finally:
        os.environ.pop("PYSPARK_PYTHON", None)


def _evaluate_on_spark(data_path, metrics, judge, slice_by, columns, experiment, run_name, dataset_name, no_traces,
                       max_error_rate, master, output, max_table_rows, tracking_uri, judge_options, *,
                       progress: bool | None = None, run_metrics: str = "means") -> None:
    """``evaluate --spark MASTER``: a SparkSession on ``master``, ``evaluate_spark`` on the Parquet."""
    from mlflow_rag_eval.results import ErrorRateExceeded

    try:
        from pyspark.sql import SparkSession

        from mlflow_rag_eval.spark import evaluate_spark
    except ImportError as exc:
        click.echo(f"cannot evaluate on Spark: {_one_line(exc)}", err=True)
        raise SystemExit(UNUSABLE) from None
    _use_store(tracking_uri, experiment)
    started = SparkSession.getActiveSession() is None  # a caller's session (a notebook, a test) is left running
    from mlflow_rag_eval._util.progress import progress_wanted

    # Spark's own stage bar is the progress of a Spark run (rows are scored inside its tasks).
    builder = SparkSession.builder.master(master).appName("mlflow-rag-eval").config(
        "spark.ui.showConsoleProgress", str(progress_wanted(progress)).lower())
    spark = _local_workers_run_this_python(started and master.startswith("local"), builder.getOrCreate)
    names = [m.strip() for m in metrics.split(",") if m.strip()] if metrics else None
    try:
        path = data_path if "://" in data_path else str(Path(data_path).resolve())
        done = evaluate_spark(path, names, judge, col_mapping=_column_mapping(columns),
                              output=output, max_table_rows=max_table_rows, log_traces=not no_traces,
                              slice_by=list(slice_by) or None, max_error_rate=max_error_rate, run_name=run_name,
                              judge_options=judge_options, run_metrics=run_metrics, dataset_name=dataset_name)
    except ErrorRateExceeded as exc:
        click.echo(f"evaluation failed: {exc} (the run keeps the evidence)", err=True)
        raise SystemExit(UNUSABLE) from None
    except ValueError as exc:  # a RecordError too: nothing was logged
        click.echo(f"cannot evaluate: {_one_line(exc)}", err=True)
        raise SystemExit(UNUSABLE) from None
    finally:
        if started:
            spark.stop()
    click.echo(done.run_id)
