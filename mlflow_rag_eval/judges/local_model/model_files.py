"""sha256 of a judge's model files (an embedding model folder, a GGUF file): the lineage and the
judge fingerprint name exactly which weights judged. Hashing gigabytes takes seconds, so each
digest is kept for the process, keyed by every file's path, size and modification time."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Sequence
from pathlib import Path

__all__ = ["files_sha256"]

_DIGESTS: dict[tuple, str] = {}
_LOCK = threading.Lock()


def files_sha256(files: Sequence[Path], root: Path | None = None) -> str:
    """sha256 over ``files`` in order: each file's bytes, preceded by its path relative to
    ``root`` and a NUL when ``root`` is given (a folder's layout is part of the model)."""
    stamp = (str(root.resolve()) if root is not None else None,
             tuple((str(Path(p).resolve()), Path(p).stat().st_size, Path(p).stat().st_mtime_ns) for p in files))
    with _LOCK:
        cached = _DIGESTS.get(stamp)
    if cached:
        return cached
    h = hashlib.sha256()
    for p in files:
        if root is not None:
            h.update(str(Path(p).relative_to(root)).encode())
            h.update(b"\0")
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    digest = h.hexdigest()
    with _LOCK:
        _DIGESTS[stamp] = digest
    return digest
