"""``mlflow-rag-eval calibrate``: a judge's scores against human labels."""

from __future__ import annotations

import click

from mlflow_rag_eval.cli._main import UNUSABLE, _one_line, main
from mlflow_rag_eval.cli._options import _judge, _judge_limit_options, _tracking_option


@main.command("calibrate")
@click.option("--labels", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Human labels: CSV or JSONL with answer, contexts (or context), label; question optional.")
@click.option("--run", "run_id", default=None,
              help="An evaluation run whose traces reviewers labelled (in the MLflow UI, or with "
                   "mlflow.log_feedback, source HUMAN): its judge is calibrated on those labels.")
@click.option("--metric", default="faithfulness", show_default=True, help="Judge-graded metric to calibrate.")
@click.option("--label-name", default=None,
              help="With --run: the name of the human feedback (default: the metric key).")
@click.option("--judge", default="local:minilm-l6", show_default=True, help="Judge name (with --labels).")
@click.option("--threshold", type=float, default=None, help="Score counted as 'yes' at or above (default 0.5).")
@click.option("--label-threshold", type=float, default=0.5, show_default=True, help="Label counted as 'yes' at or above.")
@click.option("--limit", type=int, default=None, help="With --labels: judge a seeded random sample of N rows.")
@click.option("--n-boot", type=int, default=1000, show_default=True, help="Bootstrap resamples for the CIs.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--experiment", default="rag_eval-calibration", show_default=True, help="Experiment of the calibration run.")
@click.option("--no-log", is_flag=True, help="Print only; log no calibration run.")
@_tracking_option
@_judge_limit_options
def calibrate_command(labels, run_id, metric, label_name, judge, threshold, label_threshold, limit, n_boot, seed,
                      experiment, no_log, tracking_uri, judge_options) -> None:
    """Measure how a judge-graded metric agrees with human labels (rho, tau, kappa, accuracy,
    AUROC, each with a bootstrap 95% CI) and log it for the gate.

    The labels come from a file (--labels; the judge scores its rows) or from an evaluation
    run's traces (--run; the run's own scores, no judge call). Exit code 2: unusable input.
    """
    import mlflow
    from mlflow.exceptions import MlflowException

    from mlflow_rag_eval.gate import calibrate, calibrate_from_run

    if (labels is None) == (run_id is None):
        click.echo("cannot calibrate: give exactly one of --labels and --run", err=True)
        raise SystemExit(UNUSABLE)
    if tracking_uri:
        mlflow.set_tracking_uri(tracking_uri)
    try:
        if run_id is not None:
            result = calibrate_from_run(run_id, metric, label_name=label_name, threshold=threshold,
                                        label_threshold=label_threshold, n_boot=n_boot, seed=seed,
                                        log=not no_log, experiment=experiment)
        else:
            result = calibrate(labels, metric, _judge(judge, judge_options), threshold=threshold, label_threshold=label_threshold,
                               limit=limit, n_boot=n_boot, seed=seed, log=not no_log, experiment=experiment)
    except (ValueError, MlflowException) as exc:
        click.echo(f"cannot calibrate: {_one_line(exc)}", err=True)
        raise SystemExit(UNUSABLE) from None
    click.echo(result.to_text())
