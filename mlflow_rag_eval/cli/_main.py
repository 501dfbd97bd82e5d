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
import os
import sys
import traceback
from pathlib import Path

import click

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

