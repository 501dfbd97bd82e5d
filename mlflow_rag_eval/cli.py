"""The ``mlflow-rag-eval`` command line.

``main`` is a plain click group so other modules can attach commands to it. Every command
imports what it needs inside its body: ``mlflow-rag-eval --help`` must not pay for importing
torch, sentence-transformers or MLflow.
"""

from __future__ import annotations

from pathlib import Path

import click

__all__ = ["main"]


@click.group()
def main() -> None:
    """Evaluate RAG pipelines inside MLflow."""


@main.group()
def cache() -> None:
    """Inspect or empty the judge-reply cache."""


_path_option = click.option(
    "--path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Cache file (default: $MLFLOW_RAG_EVAL_CACHE_DIR/judge_cache.sqlite, "
    "else the user cache dir).",
)


def _human_bytes(n: int) -> str:
    """``1536`` -> ``"1.5 KiB"``: sizes in binary units, as ``du -h`` prints them."""
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    size, i = float(n), 0
    while size >= 1024 and i < len(units) - 1:
        size, i = size / 1024, i + 1
    return f"{n} B" if i == 0 else f"{size:.1f} {units[i]}"


@cache.command("info")
@_path_option
def cache_info(path: Path | None) -> None:
    """Print where the cache is, how many replies it holds and its size on disk."""
    from mlflow_rag_eval.judges.cache import JudgeCache

    with JudgeCache(path) as judge_cache:
        stats = judge_cache.stats()
    exists = "" if judge_cache.path.exists() else " (not created yet)"
    click.echo(f"path:    {stats['path']}{exists}")
    click.echo(f"entries: {stats['entries']}")
    click.echo(f"size:    {_human_bytes(stats['bytes'])}")


@cache.command("clear")
@_path_option
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def cache_clear(path: Path | None, yes: bool) -> None:
    """Delete every cached judge reply (the next run asks the providers again)."""
    from mlflow_rag_eval.judges.cache import JudgeCache

    with JudgeCache(path) as judge_cache:
        if not yes:
            entries = judge_cache.stats()["entries"]
            click.confirm(f"Delete {entries} cached replies from {judge_cache.path}?", abort=True)
        removed = judge_cache.clear()
    click.echo(f"Removed {removed} entries from {judge_cache.path}.")


_tracking_option = click.option(
    "--tracking-uri", default=None, envvar="MLFLOW_TRACKING_URI",
    help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else MLflow's default).",
)


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

    Exit code 0: compared; 2: the runs are not comparable (dataset, judge or prompts differ).
    """
    import mlflow

    from mlflow_rag_eval.comparison import NotComparable, compare_runs

    if tracking_uri:
        mlflow.set_tracking_uri(tracking_uri)
    try:
        comparison = compare_runs(
            run_a, run_b, allow_judge_change=allow_judge_change,
            allow_dataset_change=allow_dataset_change, log_to=None if no_log else (log_to or run_b),
        )
    except NotComparable as exc:
        click.echo(f"not comparable: {exc}", err=True)
        raise SystemExit(2) from None
    click.echo(comparison.to_text())
