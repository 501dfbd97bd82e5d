"""A sequence that holds its first items in memory and the rest in a temporary file.

What an evaluation returns holds one :class:`~mlflow_rag_eval.results.RowResult` per row and
metric, with its reasons and evidence: about 4 KiB a row with two judged metrics, so a night's
100,000 rows grew the process by ~390 MiB (bench/faults.py, issue 47). Like
:class:`tempfile.SpooledTemporaryFile`, :class:`SpooledSequence` keeps up to ``in_memory`` items
as they are; past that it pickles them, ``chunk`` at a time, zlib-compressed, into an anonymous
temporary file (``tempfile.TemporaryFile``: in ``TMPDIR``, gone when closed or when the process
ends) and reads a chunk back when an item of it is asked for (the last chunk read is kept, so a
walk in row order decodes each chunk once). An evaluation of up to ``in_memory`` rows never
touches the disk.

It is read like the tuple it replaces: ``len``, indexing (slices give tuples), iteration, and
``==`` with any sequence of equal items. Pickling or copying it gives a plain tuple. Items that
cannot be pickled (a custom metric's details holding a lock, say) stay in memory, chunk by
chunk: spilling saves memory, it never loses a row.
"""

from __future__ import annotations

import bisect
import pickle
import tempfile
import threading
import weakref
import zlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Generic, TypeVar, overload

__all__ = ["CHUNK", "IN_MEMORY", "SpooledSequence"]

T = TypeVar("T")

#: items held in memory before any is written out: an evaluation of this many rows or fewer
#: never writes a file
IN_MEMORY = 2048
#: items per chunk written (and read back) at once
CHUNK = 1024


class SpooledSequence(Sequence[T], Generic[T]):
    """An append-only sequence whose items past ``in_memory`` live in a temporary file (see the
    module docstring). Appending is for one writer; reading is safe from any thread."""

    __hash__ = None  # type: ignore[assignment]  # it grows: like a list, not hashable

    def __init__(self, items: Iterable[T] = (), *, in_memory: int | None = None, chunk: int | None = None):
        in_memory = IN_MEMORY if in_memory is None else in_memory  # read now: a test may lower them
        chunk = CHUNK if chunk is None else chunk
        if in_memory < 0 or chunk < 1:
            raise ValueError(f"in_memory must be >= 0 and chunk >= 1, got {in_memory} and {chunk}")
        self._in_memory, self._chunk = in_memory, chunk
        self._head: list[T] = []  # the first in_memory items
        self._starts: list[int] = []  # per chunk past the head: the index of its first item
        #: per chunk: (offset, size) in the file, or the items themselves when they would not pickle
        self._places: list[tuple[int, int] | list[T]] = []
        self._pending: list[T] = []  # past the last chunk, not written yet
        self._n = 0
        self._file: Any = None
        self._size = 0
        self._lock = threading.Lock()
        self._read: tuple[int, list[T]] | None = None  # the chunk read last: (its number, its items)
        self.extend(items)

    # ------------------------------------------------------------------ writing

    def append(self, item: T) -> None:
        self.extend((item,))

    def extend(self, items: Iterable[T]) -> None:
        with self._lock:
            for item in items:
                self._n += 1
                if len(self._head) < self._in_memory:
                    self._head.append(item)
                else:
                    self._pending.append(item)
                    if len(self._pending) == self._chunk:
                        self._write_pending()

    def _write_pending(self) -> None:
        items, self._pending = self._pending, []
        self._starts.append(self._n - len(items))
        try:
            data = zlib.compress(pickle.dumps(items, protocol=pickle.HIGHEST_PROTOCOL), 1)
        except Exception:  # noqa: BLE001  (whatever pickling raises: the items stay in memory)
            self._places.append(items)
            return
        if self._file is None:
            self._file = tempfile.TemporaryFile(prefix="mlflow_rag_eval_rows_")
            weakref.finalize(self, self._file.close)
        self._file.seek(self._size)
        self._file.write(data)
        self._places.append((self._size, len(data)))
        self._size += len(data)

    def close(self) -> None:
        """Drop the items and delete the file (also done when the sequence is collected)."""
        with self._lock:
            if self._file is not None:
                self._file.close()
            self._head, self._starts, self._places, self._pending = [], [], [], []
            self._n, self._read, self._file, self._size = 0, None, None, 0

    # ------------------------------------------------------------------ reading

    @property
    def spilled(self) -> int:
        """How many items are in the file."""
        with self._lock:
            return sum(self._chunk for place in self._places if isinstance(place, tuple))

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[T, ...]: ...

    def __getitem__(self, index):
        if isinstance(index, slice):
            return tuple(self[i] for i in range(*index.indices(self._n)))
        n = self._n
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError("SpooledSequence index out of range")
        if index < len(self._head):
            return self._head[index]
        with self._lock:
            written = self._starts[-1] + self._chunk if self._starts else len(self._head)
            if index >= written:
                return self._pending[index - written]
            number = bisect.bisect_right(self._starts, index) - 1
            if self._read is None or self._read[0] != number:
                self._read = (number, self._load(number))
            return self._read[1][index - self._starts[number]]

    def _load(self, number: int) -> list[T]:
        place = self._places[number]
        if isinstance(place, list):
            return place
        offset, size = place
        self._file.seek(offset)
        return pickle.loads(zlib.decompress(self._file.read(size)))

    def __iter__(self) -> Iterator[T]:
        yield from self._head
        number = 0
        while True:
            with self._lock:
                if number >= len(self._places):
                    pending = list(self._pending)
                    break
                items = self._load(number)
            yield from items
            number += 1
        yield from pending

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    def __reduce__(self):
        return tuple, (tuple(self),)

    def __repr__(self) -> str:
        return f"SpooledSequence({self._n} items, {self.spilled} in a temporary file)"
