"""The ``mlflow-rag-eval`` command line.

``main`` is a click group so other modules can attach commands to it. Every command imports
what it needs inside its body: ``mlflow-rag-eval --help`` must not pay for importing torch,
sentence-transformers or MLflow.

Exit codes, for every command: 0 done (for ``gate``: passed), 1 refused (``gate`` only: the
candidate failed a check), 2 unusable input, 3 internal error. No traceback reaches the user
for bad input: the group turns the errors that input causes into one line on stderr and exit 2
(see :func:`_is_input_error`), and so it does for an environment that cannot import what it
needs, naming what to install (:func:`_environment_error`: SQLAlchemy 2.1 under MLflow 3.4-3.8). Any other exception is a bug in this package: its traceback is
printed and the exit code is 3, so that it is reported, and never read as a verdict (1 would
say "refused", 2 "your input").
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import sys
import traceback
from pathlib import Path

import click

from mlflow_rag_eval.keys import RUN_METRICS

__all__ = ["main"]

#: exit codes
REFUSED, UNUSABLE, INTERNAL_ERROR = 1, 2, 3


def _is_input_error(exc: BaseException) -> bool:
    """Whether ``exc`` comes from what the user gave rather than from a bug.

    - ``ValueError``: bad values, by Python's convention and ours (``PolicyError``,
      ``NotComparable``, ``NotAJudgeCache``, undecodable files: ``UnicodeDecodeError``,
      ``json.JSONDecodeError``);
    - ``OSError``: files missing or unreadable, and an unreachable tracking server (``requests``
      errors are OSErrors);
    - ``sqlite3.Error``: a cache file that is locked or unreadable;
    - ``MlflowException``: unknown run, version or model, a store that refuses a query;
    - ``JudgeUnreachable`` and ``JudgeCapabilityError``: a judge whose provider cannot be
      reached, or that cannot perform what the metric asks (configuration, not code).

    ``TypeError``, ``KeyError``, ``AttributeError``, other ``RuntimeError``s and the rest stay
    bugs.
    """
    import sqlite3

    if isinstance(exc, (ValueError, OSError, sqlite3.Error)):
        return True
    # Modules never imported just to check: an exception of theirs means they are loaded.
    classes = [getattr(sys.modules.get("mlflow.exceptions"), "MlflowException", None),
               *(getattr(sys.modules.get("mlflow_rag_eval.judges.base"), name, None)
                 for name in ("JudgeUnreachable", "JudgeCapabilityError"))]
    return isinstance(exc, tuple(c for c in classes if c is not None))


def _is_store_error(exc: BaseException) -> bool:
    """Whether ``exc`` was raised by the database layer under MLflow's tracking store
    (SQLAlchemy, Alembic): a store broken, e.g. by a kill inside MLflow's own migrations, is the
    store's problem, not a bug of ours."""
    return any(cls.__module__.split(".")[0] in ("sqlalchemy", "alembic") for cls in type(exc).__mro__)


def _installed(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "?"


def _environment_error(exc: BaseException) -> str | None:
    """What to install, when ``exc`` is an installed package failing to import another (the
    environment's problem, not a bug of ours); None otherwise.

    MLflow 3.4 to 3.8 import ``FallbackAsyncAdaptedQueuePool`` from ``sqlalchemy.pool`` to open
    any SQL store; SQLAlchemy 2.1 removed it, and the import fails with an ImportError naming
    ``sqlalchemy.pool`` (``name``) and the missing class (its message): the fix is the pin."""
    if not isinstance(exc, ImportError):
        return None
    module = exc.name or ""
    if not module or module.split(".")[0] == "mlflow_rag_eval":
        return None  # one of our own imports: a bug
    message = _one_line(exc)
    if module.split(".")[0] == "sqlalchemy" and message.startswith("cannot import name"):
        return (f"MLflow {_installed('mlflow')} cannot open a SQL tracking store with SQLAlchemy "
                f"{_installed('sqlalchemy')} ({message.split(' (')[0]}): MLflow 3.4 to 3.8 need SQLAlchemy<2.1 "
                "(a class they import was removed in 2.1): pip install 'SQLAlchemy<2.1', or a newer MLflow")
    return f"a package this command needs cannot be imported: {message}"


def _one_line(exc: BaseException) -> str:
    message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    return " ".join(str(message).split())


class _Main(click.Group):
    """The group: bad input -> one line and exit 2; a bug -> traceback and exit 3."""

    def invoke(self, ctx: click.Context):
        with _quiet_mlflow(verbose=ctx.params.get("verbose", False)):
            return self._invoke(ctx)

    def _invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Abort, click.exceptions.Exit):
            raise  # click prints usage errors itself (exit 2, as ours)
        except Exception as exc:
            command = " ".join(filter(None, [ctx.command_path, ctx.invoked_subcommand]))
            if _is_store_error(exc):
                click.echo(f"{command}: the tracking store failed ({type(exc).__name__}: {_one_line(exc)[:300]}); "
                           "the store is damaged or of another MLflow version: check it, or run "
                           "`mlflow db upgrade <store uri>` on a copy", err=True)
                raise SystemExit(UNUSABLE) from None
            environment = _environment_error(exc)
            if environment is not None:
                click.echo(f"{command}: {environment}", err=True)
                raise SystemExit(UNUSABLE) from None
            if _is_input_error(exc):
                click.echo(f"{command}: {_one_line(exc)}", err=True)
                raise SystemExit(UNUSABLE) from None
            traceback.print_exc()
            click.echo(f"{command}: internal error (a bug in mlflow-rag-eval; please report it with "
                       "the traceback above)", err=True)
            raise SystemExit(INTERNAL_ERROR) from None


