"""One judge's rows on a thread pool bounded by its concurrency, each row contained.

Whatever one row's reply breaks is that row's named :class:`JudgeFailure`, never the batch's.
Only :class:`JudgeUnreachable` goes through: no row can be judged, so the evaluation stops
(pending rows are then cancelled).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any

from mlflow_rag_eval._util.progress import row_done
from mlflow_rag_eval.judges.base import JudgeFailure, JudgeUnreachable
from mlflow_rag_eval.judges.llm.transport import MESSAGE_CHARS
from mlflow_rag_eval.judges.llm.usage import Usage

__all__ = ["RowPool"]

_logger = logging.getLogger(__name__)


class RowPool:
    """A lazily started pool of ``workers`` threads for one judge's calls."""

    def __init__(self, name: str, usage: Usage, workers: int):
        self.name = name
        self.usage = usage
        self.workers = workers
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
        """``fn`` over items on the pool, results in order, each row contained. Each row is
        reported done (:func:`row_done`) as it ends, in whatever order: one slow row does not
        hide the others from the evaluation's bar, nor from its batches (the next one starts
        once this one is down to its tail)."""
        contained = functools.partial(self._contained, fn)
        if len(items) <= 1:
            results = [contained(item) for item in items]
            for _ in results:
                row_done()
            return results
        futures = [self._executor().submit(contained, item) for item in items]
        try:
            # In the caller's thread, so that the evaluation's bar (found in its context) moves per row.
            for future in as_completed(futures):
                future.result()  # JudgeUnreachable goes through; everything else is contained
                row_done()
        finally:
            for future in futures:  # a no-op once they ran; after JudgeUnreachable, the rest never do
                future.cancel()
        return [f.result() for f in futures]

    def _contained(self, fn: Callable[[Any], Any], item: Any) -> Any:
        try:
            return fn(item)
        except JudgeUnreachable:
            raise
        except JudgeFailure as exc:
            return exc
        except Exception as exc:  # noqa: BLE001 - one reply's surprise is one row's error
            _logger.warning("judge %s: a row failed: %s: %s", self.name, type(exc).__name__, exc)
            failure = JudgeFailure(type(exc).__name__, str(exc)[:MESSAGE_CHARS])
            self.usage.add(errors=failure.kind)
            return failure

    async def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` on the pool, for async callers (ragas, deepeval): their
        concurrency is bounded like ours."""
        return await asyncio.get_running_loop().run_in_executor(
            self._executor(), functools.partial(fn, *args, **kwargs))

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="judge")
            return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
