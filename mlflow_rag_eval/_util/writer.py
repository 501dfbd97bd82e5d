"""Writes run in order on a thread of their own, beside the work that produces the next
(:class:`InOrderWriter`)."""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor

__all__ = ["InOrderWriter"]


class InOrderWriter:
    """A writer thread that runs writes one at a time, in the order given, while the caller
    goes on; a write that fails stops the ones queued after it (they are skipped, never run).

    ``in_flight``: how many writes may be submitted and not ended yet: :meth:`submit` waits for
    the oldest while there are that many (``1``: each write waits for the one before it;
    ``None``: never, the queue holds what the writer has not reached). A failed write's error is
    raised by the next :meth:`submit` that finds it ended, or when the block ends, unless
    another error is on its way out already; leaving the block waits for every write.

    What the store costs (a Feedback or a trace a call, with no batch call in MLflow) is paid
    beside the work that comes next instead of after it."""

    def __init__(self, name: str = "rag_eval_writer", in_flight: int | None = 1):
        self.name, self.in_flight = name, in_flight
        self._pool: ThreadPoolExecutor | None = None
        self._pending: deque[Future] = deque()
        self._failed = threading.Event()

    def __enter__(self) -> InOrderWriter:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self.name)
        return self

    def _settle(self, keep: int | None) -> None:
        """Take the writes that ended (raising the first error); wait for the oldest until at
        most ``keep`` are pending (None: wait for none)."""
        while self._pending and (self._pending[0].done() or (keep is not None and len(self._pending) > keep)):
            self._pending.popleft().result()

    def wait(self) -> None:
        """Wait for every write submitted (raising the first error)."""
        self._settle(0)

    def _run(self, fn, args, kwargs):
        if self._failed.is_set():  # a write before this one failed: its error is the one raised
            return None
        try:
            return fn(*args, **kwargs)
        except BaseException:
            self._failed.set()
            raise

    def submit(self, fn, *args, **kwargs) -> None:
        """Queue ``fn(*args, **kwargs)`` for the writer thread, after the writes before it."""
        self._settle(None if self.in_flight is None else self.in_flight - 1)
        self._pending.append(self._pool.submit(contextvars.copy_context().run, self._run, fn, args, kwargs))

    def __exit__(self, kind, exc, tb) -> None:
        try:
            if kind is None:
                self.wait()
            else:  # the error on its way out is the one to report
                for pending in self._pending:
                    with contextlib.suppress(Exception):
                        pending.result()
        finally:
            self._pool.shutdown(wait=True)