#: what a command sets while it runs, unless -v (or the user set the variable already)
_QUIET_ENV = {"MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false", "MLFLOW_LOGGING_LEVEL": "WARNING"}


def _below_warning(record) -> bool:
    """A logging filter: only warnings and errors pass."""
    import logging

    return record.levelno >= logging.WARNING


def _migration_loggers() -> list[str]:
    """The loggers of MLflow's migration scripts: alembic loads each script as a module named
    after its file, every non-word character an underscore (``..._create_latest_metrics_table_py``).
    Found without importing MLflow."""
    import importlib.util
    import re

    spec = importlib.util.find_spec("mlflow")
    if spec is None or not spec.submodule_search_locations:
        return []
    versions = Path(list(spec.submodule_search_locations)[0]) / "store" / "db_migrations" / "versions"
    return [re.sub(r"\W", "_", path.name) for path in sorted(versions.glob("*.py"))]


@contextlib.contextmanager
def _quiet_mlflow(verbose: bool):
    """While a command runs: no "Downloading artifacts" bars and no MLflow INFO lines (one
    ``compare`` printed six bars), unless ``-v``. Put back as they were afterwards, so a caller
    that runs the command in its own process (a test, a notebook) keeps its settings."""
    import logging

    if verbose:
        yield
        return
    saved_env = {name: os.environ.get(name) for name in _QUIET_ENV}
    logger = logging.getLogger("mlflow")  # configured from MLFLOW_LOGGING_LEVEL when mlflow is imported;
    saved_level = logger.level  # already imported here (a test, a notebook): set it too
    for name, value in _QUIET_ENV.items():
        os.environ.setdefault(name, value)
    if saved_env["MLFLOW_LOGGING_LEVEL"] is None:  # the user's level, when set, is theirs
        logger.setLevel(max(saved_level, logging.WARNING))
    # A fresh SQL store on MLflow releases whose migrations' env.py runs logging.config.fileConfig
    # (3.6 does; 3.17 does not) printed ~45 "INFO [alembic.runtime.migration] Running upgrade"
    # lines: that fileConfig resets the alembic logger to INFO and gives the root a stderr
    # handler, so no level set beforehand holds. A filter on the logger the lines are made on
    # survives it (fileConfig keeps filters, and leaves loggers it does not list alone).
    # MLflow's migration scripts log "Migration complete!" at INFO on loggers of their own.
    migrations = [logging.getLogger(name) for name in ("alembic.runtime.migration", *_migration_loggers())]
    for migration_logger in migrations:
        migration_logger.addFilter(_below_warning)
    try:
        yield
    finally:
        for migration_logger in migrations:
            migration_logger.removeFilter(_below_warning)
        logger.setLevel(saved_level)
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@click.group(cls=_Main)
@click.option("-v", "--verbose", is_flag=True, help="Show MLflow's own progress bars and INFO lines.")
def main(verbose: bool) -> None:
    """Evaluate RAG pipelines inside MLflow.

    Exit codes: 0 done (gate: passed), 1 refused (gate), 2 unusable input, 3 internal error.
    """


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
    """``--timeout``, ``--deadline``, ``--rate-limit`` and ``--concurrency`` of an LLM judge,
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
    ]

    @functools.wraps(command)
    def run(*args, timeout, deadline, rate_limit, concurrency, **kwargs):
        given = {"timeout": timeout, "deadline": deadline, "rate_limit": rate_limit, "concurrency": concurrency}
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


@main.command("train-local-judge")
@click.option("--corpus", "corpora", multiple=True, type=click.Path(exists=True),
              help="Passages to make synthetic examples from: a folder of .txt/.md files, a JSONL file "
                   "(field text, context or passage) or a text file (passages split by blank lines). Repeatable.")
@click.option("--labels", "labels", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="Human-labelled pairs, JSONL with context, answer, label (0/1). Repeatable.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the synthetic examples.")
@click.option("--per-passage", type=int, default=4, show_default=True,
              help="Sentences drawn per passage for synthetic examples.")
@click.option("--synthetic-weight", type=float, default=0.05, show_default=True,
              help="Total weight of a source's synthetic examples against its labelled pairs (1).")
@click.option("--answer-corruption-weight", type=float, default=0.05, show_default=True,
              help="Total weight of a source's corrupted sentences of answers labelled 1 (negatives) against its "
                   "labelled pairs (1); 0: none.")
@click.option("--cross-encoder", "use_cross_encoder", is_flag=True,
              help="Read the cross-encoder's entailment of each claim as one more feature of the model, instead of "
                   "as a veto over it.")
@click.option("--veto", is_flag=True,
              help="With --labels: the cross-encoder vetoes the model (a claim is supported only when both agree), "
                   "both thresholds chosen to hold on every labelled source.")
@click.option("--train-cross-encoder", "adapt_cross_encoder", is_flag=True,
              help="Also fine-tune a cross-encoder on one-word edits of your corpus and your labelled pairs, "
                   "beside the shipped pairs (needs torch: the [train] extra); its cost is printed first. "
                   "Written beside --out as OUT.cross_encoder.safetensors.")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="Where to write the model JSON.")
def train_local_judge(corpora, labels, seed, per_passage, synthetic_weight, answer_corruption_weight,
                      use_cross_encoder, veto, adapt_cross_encoder, out) -> None:
    """Train the local judge's support model and write it as JSON; use it as the judge local:OUT.

    With --cross-encoder the support model also reads the shipped cross-encoder's entailment;
    with --train-cross-encoder a cross-encoder adapted to your corpus is trained first and read.

    Exit code 2: no corpus or labels, or no training example in them.
    """
    from mlflow_rag_eval.judges.local_model.cross_encoder import load_cross_encoder
    from mlflow_rag_eval.judges.local_model.training import load_corpus, load_pairs, train_support_model

    if not corpora and not labels:
        click.echo("cannot train: give --corpus and/or --labels", err=True)
        raise SystemExit(UNUSABLE)
    try:
        passages = [p for c in corpora for p in load_corpus(c)]
        pairs = [p for f in labels for p in load_pairs(f)]
        cross_encoder, cross_encoder_path = None, None
        if adapt_cross_encoder:
            cross_encoder_path = str(_adapt_cross_encoder(passages, pairs, out, seed))
        veto = veto and bool(pairs) and not use_cross_encoder  # the veto's threshold is chosen on labelled pairs
        if use_cross_encoder or adapt_cross_encoder or veto:
            cross_encoder = load_cross_encoder(cross_encoder_path)
        model = train_support_model(passages, pairs, seed=seed, per_passage=per_passage,
                                    synthetic_weight=synthetic_weight,
                                    answer_corruption_weight=answer_corruption_weight, cross_encoder=cross_encoder,
                                    veto=veto)
    except (ValueError, UnicodeDecodeError, FileNotFoundError) as exc:
        click.echo(f"cannot train: {_one_line(exc)}", err=True)
        raise SystemExit(UNUSABLE) from None
    if adapt_cross_encoder:  # the judge finds it beside the model
        model = dataclasses.replace(model, training={**model.training,
                                                     "cross_encoder_file": Path(cross_encoder_path).name})
    Path(out).write_text(model.to_json())
    t = model.training
    click.echo(f"wrote {out}: {t['n_synthetic']} synthetic examples from {t['n_passages']} passages, "
               f"{t['n_pairs']} labelled pairs, {t['n_answer_corruptions']} corrupted answer sentences; "
               f"threshold {model.threshold:.3f}"
               + (f", entailment veto {model.entailment_veto:.3f}" if model.entailment_veto is not None else "")
               + f"; judge name local:{out}")


def _adapt_cross_encoder(passages, pairs, out, seed) -> Path:
    """The shipped cross-encoder fine-tuned further on one-word edits of the user's passages and
    the user's labelled pairs (their answers' sentences against their best windows); the cost is
    printed before the work starts."""
    from mlflow_rag_eval.judges.local_model.cross_encoder import default_cross_encoder_path
    from mlflow_rag_eval.judges.local_model.cross_training import estimate_seconds, train_cross_encoder, user_pairs

    training = user_pairs(passages, pairs, seed=seed)
    if not training:
        raise ValueError("no sentence of five words or more in the corpus or the labelled pairs to adapt on")
    click.echo(f"adapting the shipped cross-encoder on {len(training)} pairs from your data (1 epoch): about "
               f"{estimate_seconds(len(training), 1) / 60:.1f} min on this machine's cores", err=True)
    path = Path(out).with_suffix(".cross_encoder.safetensors")
    train_cross_encoder(training, path, seed=seed, epochs=1, lr=2e-5, head_lr=2e-4,
                        start_from=default_cross_encoder_path(), log=lambda line: click.echo(line, err=True))
    return path


@main.command("train-cross-encoder")
@click.option("--pairs", "pair_files", multiple=True, required=True, type=click.Path(exists=True, dir_okay=False),
              help="Entailment pairs, JSONL (.gz) with claim, premise, label (0/1), source, and optionally group "
                   "(a rewrite and its edit: one batch, ranked). Repeatable.")
@click.option("--validation", "validation_file", default=None, type=click.Path(exists=True, dir_okay=False),
              help="Rewrite/edit twins (pairs sharing a group) the threshold is chosen on; recorded in the JSON.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the shuffles and the head's start.")
@click.option("--epochs", type=int, default=3, show_default=True, help="Passes over the pairs.")
@click.option("--frozen-layers", type=int, default=3, show_default=True,
              help="Bottom layers of the embedding model kept as they are (their output computed once).")
@click.option("--rank-weight", type=float, default=1.0, show_default=True,
              help="Weight of the ranking loss (a group's entailed pair above its other) beside the classification.")
@click.option("--max-per-source", type=int, default=None,
              help="At most N pairs of each source (the first in file order): the training time's lever.")
@click.option("--limit", type=int, default=None, help="Train on the first N pairs only (a quick check).")
@click.option("--work-dir", default=None, type=click.Path(file_okay=False),
              help="Where the bottom layers' states and a checkpoint every ~10 minutes are kept; the same command "
                   "run again with the same --work-dir resumes from the last checkpoint.")
@click.option("--out", required=True, type=click.Path(dir_okay=False),
              help="Where to write the weights (.safetensors; the .json beside it records how).")
def train_cross_encoder_command(pair_files, validation_file, seed, epochs, frozen_layers, rank_weight, max_per_source,
                                limit, work_dir, out) -> None:
    """Fine-tune the local judge's cross-encoder (the top layers of its embedding model and a
    head) on entailment pairs; needs torch (the [train] extra). Name it in a judge with
    local:minilm-l6?cross_encoder=OUT beside a support model trained on it.

    Exit code 2: unreadable pairs, or torch missing.
    """
    from mlflow_rag_eval.judges.local_model.cross_training import (
        estimate_seconds,
        load_entailment_pairs,
        per_source,
        train_cross_encoder,
    )

    try:
        pairs = per_source([p for f in pair_files for p in load_entailment_pairs(f)], max_per_source)[:limit]
        validation = load_entailment_pairs(validation_file) if validation_file else ()
        click.echo(f"{len(pairs)} pairs, {epochs} epoch(s): about {estimate_seconds(len(pairs), epochs) / 60:.0f} min",
                   err=True)
        selection = {"files": [Path(f).name for f in pair_files], "max_per_source": max_per_source, "limit": limit,
                     "validation": Path(validation_file).name if validation_file else None}
        train_cross_encoder(pairs, out, seed=seed, epochs=epochs, frozen_layers=frozen_layers, rank_weight=rank_weight,
                            selection=selection, validation=validation, work_dir=work_dir,
                            log=lambda line: click.echo(line, err=True))
    except (ValueError, UnicodeDecodeError) as exc:
        click.echo(f"cannot train: {_one_line(exc)}", err=True)
        raise SystemExit(UNUSABLE) from None
    except ModuleNotFoundError as exc:
        click.echo(f"cannot train: {exc.name} is missing; pip install 'mlflow-rag-eval[train]'", err=True)
        raise SystemExit(UNUSABLE) from None


@main.command("testset")
@click.option("--corpus", required=True, type=click.Path(exists=True, dir_okay=False),
              help="Passages, JSONL: id and text required, title and metadata (tags, topic) optional.")
@click.option("--judge", required=True,
              help="The judge that writes and checks the questions: an LLM judge name, or 'scripted' "
                   "(deterministic rules, offline). The embedded local judge cannot write text.")
@click.option("--n", "n", type=int, default=100, show_default=True, help="Questions wanted.")
@click.option("--mix", default="0.5,0.25,0.25", show_default=True,
              help="Shares of single-passage, two-passage and unanswerable questions.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the passage sampling.")
@click.option("--oversample", type=float, default=1.25, show_default=True,
              help="Candidates written per wanted question, so drops can be made up.")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="Where to write the golden set (JSONL).")
@click.option("--log-as", "log_as", default=None,
              help="Also log the set in MLflow under this name (a run with the set as a dataset input, and an "
                   "MLflow evaluation dataset where the store has them).")
@click.option("--experiment", default=None, help="Experiment to log in (default: the active one).")
@_tracking_option
@_judge_limit_options
def testset_command(corpus, judge, n, mix, seed, oversample, out, log_as, experiment, tracking_uri,
                    judge_options) -> None:
    """Write a golden set from your documents: questions one passage answers, questions that need
    two, and questions the corpus cannot answer, each checked by the judge; prints what was
    dropped and why, and the set's digest (the rag_eval.dataset_digest of every run on it).

    Exit code 2: unreadable corpus, bad --mix, or a judge that cannot write text.
    """
    from mlflow_rag_eval.golden import generate_golden_set, load_passages
    from mlflow_rag_eval.judges import JudgeCapabilityError

    try:
        shares = tuple(float(x) for x in mix.split(","))
        golden = generate_golden_set(load_passages(corpus), _judge(judge, judge_options), n=n, mix=shares, seed=seed,
                                     oversample=oversample)
    except (ValueError, JudgeCapabilityError) as exc:
        click.echo(f"cannot write a golden set: {_one_line(exc)}", err=True)
        raise SystemExit(UNUSABLE) from None
    golden.to_jsonl(out)
    click.echo(golden.report.to_text())
    click.echo(f"wrote {out}: {len(golden.rows)} questions, digest {golden.digest}")
    if log_as:
        from mlflow_rag_eval.golden import log_golden_set

        _use_store(tracking_uri, experiment)
        logged = log_golden_set(golden, log_as)
        where = (f"MLflow evaluation dataset {logged.dataset_id}" if logged.dataset_id
                 else f"run {logged.run_id} (this store has no evaluation datasets)")
        click.echo(f"logged as {log_as!r}: {where}")


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
                     sample_fraction, max_cost, metrics, judge, slice_by, run_metrics, columns, experiment, run_name, no_traces,
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
    import mlflow

    _check_evaluate_route(data_path, traces_experiment, spark_master or columns or no_traces or output is not None,
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
        _evaluate_on_spark(data_path, metrics, judge, slice_by, columns, experiment, run_name, no_traces,
                           max_error_rate, spark_master, output, max_table_rows, tracking_uri, judge_options,
                           progress=False if no_progress else None, run_metrics=run_metrics)
        return
    if output is not None:
        raise click.UsageError("--output is for --spark (the scored rows' Parquet folder)")

    from mlflow_rag_eval.evaluation.budget import Budget
    from mlflow_rag_eval.evaluation.engine import evaluate_records
    from mlflow_rag_eval.evaluation.slices import attach_columns, check_frame, check_slice_by, slice_members
    from mlflow_rag_eval.records import ColumnMapping, records_from_frame
    from mlflow_rag_eval.results import ErrorRateExceeded
    from mlflow_rag_eval.tracking.run_logging import announce, log_dataset_input, log_evaluation

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
    with mlflow.start_run(run_name=run_name) as run:
        # The dataset first: the run's description names it.
        log_dataset_input(run.info.run_id, str(Path(data_path).resolve()), result.dataset_digest)
        log_evaluation(result, run.info.run_id, log_traces=not no_traces, slice_by=slice_fields,
                       tags=budget.run_tags(), progress=False if no_progress else None, run_metrics=run_metrics)
    try:
        announce(result, max_error_rate=max_error_rate)
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
        raise click.UsageError("--spark, --col, --no-traces and --output are for --data")
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


def _column_mapping(columns: tuple[str, ...]) -> dict[str, str]:
    bad = [c for c in columns if "=" not in c]
    if bad:
        raise ValueError(f"--col takes FIELD=COLUMN, got {bad[0]!r}")
    return dict(c.split("=", 1) for c in columns)


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


def _evaluate_on_spark(data_path, metrics, judge, slice_by, columns, experiment, run_name, no_traces,
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
                              judge_options=judge_options, run_metrics=run_metrics)
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
    <metric>/ppi_mean, /ppi_ci_low, /ppi_ci_high and /n_human.

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
