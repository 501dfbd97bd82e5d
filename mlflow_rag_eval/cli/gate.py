"""``mlflow-rag-eval gate``: whether a candidate model version may replace the champion."""

from __future__ import annotations

import click

from mlflow_rag_eval.cli._main import UNUSABLE, main
from mlflow_rag_eval.cli._options import _tracking_option


@main.command("gate")
@click.option("--model", required=True, help="Registered model name.")
@click.option("--candidate", required=True, help="Candidate model version.")
@click.option("--champion-alias", default="champion", show_default=True, help="Alias the candidate competes for.")
@click.option("--policy", "policy_path", required=True, type=click.Path(exists=True, dir_okay=False),
              help="Gate policy YAML.")
@click.option("--allow-judge-change", is_flag=True,
              help="Gate even if the judge or its prompts differ from the champion's evaluation.")
@click.option("--first-version", is_flag=True,
              help="No version has held the champion alias yet, though the model has other aliases: "
                   "judge the candidate on the policy alone (without a champion).")
@click.option("--dry-run", is_flag=True, help="Decide and print; record nothing, move no alias.")
@click.option("--json", "as_json", is_flag=True, help="Print the decision as JSON.")
@_tracking_option
def gate_command(model, candidate, champion_alias, policy_path, allow_judge_change, first_version, dry_run,
                 as_json, tracking_uri) -> None:
    """Promote CANDIDATE to the champion alias if it meets the policy.

    Exit code 0: passed (alias moved); 1: refused (alias unchanged); 2: unusable input (bad or
    empty policy, missing version or evaluation, unknown alias, dataset digest mismatch):
    one line on stderr naming the problem (with --json, the decision on stdout).
    """
    import json

    import mlflow

    from mlflow_rag_eval.gate import gate

    if tracking_uri:
        mlflow.set_tracking_uri(tracking_uri)
    decision = gate(model, candidate, policy_path, champion_alias=champion_alias,
                    allow_judge_change=allow_judge_change, first_version=first_version, record=not dry_run)
    if as_json:
        click.echo(json.dumps(decision.as_dict(), indent=2, default=str))
    elif decision.exit_code == UNUSABLE:
        reasons = "; ".join(" ".join(r.split()) for r in decision.reasons) or "unusable input"
        click.echo(f"gate: {decision.model} v{decision.candidate_version}: unusable input: {reasons}", err=True)
    else:
        click.echo(decision.to_text())
    raise SystemExit(decision.exit_code)
