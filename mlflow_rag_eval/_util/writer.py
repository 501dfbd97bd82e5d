"""One write in flight beside the work that produces the next (:class:`OneWriteInFlight`)."""

from __future__ import annotations

import contextlib
import contextvars
from concurrent.futures import Future, ThreadPoolExecutor

__all__ = ["OneWriteInFlight"]


class OneWriteInFlight:
    """A writer thread that runs one write at a time, in the order given, while the caller goes
    on: :meth:`submit` waits for the write before it (raising its error here), and leaving the
    block waits for the last one (its error raised unless another is on its way out already).

    What the store costs (a Feedback or a trace a call, with no batch call in MLflow) is paid
    beside the judging of what comes next instead of after it."""

    def __init__(self, name: str = "rag_eval_writer"):
        self.name = name
        self._pool: ThreadPoolExecutor | None = None
        self._pending: Future | None = None

    def __enter__(self) -> OneWriteInFlight:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self.name)
        return self

    def wait(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def submit(self, fn, *args) -> None:
        self.wait()
        self._pending = self._pool.submit(contextvars.copy_context().run, fn, *args)

    def __exit__(self, kind, exc, tb) -> None:
        try:
            if kind is None:
                self.wait()
            elif self._pending is not None:  # the error on its way out is the one to report
                with contextlib.suppress(Exception):
                    self._pending.result()
        finally:
            self._pool.shutdown(wait=True)
