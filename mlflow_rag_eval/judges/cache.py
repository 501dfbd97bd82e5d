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

A lock held long elsewhere (a ``cache clear`` vacuuming, a sqlite browser with a transaction
open, a process stopped mid-write) must not stall the caller: :meth:`JudgeCache.get` and
:meth:`JudgeCache.put` take a ``wait``, the most seconds to wait for the lock, and raise
:class:`JudgeCacheLocked` past it. Once a bounded wait has run out, later bounded calls only try
briefly (``LOCKED_PROBE_S``) until a write succeeds: the file is known locked, and waiting again
on every row would add up to what the bound was meant to prevent. The bound is for another
process's lock: this process's own threads, queued for the one connection, are waited for up
to the cache's timeout (a reply in hand is stored, not asked for again by the rerun).

A path that can never hold a cache (a directory, a file whose folder cannot be created) is
refused when the :class:`JudgeCache` is made, with :class:`UnusableCachePath`: before any
provider call, rather than as every row's failure.

A damaged cache is never fatal and never silent:

* an entry whose value does not decode (not JSON, not a dict) is deleted with a warning and
  read as a miss, so the judge asks for that reply again;
* a file at the cache path that is not a judge cache (not sqlite at all, sqlite with other
  tables, or sqlite found malformed while in use) is renamed ``<file>.corrupt-<UTC timestamp>``
  (with its ``-wal``/``-shm``) with a warning, and a fresh cache is created in its place. It is
  checked before anything is written: a foreign database is never switched to WAL nor given a
  table.

Inspection never writes: :meth:`JudgeCache.stats` reads through a read-only connection
(sqlite URI ``mode=ro``). It and :meth:`JudgeCache.clear` raise :class:`NotAJudgeCache` for a
file that is not a judge cache, rather than moving or touching it: they are what
``mlflow-rag-eval cache info|clear`` run, on a path a person typed.

Location: ``$MLFLOW_RAG_EVAL_CACHE_DIR/judge_cache.sqlite`` when that variable is set, else the
user cache dir (``platformdirs.user_cache_dir("mlflow-rag-eval")``, or ``$XDG_CACHE_HOME`` /
``~/.cache`` + ``/mlflow-rag-eval`` without platformdirs). Nothing is created before the first
write.
"""

from __future__ import annotations

import functools
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

from mlflow_rag_eval._util.redaction import redact_strings

__all__ = [
    "CACHE_DIR_ENV", "LOCKED_PROBE_S", "DisabledJudgeCache", "JudgeCache", "JudgeCacheLocked", "NotAJudgeCache",
    "UnusableCachePath", "default_cache_path",
]

logger = logging.getLogger(__name__)

CACHE_DIR_ENV = "MLFLOW_RAG_EVAL_CACHE_DIR"
_APP_NAME = "mlflow-rag-eval"
_FILE_NAME = "judge_cache.sqlite"

# Matched against a dict key lower-cased with separators removed ("X-Api-Key" -> "xapikey").
_SECRET_SUBSTRINGS = ("apikey", "authorization", "secret", "password")
# "token" is matched per word instead: as a bare substring it would reject the generation
# param "max_tokens" and a model's "tokenizer", which every key legitimately carries.
_WORD_SPLIT = re.compile(r"[^0-9a-zA-Z]+|(?<=[a-z0-9])(?=[A-Z])")

_TABLE = "judge_cache"
_COLUMNS = ("key", "value", "created_at")

#: Seconds a bounded get/put waits for the lock while the file is known locked (the last
#: bounded wait ran out): enough to get past another process's one-row write (milliseconds),
#: short enough that rows go on uncached at once while a long lock lasts.
LOCKED_PROBE_S = 0.02


class NotAJudgeCache(ValueError):
    """The file at a cache path is not a judge cache; the message says what it is instead."""

    def __init__(self, path: Path, why: str):
        self.path, self.why = path, why
        super().__init__(f"{path} is not a judge cache: {why}")


class UnusableCachePath(NotAJudgeCache):
    """Nothing at a cache path can ever be a judge cache (a directory, a file whose folder
    cannot be created): refused when the cache is made, before any provider call."""

    def __init__(self, path: Path, why: str):
        self.path, self.why = path, why
        ValueError.__init__(self, f"{path} cannot be a judge cache: {why}")


class JudgeCacheLocked(sqlite3.OperationalError):
    """Another connection (most likely another process) holds the cache file's lock past the
    wait a bounded :meth:`JudgeCache.get` or :meth:`JudgeCache.put` allowed."""

    def __init__(self, path: Path, wait: float):
        self.path, self.wait = path, wait
        super().__init__(f"judge cache {path} is locked by another process: no lock within {wait:.2g} s")


def _is_lock_error(exc: sqlite3.Error) -> bool:
    """SQLITE_BUSY or SQLITE_LOCKED (any extended code): another connection holds the lock."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    return "locked" in str(exc)


