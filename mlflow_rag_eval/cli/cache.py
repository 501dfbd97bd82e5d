"""``mlflow-rag-eval cache info|clear``: the judge-reply cache."""

from __future__ import annotations

from pathlib import Path

import click

from mlflow_rag_eval.cli._main import main


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
    """Print where the cache is, how many replies it holds and its size on disk.

    Read-only: the file is opened with sqlite's mode=ro. Exit code 2: the file is not a judge
    cache (it is left as it is).
    """
    from mlflow_rag_eval.judges.cache import JudgeCache

    with JudgeCache(path) as judge_cache:
        stats = judge_cache.stats()  # NotAJudgeCache: a ValueError, exit 2
    exists = "" if judge_cache.path.exists() else " (not created yet)"
    click.echo(f"path:    {stats['path']}{exists}")
    click.echo(f"entries: {stats['entries']}")
    click.echo(f"size:    {_human_bytes(stats['bytes'])}")


@cache.command("clear")
@_path_option
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def cache_clear(path: Path | None, yes: bool) -> None:
    """Delete every cached judge reply (the next run asks the providers again).

    Exit code 2: the file is not a judge cache; it is refused, not touched.
    """
    from mlflow_rag_eval.judges.cache import JudgeCache

    with JudgeCache(path) as judge_cache:
        if not yes:
            entries = judge_cache.stats()["entries"]
            click.confirm(f"Delete {entries} cached replies from {judge_cache.path}?", abort=True)
        removed = judge_cache.clear()
    click.echo(f"Removed {removed} entries from {judge_cache.path}.")
