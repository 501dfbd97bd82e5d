"""A progress bar for long work (judge calls), on stderr, only where someone watches.

On when stderr is a terminal, unless asked otherwise: by the caller (``progress=`` of
``evaluate_records``, ``evaluator_config["progress"]``, the CLI's ``--no-progress``) or by the
environment variable ``MLFLOW_RAG_EVAL_PROGRESS`` (``0``/``false``/``off`` or ``1``/``true``/
``on``), in that order. The bar is cleared when the work ends, before any summary is printed,
so the two never interleave.

Within a batch, a judge tells the bar of the evaluation running in its context each time a row
has its answer (:func:`row_done`, called by the LLM judge's row pool): an LLM batch that takes
minutes moves row by row, not metric by metric.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextvars import ContextVar

__all__ = ["ENV_VAR", "Progress", "progress_wanted", "row_done", "rows_reported_to"]

_ROW_DONE: ContextVar[Callable[[], None] | None] = ContextVar("mlflow_rag_eval_row_done", default=None)


def row_done() -> None:
    """One row of the work at hand has its answer: the evaluation running in this context (if
    any) moves its bar. Cheap, and nothing happens outside an evaluation that shows one."""
    callback = _ROW_DONE.get()
    if callback is not None:
        callback()


@contextlib.contextmanager
def rows_reported_to(callback: Callable[[], None] | None) -> Iterator[None]:
    """:func:`row_done` calls in this context (and in copies taken inside it) go to ``callback``."""
    token = _ROW_DONE.set(callback)
    try:
        yield
    finally:
        _ROW_DONE.reset(token)

ENV_VAR = "MLFLOW_RAG_EVAL_PROGRESS"
_OFF, _ON = {"0", "false", "off", "no"}, {"1", "true", "on", "yes"}


def progress_wanted(asked: bool | None = None) -> bool:
    """Whether to show progress: ``asked`` when given, else the environment variable, else
    whether stderr is a terminal.

    Raises:
        ValueError: the variable holds something else than on/off words.
    """
    if asked is not None:
        return bool(asked)
    value = os.environ.get(ENV_VAR, "").strip().lower()
    if value in _OFF:
        return False
    if value in _ON:
        return True
    if value:
        raise ValueError(f"{ENV_VAR}={value!r}: use 1/true/on or 0/false/off")
    return sys.stderr.isatty()


class Progress:
    """``total`` units of work as a tqdm bar on stderr (nothing at all when not ``shown``);
    thread-safe :meth:`advance`, and :meth:`close` clears the bar."""

    def __init__(self, total: int, *, shown: bool, description: str = "rag eval", unit: str = "row"):
        self._bar = None
        self._lock = threading.Lock()
        if shown and total > 0:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, desc=description, unit=unit, file=sys.stderr, leave=False,
                             dynamic_ncols=True, smoothing=0.1)

    def advance(self, n: int, **postfix) -> None:
        if self._bar is None:
            return
        with self._lock:
            if postfix:
                self._bar.set_postfix(postfix, refresh=False)
            self._bar.update(n)

    def note(self, **postfix) -> None:
        """Show ``postfix`` (e.g. the judge's calls so far) without advancing."""
        if self._bar is None:
            return
        with self._lock:
            self._bar.set_postfix(postfix)

    def close(self) -> None:
        if self._bar is not None:
            with self._lock:
                self._bar.close()
            self._bar = None
