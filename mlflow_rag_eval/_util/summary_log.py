"""The logger the library's summaries go through: each evaluation's summary, the budget line,
a production-scoring pass's summary.

They are for the person who runs the evaluation, so they print by default, on stderr, as
MLflow's own log lines do: MLflow gives its ``mlflow`` logger a handler of its own, a level and
``propagate = False`` (``mlflow/utils/logging_utils.py``), and this module does the same for
the one logger :data:`SUMMARY_LOGGER` when it first logs (unless the app configured it
already), and for no other (the root logger, and the caller's
loggers, are left as they are). An app routes or silences the summaries there::

    logging.getLogger("mlflow_rag_eval.summary").setLevel(logging.WARNING)   # silence them
    summary = logging.getLogger("mlflow_rag_eval.summary")                   # or route them
    summary.handlers, summary.propagate = [], True                           # to the app's handlers

The module's other loggers (``mlflow_rag_eval.<module>``, warnings) are untouched: they
propagate to the caller's logging as any library's do.
"""

from __future__ import annotations

import logging
import sys
import threading

__all__ = ["SUMMARY_LOGGER", "summary_logger", "say"]

SUMMARY_LOGGER = "mlflow_rag_eval.summary"
_LOCK = threading.Lock()


class _Stderr:
    """``sys.stderr`` as it is when a line is written (pytest's capture, a notebook's stream),
    not as it was when the handler was made: MLflow's ``MlflowLoggingStream`` does the same."""

    def write(self, text: str) -> None:
        sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


class _SummaryHandler(logging.StreamHandler):
    """The handler this module installs (told apart from one an app put there)."""


def summary_logger() -> logging.Logger:
    """The summaries' logger. Left as it is when an app has configured it (a handler or a
    level of its own); else given its handler, level INFO and ``propagate = False``."""
    logger = logging.getLogger(SUMMARY_LOGGER)
    with _LOCK:
        if not logger.handlers and logger.level == logging.NOTSET:
            handler = _SummaryHandler(stream=_Stderr())
            handler.setFormatter(logging.Formatter("%(message)s"))  # the lines as they were printed
            logger.addHandler(handler)
            logger.setLevel(logging.INFO)
            logger.propagate = False
    return logger


def say(text: str) -> None:
    """Log a summary (several lines as one record)."""
    summary_logger().info(text)
