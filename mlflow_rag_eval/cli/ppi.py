"""``mlflow-rag-eval ppi``: a metric's mean as people would score it (PPI++)."""

from __future__ import annotations

import click

from mlflow_rag_eval.cli._main import main
from mlflow_rag_eval.cli._options import _tracking_option


@main.command("ppi")
@click.option("--run", "run_id", required=True, help="An evaluation run whose traces reviewers labelled.")
@click.option("--metric", default="faithfulness", show_default=True, help="Judge-graded metric.")
@click.option("--label-name", default=None, help="Name of the human feedback (default: the metric key).")
@click.option("--labels", "labels_path", default=None, type=click.Path(exists=True, dir_okay=False),
              help="Labels collected elsewhere (CSV or JSONL: label, and trace_id or question [+ answer]) "
                   "instead of the feedback on the run's traces.")
@click.option("--confidence", type=float, default=0.95, show_default=True)
@click.option("--no-log", is_flag=True, help="Print only; log nothing on the run.")
@_tracking_option
def ppi_command(run_id, metric, label_name, labels_path, confidence, no_log, tracking_uri) -> None:
    """The metric's mean as people would score it: the judge's scores on every row of the run,
    corrected with the human labels on some (PPI++), with its CI; logged on the run as
    METRIC/ppi_mean, /ppi_ci_low, /ppi_ci_high and /n_human.

    Exit code 2: no such run, not an evaluation run, or too few labelled or unlabelled rows.
    """
    import mlflow

    from mlflow_rag_eval.calibration.ppi import ppi_from_run

    if tracking_uri:
        mlflow.set_tracking_uri(tracking_uri)
    if labels_path and label_name:
        raise click.UsageError("--label-name names feedback on the run's traces; --labels reads a file instead")
    estimate = ppi_from_run(run_id, metric, label_name=label_name, labels=labels_path, confidence=confidence,
                            log=not no_log)
    interval = (f"{confidence:.0%} CI [{estimate.ci_low:.3f}, {estimate.ci_high:.3f}]" if estimate.ci_low is not None
                else f"no CI ({estimate.reason})")
    click.echo(f"{metric}: PPI++ mean {estimate.mean:.3f}, {interval} "
               f"from {estimate.n_human} human labels and {estimate.n_unlabelled} other rows "
               f"(judge weight {estimate.lam:.2f}); the judge alone says {estimate.judge_mean:.3f}, "
               f"the labels alone {estimate.human_mean:.3f}")