def _set_busy_timeout(conn: sqlite3.Connection, seconds: float) -> None:
    """How long the next statements wait for another connection's lock: set per operation, as
    a bounded get/put waits less than the cache's timeout on the one shared connection."""
    conn.execute(f"PRAGMA busy_timeout = {int(seconds * 1000)}")


def _why_unusable(path: Path) -> str | None:
    """Why no cache can ever be made at ``path``, or None. Nothing is created: a missing folder
    is fine as long as it can be made (the first write makes it). A file that exists is judged
    when opened (moved aside if it is not a judge cache), not here."""
    if path.is_dir():
        return "it is a directory"
    if path.exists():
        return None if path.is_file() else "it is not a regular file"
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return f"its folder {path.parent} cannot be created: {ancestor} is a file"
    if not os.access(ancestor, os.W_OK | os.X_OK):
        what = "the file" if ancestor == path.parent else f"its folder {path.parent}"
        return f"{what} cannot be created: {ancestor} is not writable"
    return None


def _schema(conn: sqlite3.Connection) -> tuple[bool, str | None]:
    """(has the judge_cache table, why the database is not a judge cache or None).

    An empty database (no table yet: a new file, or one another process is creating) is a
    judge cache. Raises sqlite3.DatabaseError when the file is not sqlite at all.
    """
    tables = sorted(r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
                    if not r[0].startswith("sqlite_"))
    if _TABLE not in tables:
        if not tables:
            return False, None
        shown = ", ".join(tables[:5]) + (f" and {len(tables) - 5} more" if len(tables) > 5 else "")
        return False, f"an sqlite database with other tables ({shown}) and no {_TABLE} table"
    columns = tuple(r[1] for r in conn.execute(f"PRAGMA table_info({_TABLE})"))
    if columns != _COLUMNS:
        return True, f"its {_TABLE} table has columns {list(columns)}, not {list(_COLUMNS)}"
    return True, None


def _not_sqlite(exc: sqlite3.Error) -> bool:
    """A DatabaseError that says the bytes are not a (sound) sqlite database. OperationalError
    (locked, busy, no permission, disk I/O) is about access, not content: it is raised."""
    return isinstance(exc, sqlite3.DatabaseError) and not isinstance(exc, sqlite3.OperationalError)


def _inspect(path: Path, timeout: float) -> int:
    """Entries in the cache file at ``path``, read through a read-only connection.

    Nothing is written: no WAL switch, no table created, no entry dropped.

    Raises:
        NotAJudgeCache: the file is not sqlite, or is sqlite without a judge-cache table.
    """
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=timeout)
    try:
        has_table, problem = _schema(conn)
        if problem:
            raise NotAJudgeCache(path, problem)
        return conn.execute(f"SELECT COUNT(*) FROM {_TABLE}").fetchone()[0] if has_table else 0
    except sqlite3.DatabaseError as exc:
        if not _not_sqlite(exc):
            raise
        raise NotAJudgeCache(path, f"not an sqlite database ({exc})") from None
    finally:
        conn.close()


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


@functools.lru_cache(maxsize=4096)
def _looks_secret(name: str) -> bool:
    squashed = re.sub(r"[^0-9a-z]", "", name.lower())
    if any(s in squashed for s in _SECRET_SUBSTRINGS):
        return True
    # "access_token", "accessToken", "hf_token", "authtoken"; not "max_tokens", "tokenizer".
    return any(w.lower().endswith("token") for w in _WORD_SPLIT.split(name) if w)


