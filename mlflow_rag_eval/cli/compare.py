"""``mlflow-rag-eval compare``: two evaluation runs side by side."""

from __future__ import annotations

import click

from mlflow_rag_eval.cli._main import UNUSABLE, _one_line, main
from mlflow_rag_eval.cli._options import _tracking_option


@main.command("compare")
@click.argument("run_a")
@click.argument("run_b")
@click.option("--allow-judge-change", is_flag=True, help="Compare even if the judge or its prompts differ.")
@click.option("--allow-dataset-change", is_flag=True, help="Compare even if the dataset digest differs.")
@click.option("--log-to", default=None, help="Run that gets the HTML/JSON comparison (default: RUN_B).")
@click.option("--no-log", is_flag=True, help="Print only; log no artifact.")
@_tracking_option
def compare(run_a, run_b, allow_judge_change, allow_dataset_change, log_to, no_log, tracking_uri) -> None:
    """Per-metric deltas of RUN_B against RUN_A, paired over their shared rows.

    Exit code 0: compared; 2: the runs are not comparable (dataset, judge or prompts differ),
    or a run cannot be read (unknown id, no rag evaluation).
    """
    import mlflow

    from mlflow_rag_eval.compare import NotComparable, compare_runs

    if tracking_uri:
        mlflow.set_tracking_uri(tracking_uri)
    try:
        comparison = compare_runs(
            run_a, run_b, allow_judge_change=allow_judge_change,
            allow_dataset_change=allow_dataset_change, log_to=None if no_log else (log_to or run_b),
        )
    except NotComparable as exc:
        click.echo(f"not comparable: {_one_line(exc)}", err=True)
        raise SystemExit(UNUSABLE) from None
    click.echo(comparison.to_text())
