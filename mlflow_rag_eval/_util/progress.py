"""A progress bar for long work (judge calls), on stderr, only where someone watches.

On when stderr is a terminal, unless asked otherwise: by the caller (``progress=`` of
``evaluate_records``, ``evaluator_config["progress"]``, the CLI's ``--no-progress``) or by the
environment variable ``MLFLOW_RAG_EVAL_PROGRESS`` (``0``/``false``/``off`` or ``1``/``true``/
``on``), in that order. The bar is cleared when the work ends, before any summary is printed,
so the two never interleave.
"""

from __future__ import annotations

import os
import sys
import threading

__all__ = ["ENV_VAR", "Progress", "progress_wanted"]

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
