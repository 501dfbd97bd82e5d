"""The on-disk judge-reply cache: identical re-runs make no provider calls.

An LLM judge stores each provider reply under a key; a re-run with the same inputs reads the
reply back instead of paying for it again, and an interrupted run resumes without repeating the
calls it had finished (every reply is committed as soon as it is stored).

What the caller owes this cache:

* **The key covers everything that changes the answer**: provider, model, base_url, generation
  params (temperature, max_tokens, seed, ...), prompt template id and version, the rendered
  messages and the output schema. Leave one out and two judges get each other's answers (the
  ragas cache keys without the model). :meth:`JudgeCache.make_key` hashes whatever parts it is
  given; choosing them is the caller's job.
* **Errors and refusals are never stored**: a transient failure cached would be replayed forever.
  As a guard, :meth:`JudgeCache.put` refuses a value with a truthy ``"error"`` or ``"refusal"``.
* **No credential goes into a key or a value**: the file is plain sqlite in a user cache dir,
  often copied or shared. As a guard, :meth:`JudgeCache.make_key` and :meth:`JudgeCache.put`
  refuse dict keys that look like secrets (``api_key``, ``authorization``, ``token``,
  ``secret``, ``password``).

The file is sqlite in WAL mode, so several processes and threads may read and write it at once:
each write is one short autocommit ``INSERT OR REPLACE``, and a writer that finds the file
locked waits (``busy_timeout``) rather than failing. A process killed mid-write loses only the
write it was making; WAL recovery restores a consistent file for the next opener.

Location: ``$MLFLOW_RAG_EVAL_CACHE_DIR/judge_cache.sqlite`` when that variable is set, else the
user cache dir (``platformdirs.user_cache_dir("mlflow-rag-eval")``, or ``$XDG_CACHE_HOME`` /
``~/.cache`` + ``/mlflow-rag-eval`` without platformdirs). Nothing is created before the first
write.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["CACHE_DIR_ENV", "DisabledJudgeCache", "JudgeCache", "default_cache_path"]

logger = logging.getLogger(__name__)

CACHE_DIR_ENV = "MLFLOW_RAG_EVAL_CACHE_DIR"
_APP_NAME = "mlflow-rag-eval"
_FILE_NAME = "judge_cache.sqlite"

# Matched against a dict key lower-cased with separators removed ("X-Api-Key" -> "xapikey").
_SECRET_SUBSTRINGS = ("apikey", "authorization", "secret", "password")
# "token" is matched per word instead: as a bare substring it would reject the generation
# param "max_tokens" and a model's "tokenizer", which every key legitimately carries.
_WORD_SPLIT = re.compile(r"[^0-9a-zA-Z]+|(?<=[a-z0-9])(?=[A-Z])")


def default_cache_path() -> Path:
    """Where the cache lives when no path is given (see the module docstring)."""
    env_dir = os.environ.get(CACHE_DIR_ENV)
    if env_dir:
        return Path(env_dir).expanduser() / _FILE_NAME
    try:
        import platformdirs
    except ImportError:
        base = Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / _APP_NAME
    else:
        base = Path(platformdirs.user_cache_dir(_APP_NAME))
    return base / _FILE_NAME


def _looks_secret(name: str) -> bool:
    squashed = re.sub(r"[^0-9a-z]", "", name.lower())
    if any(s in squashed for s in _SECRET_SUBSTRINGS):
        return True
    # "access_token", "accessToken", "hf_token", "authtoken"; not "max_tokens", "tokenizer".
    return any(w.lower().endswith("token") for w in _WORD_SPLIT.split(name) if w)


def _check_no_secrets(obj: Any, where: str) -> None:
    """Raise ValueError naming the first secret-looking dict key (never its value)."""
    if isinstance(obj, dict):
        for name, item in obj.items():
            if isinstance(name, str) and _looks_secret(name):
                raise ValueError(
                    f"{where}.{name} looks like a credential; credentials must never be part of "
                    "a cache key or a cached value"
                )
            _check_no_secrets(item, f"{where}.{name}")
    elif isinstance(obj, (list, tuple)):
        for i, item in enumerate(obj):
            _check_no_secrets(item, f"{where}[{i}]")


def _check_value(value: Any) -> str:
    if not isinstance(value, dict):
        raise TypeError(f"a cached value is a dict, got {type(value).__name__}")
    for flag in ("error", "refusal"):
        if value.get(flag):
            raise ValueError(f"refusing to cache a value with {flag}={value[flag]!r}: "
                             "failures and refusals must be retried, not replayed")
    _check_no_secrets(value, "value")
    return json.dumps(value, ensure_ascii=False)


class JudgeCache:
    """A key -> JSON-dict store in one sqlite file, shared by processes and threads.

    Args:
        path: the sqlite file; None for :func:`default_cache_path` (read at construction).
        timeout: seconds a read or write waits for another writer before raising.
    """

    enabled = True

    def __init__(self, path: str | os.PathLike | None = None, *, timeout: float = 30.0):
        self._path = Path(path).expanduser() if path is not None else default_cache_path()
        self._timeout = timeout
        # One connection per instance behind a lock, rather than one per thread: cache
        # operations take microseconds next to provider calls of seconds, so serialising them
        # in-process costs nothing, and one connection is easy to close (a connection per
        # executor thread would stay open after the thread ends). Processes still write
        # concurrently; sqlite's file locks and busy_timeout arbitrate between them.
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        self._pid = os.getpid()
        self._inherited: list[sqlite3.Connection] = []

    @classmethod
    def disabled(cls) -> DisabledJudgeCache:
        """A cache that never hits and never stores (``cache=False``)."""
        return DisabledJudgeCache()

    @property
    def path(self) -> Path:
        """The sqlite file (it may not exist yet)."""
        return self._path

    @staticmethod
    def make_key(**parts: Any) -> str:
        """sha256 hex of the canonical JSON of ``parts``.

        Canonical: ``sort_keys``, ``separators=(',', ':')``, ``ensure_ascii=False``, so dict
        order never changes the key and any changed value does. Parts must be plain JSON
        (TypeError otherwise; no ``default=str``, whose reprs may hold memory addresses and make
        keys unstable).

        Raises:
            ValueError: a part's name, or any nested dict key, looks like a credential.
        """
        _check_no_secrets(parts, "key")
        canonical = json.dumps(parts, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()

    def get(self, key: str) -> dict | None:
        """The value stored under ``key``, or None. A missing file is a miss, left uncreated."""
        with self._lock:
            conn = self._connection(create=False)
            if conn is None:
                return None
            row = conn.execute("SELECT value FROM judge_cache WHERE key = ?", (key,)).fetchone()
        return None if row is None else json.loads(row[0])

    def put(self, key: str, value: dict) -> None:
        """Store ``value`` under ``key``, committed at once (replacing any previous value).

        Raises:
            ValueError: ``value`` has a truthy ``error``/``refusal``, or a credential-like key.
            TypeError: ``value`` is not a JSON-serialisable dict.
        """
        text = _check_value(value)
        with self._lock:
            conn = self._connection(create=True)
            conn.execute(
                "INSERT OR REPLACE INTO judge_cache (key, value, created_at) VALUES (?, ?, ?)",
                (key, text, time.time()),
            )

    def stats(self) -> dict:
        """``{"path", "entries", "bytes"}``; bytes counts the db, -wal and -shm files."""
        with self._lock:
            conn = self._connection(create=False)
            entries = 0
            if conn is not None:
                entries = conn.execute("SELECT COUNT(*) FROM judge_cache").fetchone()[0]
        return {"path": str(self._path), "entries": entries, "bytes": self._size_on_disk()}

    def clear(self) -> int:
        """Delete every entry and return how many there were; then VACUUM to give space back."""
        with self._lock:
            conn = self._connection(create=False)
            if conn is None:
                return 0
            removed = conn.execute("DELETE FROM judge_cache").rowcount
            try:
                conn.execute("VACUUM")
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.OperationalError as exc:  # another process busy: space comes back later
                logger.warning("judge cache %s cleared but not vacuumed: %s", self._path, exc)
        return removed

    def close(self) -> None:
        """Close the connection; the next call reopens it."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> JudgeCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict:
        # A connection cannot travel to another process; the receiver reopens lazily.
        return {"path": self._path, "timeout": self._timeout}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["path"], timeout=state["timeout"])

    def __repr__(self) -> str:
        return f"JudgeCache({str(self._path)!r})"

    def _size_on_disk(self) -> int:
        files = (self._path, Path(f"{self._path}-wal"), Path(f"{self._path}-shm"))
        return sum(f.stat().st_size for f in files if f.exists())

    def _connection(self, create: bool) -> sqlite3.Connection | None:
        """The open connection, opened on first use (caller holds the lock).

        With ``create=False`` a missing file stays missing and None is returned.
        """
        if os.getpid() != self._pid:
            # Forked: sqlite forbids using a connection across fork(). Keep the inherited one
            # referenced (closing or collecting it could disturb the parent's locks) and reopen.
            if self._conn is not None:
                self._inherited.append(self._conn)
            self._conn, self._pid = None, os.getpid()
        if self._conn is not None:
            return self._conn
        if not create and not self._path.exists():
            return None
        self._path.parent.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + self._timeout
        while True:
            try:
                self._conn = self._open()
                return self._conn
            except sqlite3.OperationalError as exc:
                # Switching a new file to WAL can report "locked" without waiting on the busy
                # handler when several processes create it at once; retry until the timeout.
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def _open(self) -> sqlite3.Connection:
        # isolation_level=None: autocommit, so every write is its own short transaction.
        conn = sqlite3.connect(self._path, timeout=self._timeout, isolation_level=None,
                               check_same_thread=False)
        try:
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if mode.lower() != "wal":  # e.g. a filesystem without shared memory
                logger.warning("judge cache %s runs in %s mode, not WAL: concurrent writers "
                               "will wait on each other", self._path, mode)
            # NORMAL is crash-safe in WAL (a killed process loses nothing committed); only a
            # power loss can drop the last replies, which a cache can afford to re-ask.
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS judge_cache ("
                " key TEXT PRIMARY KEY, value TEXT NOT NULL, created_at REAL NOT NULL)"
            )
        except BaseException:
            conn.close()
            raise
        return conn


class DisabledJudgeCache:
    """The cache API doing nothing: every get misses, every put is dropped, nothing on disk."""

    enabled = False
    make_key = staticmethod(JudgeCache.make_key)

    @property
    def path(self) -> None:
        """No file backs a disabled cache."""
        return None

    def get(self, key: str) -> dict | None:
        return None

    def put(self, key: str, value: dict) -> None:
        _check_value(value)  # same guards, so code tested with cache=False fails the same way

    def stats(self) -> dict:
        return {"path": None, "entries": 0, "bytes": 0}

    def clear(self) -> int:
        return 0

    def close(self) -> None:
        pass

    def __enter__(self) -> DisabledJudgeCache:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def __repr__(self) -> str:
        return "JudgeCache.disabled()"