def _check_no_secrets(obj: Any, where: str) -> None:
    """Raise ValueError naming the first secret-looking dict key (never its value)."""
    path = _secret_key_path(obj)
    if path is not None:
        raise ValueError(f"{where}{path} looks like a credential; credentials must never be part of "
                         "a cache key or a cached value")


def _secret_key_path(obj: Any) -> str | None:
    """The path (``.name[i].name``) of the first secret-looking dict key in ``obj``, or None; the
    path is spelled only when one is found (this runs on every judge call's key and value)."""
    if isinstance(obj, dict):
        for name, item in obj.items():
            if isinstance(name, str) and _looks_secret(name):
                return f".{name}"
            if isinstance(item, (dict, list, tuple)):
                below = _secret_key_path(item)
                if below is not None:
                    return f".{name}{below}"
    elif isinstance(obj, (list, tuple)):
        for i, item in enumerate(obj):
            if isinstance(item, (dict, list, tuple)):
                below = _secret_key_path(item)
                if below is not None:
                    return f"[{i}]{below}"
    return None


def _check_value(value: Any) -> str:
    if not isinstance(value, dict):
        raise TypeError(f"a cached value is a dict, got {type(value).__name__}")
    for flag in ("error", "refusal"):
        if value.get(flag):
            raise ValueError(f"refusing to cache a value with {flag}={value[flag]!r}: "
                             "failures and refusals must be retried, not replayed")
    _check_no_secrets(value, "value")
    # A cached reply is replayed into every later run: no secret may be kept in one.
    return json.dumps(redact_strings(value), ensure_ascii=False)


