"""The caller's process-wide settings, kept as they were: a library changes none of them.

Some of what we import lazily changes the root logger when it is first imported under MLflow's
evaluation: ``mlflow.evaluate`` installs import hooks for tracing autolog, so our first import
of sentence-transformers pulls in torch, whose hook imports ``mlflow.pytorch``, whose Lightning
module calls ``logging.basicConfig(level=logging.ERROR)``. The caller's warnings (and ours)
then vanish for the rest of the process. :class:`callers_logging_kept` puts the root logger's
level and handlers, and ``logging.disable``, back as they were when it was entered.
"""

from __future__ import annotations

import contextlib
import logging

__all__ = ["callers_logging_kept"]


class callers_logging_kept(contextlib.ContextDecorator):
    """A context manager and decorator: on exit, the root logger's level and handlers and the
    global ``logging.disable`` level are what they were on entry. Nested and concurrent uses
    restore the outermost state last (each restores what it saw)."""

    def __enter__(self):
        root = logging.getLogger()
        self._saved = (root.level, list(root.handlers), logging.root.manager.disable)
        return self

    def __exit__(self, *exc_info) -> bool:
        level, handlers, disabled = self._saved
        root = logging.getLogger()
        if root.level != level:
            root.setLevel(level)
        if root.handlers != handlers:
            root.handlers[:] = handlers  # a basicConfig under us added one: it is not ours to keep
        if logging.root.manager.disable != disabled:
            logging.disable(disabled)
        return False
