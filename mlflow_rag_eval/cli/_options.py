"""Options and helpers shared by several commands: the tracking URI (checked to answer), an LLM
judge's limits, the data file a command reads."""

from __future__ import annotations

import functools
from pathlib import Path

import click

#: seconds to wait for a tracking server's first answer before saying it cannot be reached
REACH_TIMEOUT_S = 10.0


def _reachable_tracking_uri(ctx, param, uri: str | None) -> str | None:
    """``--tracking-uri`` (or $MLFLOW_TRACKING_URI), checked to answer when it is a server.

    MLflow's client retries a server that does not answer for minutes, then reports what it
    was asked for as missing (a gate said "model version not found" after 247 s); one request
    to ``/health`` first says in seconds that the server cannot be reached. Any HTTP answer
    counts as reachable (a managed server may have no ``/health``)."""
    if not uri or not uri.startswith(("http://", "https://")):
        return uri
    import requests

    try:
        requests.get(f"{uri.rstrip('/')}/health", timeout=(REACH_TIMEOUT_S, REACH_TIMEOUT_S), allow_redirects=False)
    except (requests.ConnectionError, requests.Timeout) as exc:
        raise ConnectionError(f"cannot reach the tracking server at {uri} within {REACH_TIMEOUT_S:g} s "
                              f"({type(exc).__name__}); check the address and that the server runs") from None
    return uri


_tracking_option = click.option(
    "--tracking-uri", default=None, envvar="MLFLOW_TRACKING_URI", callback=_reachable_tracking_uri,
    help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else MLflow's default).",
)


def _judge_limit_options(command):
    """``--timeout``, ``--deadline``, ``--rate-limit``, ``--concurrency`` and ``--outage-budget`` of an LLM judge,
    given to ``command`` as one ``judge_options`` dict of those set (for ``get_judge``); the
    local and scripted judges call no provider and refuse them."""
    positive = click.FloatRange(min=0, min_open=True)
    options = [
        click.option("--timeout", type=positive, default=None,
                     help="LLM judge: seconds one HTTP attempt may take (default 60)."),
        click.option("--deadline", type=positive, default=None,
                     help="LLM judge: seconds one judge call may take, retries included (default 120)."),
        click.option("--rate-limit", "rate_limit", type=positive, default=None,
                     help="LLM judge: requests per second at most, across threads and retries."),
        click.option("--concurrency", type=click.IntRange(min=1), default=None,
                     help="LLM judge: requests in flight at once."),
        click.option("--outage-budget", "outage_budget", type=click.FloatRange(min=0), default=None,
                     help="LLM judge: seconds a judge that answered before is waited for when it stops answering "
                          "(default 300); past them the rows not judged fail as JudgeStopped, the run is logged "
                          "with the rest and the command exits 2. 0: no waiting (the run stops, logging nothing)."),
    ]

    @functools.wraps(command)
    def run(*args, timeout, deadline, rate_limit, concurrency, outage_budget, **kwargs):
        given = {"timeout": timeout, "deadline": deadline, "rate_limit": rate_limit, "concurrency": concurrency,
                 "outage_budget": outage_budget}
        return command(*args, judge_options={k: v for k, v in given.items() if v is not None}, **kwargs)

    for option in reversed(options):
        run = option(run)
    return run


def _judge(name: str, judge_options: dict):
    """The judge name as it is when no option is set (the routes build it), else the judge."""
    if not judge_options:
        return name
    from mlflow_rag_eval.judges import get_judge

    return get_judge(name, **judge_options)



def _use_store(tracking_uri: str | None, experiment: str | None) -> None:
    """Point MLflow at ``--tracking-uri`` and ``--experiment`` when given."""
    import mlflow

    if tracking_uri:
        mlflow.set_tracking_uri(tracking_uri)
    if experiment:
        mlflow.set_experiment(experiment)


def _read_rows(path: str, mapping=None):
    """A data file as a DataFrame: Parquet, JSONL (one row per line) or CSV, by extension.

    CSV has no lists: its cells of list or dict fields (contexts, context_ids, relevant_ids,
    relevance_grades, reference_contexts, metadata; the columns ``mapping`` names) hold JSON
    text, decoded here, so a CSV file evaluates like the same rows in JSONL."""
    import pandas as pd

    suffix = Path(path).suffix.lower()
    if suffix in (".parquet", ".pq") or Path(path).is_dir():  # a folder: Parquet files, as Spark writes them
        return pd.read_parquet(path)
    if suffix in (".jsonl", ".ndjson"):
        return pd.read_json(path, lines=True, dtype=False)
    if suffix == ".json":
        return pd.read_json(path, dtype=False)
    if suffix == ".csv":
        return _decode_json_cells(pd.read_csv(path), mapping, path)
    raise ValueError(f"{path}: unknown data format {suffix or '(no extension)'!r}; give .parquet, .jsonl or .csv")


#: record fields whose cells are lists or dicts (JSON text in a CSV file)
_STRUCTURED_FIELDS = ("contexts", "context_ids", "relevant_ids", "relevance_grades", "reference_contexts", "metadata")


def _decode_json_cells(frame, mapping, path: str):
    """``frame`` with the JSON text of its structured columns decoded; a cell that looks like
    JSON (``[...]`` or ``{...}``) and is not stops the evaluation, naming its row and column."""
    import json

    import pandas as pd

    from mlflow_rag_eval.records import ColumnMapping

    mapping = mapping or ColumnMapping()
    for column in {getattr(mapping, f) for f in _STRUCTURED_FIELDS} & set(frame.columns):
        values = list(frame[column])
        for i, cell in enumerate(values):
            if isinstance(cell, str) and cell.lstrip()[:1] in ("[", "{"):
                try:
                    values[i] = json.loads(cell)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}: row {i}, column {column!r}: a CSV cell of a list or dict field "
                                     f"must be JSON ({exc.msg} at character {exc.pos})") from None
        frame[column] = pd.Series(values, index=frame.index, dtype=object)
    return frame



def _column_mapping(columns: tuple[str, ...]) -> dict[str, str]:
    bad = [c for c in columns if "=" not in c]
    if bad:
        raise ValueError(f"--col takes FIELD=COLUMN, got {bad[0]!r}")
    return dict(c.split("=", 1) for c in columns)