class JudgeCache:
    """A key -> JSON-dict store in one sqlite file, shared by processes and threads.

    Args:
        path: the sqlite file; None for :func:`default_cache_path` (read at construction).
        timeout: seconds a read or write waits for another writer before raising (a bounded
            ``wait`` of :meth:`get` and :meth:`put` never exceeds it).

    Raises:
        UnusableCachePath: ``path`` is a directory, or a file whose folder cannot be created.
    """

    enabled = True

    def __init__(self, path: str | os.PathLike | None = None, *, timeout: float = 30.0):
        self._path = Path(path).expanduser() if path is not None else default_cache_path()
        why = _why_unusable(self._path)
        if why is not None:
            raise UnusableCachePath(self._path, why)
        self._timeout = timeout
        self._known_locked = False  # the last bounded wait for the lock ran out
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

    def get(self, key: str, *, wait: float | None = None) -> dict | None:
        """The value stored under ``key``, or None. A missing file is a miss, left uncreated.

        A value that does not decode to a dict is deleted (with a warning) and is a miss.
        ``wait``: the most seconds to wait for another connection's lock (None: the cache's
        ``timeout``); past it :class:`JudgeCacheLocked` is raised (see the module docstring).
        """

        def read(conn: sqlite3.Connection) -> dict | None:
            row = conn.execute("SELECT value FROM judge_cache WHERE key = ?", (key,)).fetchone()
            if row is None:
                return None
            try:
                value = json.loads(row[0])
                if not isinstance(value, dict):
                    raise TypeError(f"a JSON {type(value).__name__}, not an object")
            except (ValueError, TypeError) as exc:  # not JSON, not text, not a dict
                self._drop(conn, key, row[0], exc)
                return None
            return value

        return self._run(read, create=False, wait=wait)

    def put(self, key: str, value: dict, *, wait: float | None = None) -> None:
        """Store ``value`` under ``key``, committed at once (replacing any previous value).

        ``wait``: as for :meth:`get`.

        Raises:
            ValueError: ``value`` has a truthy ``error``/``refusal``, or a credential-like key.
            TypeError: ``value`` is not a JSON-serialisable dict.
            JudgeCacheLocked: no lock within ``wait``.
        """
        text = _check_value(value)
        self._run(lambda conn: conn.execute(
            "INSERT OR REPLACE INTO judge_cache (key, value, created_at) VALUES (?, ?, ?)",
            (key, text, time.time()),
        ), create=True, wait=wait)

    def stats(self) -> dict:
        """``{"path", "entries", "bytes"}``; bytes counts the db, -wal and -shm files.

        Read-only: a file this instance has not opened yet is read through a ``mode=ro``
        connection, so inspecting a path changes nothing in it.

        Raises:
            NotAJudgeCache: the file is not a judge cache (it is left as it is).
        """
        with self._lock:
            if self._conn is not None and os.getpid() == self._pid:  # ours, checked when opened
                _set_busy_timeout(self._conn, self._timeout)
                entries = self._conn.execute("SELECT COUNT(*) FROM judge_cache").fetchone()[0]
            else:
                entries = _inspect(self._path, self._timeout) if self._path.exists() else 0
        return {"path": str(self._path), "entries": entries, "bytes": self._size_on_disk()}

    def clear(self) -> int:
        """Delete every entry and return how many there were; then VACUUM to give space back.

        Raises:
            NotAJudgeCache: the file is not a judge cache; it is refused, not touched.
        """
        with self._lock:
            if not self._path.exists():
                return 0
            if self._conn is None or os.getpid() != self._pid:
                _inspect(self._path, self._timeout)  # refuse a foreign file before opening it to write
            conn = self._connection(create=False)
            if conn is None:
                return 0
            _set_busy_timeout(conn, self._timeout)
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

    def _run(self, op, *, create: bool, wait: float | None = None):
        """``op(connection)`` under the lock; None when the file is missing and not ``create``.

        A file found not to be sound sqlite in use ("database disk image is malformed") is
        moved aside once and ``op`` runs again on a fresh cache: a cache never fails a run.
        With a ``wait``, the in-process lock and then the file's lock are waited for at most
        that long in all (``LOCKED_PROBE_S`` while the file is known locked), then
        JudgeCacheLocked. Only a write (``create``) that succeeds ends the known-locked state:
        in WAL mode reads go on while another process holds the write lock.
        """
        bounded = wait is not None
        wait = max(0.0, min(wait, self._timeout)) if bounded else self._timeout
        if bounded and self._known_locked:
            wait = min(wait, LOCKED_PROBE_S)
        give_up = time.monotonic() + wait
        if not self._acquire(wait if bounded else None):
            raise JudgeCacheLocked(self._path, wait)
        if bounded and time.monotonic() > give_up:  # waited for our own threads: the file may still be free
            give_up = time.monotonic() + LOCKED_PROBE_S
        try:
            for attempt in (1, 2):
                left = wait
                if bounded:  # known locked meanwhile (by the thread we waited for): try briefly
                    left = max(0.0, give_up - time.monotonic())
                    left = min(left, LOCKED_PROBE_S) if self._known_locked else left
                try:
                    conn = self._connection(create=create, wait=left)
                    if conn is None:
                        return None
                    _set_busy_timeout(conn, left)
                    result = op(conn)
                except sqlite3.OperationalError as exc:
                    if bounded and _is_lock_error(exc):
                        self._known_locked = True
                        raise JudgeCacheLocked(self._path, wait) from None
                    raise
                except sqlite3.DatabaseError as exc:
                    if attempt == 2 or not _not_sqlite(exc):
                        raise
                    self._conn = None
                    conn.close()
                    self._move_aside(f"not a sound sqlite database ({exc})")
                    continue
                if create:
                    self._known_locked = False
                return result
        finally:
            self._lock.release()
        return None  # unreachable

    def _acquire(self, wait: float | None) -> bool:
        """This process's lock on the cache's one connection, within ``wait`` (None: no bound).

        A thread of ours holding it longer is itself waiting on the file's lock (bounded), or
        one of many threads of a busy run: while no other process is known to hold the file,
        a bounded wait that ran out goes on, up to the cache's timeout, for the queue moves.
        Giving up there lost replies this process had in hand, and the rerun asked for them
        again (178 of 200,000 with 24 judge threads on one core: ``bench/faults.py``).
        """
        if wait is None:
            return self._lock.acquire()
        if self._lock.acquire(timeout=wait):
            return True
        limit = time.monotonic() + max(0.0, self._timeout - wait)
        while not self._known_locked and (left := limit - time.monotonic()) > 0:
            if self._lock.acquire(timeout=min(0.1, left)):
                return True
        return False

    def _drop(self, conn: sqlite3.Connection, key: str, raw: Any, exc: Exception) -> None:
        """Delete an entry whose value does not decode, if it still holds that value."""
        try:
            conn.execute("DELETE FROM judge_cache WHERE key = ? AND value IS ?", (key, raw))
        except sqlite3.Error as error:  # still a miss; the next put replaces it
            logger.warning("judge cache %s: could not delete an unreadable entry: %s", self._path, error)
        logger.warning("judge cache %s: dropped the entry %s..., whose value does not decode (%s: %s); "
                       "its reply will be asked again", self._path, key[:12], type(exc).__name__, exc)

    def _move_aside(self, why: str, seen: os.stat_result | None = None) -> None:
        """Rename the file at the cache path (and its -wal, -shm) to ``.corrupt-<timestamp>``.

        ``seen``: the file as stat-ed before it was judged; when another process has replaced
        it since (and, most likely, moved the bad one aside itself), the new file is left alone.
        """
        try:
            now = os.stat(self._path)
        except FileNotFoundError:
            return
        if seen is not None and (now.st_ino, now.st_dev) != (seen.st_ino, seen.st_dev):
            return
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        target, n = Path(f"{self._path}.corrupt-{stamp}"), 1
        while target.exists():
            target, n = Path(f"{self._path}.corrupt-{stamp}-{n}"), n + 1
        try:
            os.replace(self._path, target)
        except FileNotFoundError:  # another process moved it first
            return
        for suffix in ("-wal", "-shm", "-journal"):
            try:
                os.replace(f"{self._path}{suffix}", f"{target}{suffix}")
            except FileNotFoundError:
                pass
        logger.warning("judge cache %s cannot be used: %s. Moved it to %s and started a fresh cache; "
                       "replies it held will be asked again", self._path, why, target.name)

    def _size_on_disk(self) -> int:
        files = (self._path, Path(f"{self._path}-wal"), Path(f"{self._path}-shm"))
        return sum(f.stat().st_size for f in files if f.exists())

    def _connection(self, create: bool, wait: float | None = None) -> sqlite3.Connection | None:
        """The open connection, opened on first use (caller holds the lock), waiting at most
        ``wait`` seconds (None: the timeout) for another connection's lock to open it.

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
        wait = self._timeout if wait is None else wait
        deadline = time.monotonic() + wait
        while True:
            try:
                self._conn = self._open(wait)
                return self._conn
            except sqlite3.OperationalError as exc:
                # Switching a new file to WAL can report "locked" without waiting on the busy
                # handler when several processes create it at once; retry until the timeout.
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def _connect(self, wait: float) -> sqlite3.Connection:
        # isolation_level=None: autocommit, so every write is its own short transaction.
        return sqlite3.connect(self._path, timeout=wait, isolation_level=None, check_same_thread=False)

    def _open(self, wait: float) -> sqlite3.Connection:
        # Judge the file before anything writes to it: a foreign database must not be switched
        # to WAL or given a table. Twice at most: after a move, the path holds a new file (ours,
        # or one another process created meanwhile, judged in turn).
        for _ in range(3):
            try:
                seen = os.stat(self._path)
            except FileNotFoundError:
                seen = None
            conn = self._connect(wait)
            try:
                _, problem = _schema(conn)
            except sqlite3.DatabaseError as exc:
                if not _not_sqlite(exc):
                    conn.close()
                    raise
                problem = f"not an sqlite database ({exc})"
            if problem is None:
                break
            conn.close()
            self._move_aside(problem, seen)
        else:
            raise NotAJudgeCache(self._path, "still not a judge cache after being moved aside twice")
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

    def get(self, key: str, *, wait: float | None = None) -> dict | None:
        return None

    def put(self, key: str, value: dict, *, wait: float | None = None) -> None:
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
