"""A judge cache that cannot be used costs the reuse, never the run's time or its rows.

* Locked by another process (a real second process holding ``BEGIN EXCLUSIVE``): each read or
  write waits for the lock a short bound (a read no longer than what is left of the deadline), then
  the row goes on uncached, with its reply, and the judge warns once; not N rows x 30 s.
* A path that can never hold a cache (a directory, a folder that cannot be made) is refused
  when the cache is made, before any provider call.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time

import pandas as pd
import pytest

from mlflow_rag_eval.evaluation.engine import evaluate_records
from mlflow_rag_eval.judges import get_judge
from mlflow_rag_eval.judges.cache import JudgeCache, JudgeCacheLocked, NotAJudgeCache, UnusableCachePath
from mlflow_rag_eval.judges.llm.judge import LLMJudge
from mlflow_rag_eval.judges.providers.scripted import ScriptedBackend
from mlflow_rag_eval.records import records_from_frame
from mlflow_rag_eval.testing import FakeJudgeServer

PASSAGES = ["Bikes travel for a flat fare of 5 euros per journey.", "Dogs travel free on all trains."]
#: What a cache wait cost before it was bounded: sqlite's busy timeout, per write, one at a time.
OLD_WAIT_S = 30.0
LOCK_WARNING = "is locked by another"  # "process" (the cache) or "writer (another process, or ...)" (the judge)

# Holds sqlite's write lock on the file argv[1] until its stdin closes.
HOLDER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
sys.stdin.readline()
conn.rollback()
conn.close()
"""


@contextlib.contextmanager
def locked_by_another_process(path):
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "locked"
        yield
    finally:
        proc.stdin.close()
        proc.wait(30)


def rows(n: int, start: int = 0):
    return records_from_frame(pd.DataFrame({
        "question": [f"Question {i}?" for i in range(start, start + n)],
        "answer": [f"Bikes travel for a flat fare of {i} euros." for i in range(start, start + n)],
        "contexts": [PASSAGES] * n,
    }))


def entries(path) -> int:
    with JudgeCache(path) as cache:
        return cache.stats()["entries"]


@pytest.mark.parametrize("held", ["wal-cache", "new-file"])
def test_a_cache_locked_by_another_process_costs_the_reuse_not_the_time(tmp_path, caplog, held):
    """``wal-cache``: an existing cache (WAL: reads go on, writes wait); ``new-file``: a file
    another process created and holds before any cache opened it (reads wait too)."""
    path = tmp_path / "judge_cache.sqlite"
    if held == "wal-cache":
        with JudgeCache(path) as cache:
            cache.put("another-reply", {"text": "{}"})
    before = entries(path) if held == "wal-cache" else 0
    n, deadline = 4, 3.0
    judge = LLMJudge(ScriptedBackend(), cache=JudgeCache(path), deadline=deadline, concurrency=2)
    with locked_by_another_process(path), caplog.at_level("WARNING"):
        started = time.monotonic()
        result = evaluate_records(rows(n), ["faithfulness"], judge)
        elapsed = time.monotonic() - started
    (metric,) = result.metrics
    assert metric.summary.n_error == 0 and all(r.value is not None for r in metric.rows)  # replies used
    assert judge.usage()["provider_calls"] == n and judge.usage()["cache_hits"] == 0
    # Bounded by the deadline, not n writes x the old 30 s wait; generous for a loaded machine.
    assert elapsed < n * OLD_WAIT_S / 4, elapsed
    warnings = [r.getMessage() for r in caplog.records if LOCK_WARNING in r.getMessage()]
    assert len(warnings) == 1, warnings  # once per judge, not once per row
    assert str(path) in warnings[0] and judge.name in warnings[0]
    # Nothing was stored while it was locked; once free, the same judge stores again.
    assert entries(path) == before
    evaluate_records(rows(n), ["faithfulness"], judge)
    assert judge.usage()["provider_calls"] == 2 * n and entries(path) == before + n
    again = LLMJudge(ScriptedBackend(), cache=JudgeCache(path))
    evaluate_records(rows(n), ["faithfulness"], again)
    assert again.usage()["cache_hits"] == n and again.usage()["provider_calls"] == 0


def test_a_lock_wait_never_outlasts_the_cache_wait_asked(tmp_path):
    """The bound reaches sqlite itself: a put told to wait 0.3 s gives up after about that,
    not the cache's 30 s timeout, and raises an error naming the file and the lock."""
    path = tmp_path / "judge_cache.sqlite"
    cache = JudgeCache(path)
    cache.put("k", {"text": "a"})
    with locked_by_another_process(path):
        started = time.monotonic()
        with pytest.raises(JudgeCacheLocked, match=LOCK_WARNING) as caught:
            cache.put("k2", {"text": "b"}, wait=0.3)
        assert time.monotonic() - started < 5.0
        assert str(path) in str(caught.value)
        assert cache.get("k", wait=0.3) == {"text": "a"}  # WAL: readers are not blocked
    cache.put("k2", {"text": "b"}, wait=0.3)  # free again: stored
    assert cache.get("k2") == {"text": "b"}
    cache.close()


def test_a_reply_waits_out_this_processs_own_writers_and_is_stored(tmp_path):
    """Only another process's lock makes a bounded put give up: a queue of this run's own
    threads moves, so a put told to wait 0.2 s behind a thread of ours holding the connection
    for 0.6 s stores its reply (at 100,000 rows, 178 replies were dropped so and asked again by
    the rerun); behind another process's lock it still gives up within its bound."""
    import threading

    path = tmp_path / "judge_cache.sqlite"
    cache = JudgeCache(path)
    cache.put("k", {"text": "a"})
    held, release = threading.Event(), threading.Event()

    def busy_thread_of_ours():
        with cache._lock:  # what a thread writing for a long while holds
            held.set()
            release.wait(5)

    thread = threading.Thread(target=busy_thread_of_ours)
    thread.start()
    held.wait(5)
    threading.Timer(0.6, release.set).start()
    started = time.monotonic()
    cache.put("k2", {"text": "b"}, wait=0.2)
    assert 0.5 < time.monotonic() - started < 5.0 and cache.get("k2") == {"text": "b"}
    thread.join()
    with locked_by_another_process(path):
        started = time.monotonic()
        with pytest.raises(JudgeCacheLocked):
            cache.put("k3", {"text": "c"}, wait=0.2)
        assert time.monotonic() - started < 5.0
    cache.close()


@pytest.mark.parametrize("where", ["directory", "folder-under-a-file"])
def test_a_path_that_cannot_be_a_cache_is_refused_before_any_call(tmp_path, monkeypatch, where):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    if where == "directory":
        path = tmp_path / "cache_dir"
        path.mkdir()
        why = "it is a directory"
    else:
        (tmp_path / "a_file").write_text("not a folder")
        path = tmp_path / "a_file" / "sub" / "judge_cache.sqlite"
        why = f"{tmp_path / 'a_file'} is a file"
    with FakeJudgeServer() as server:
        with pytest.raises(UnusableCachePath) as caught:
            judge = get_judge(f"openai:/m?base_url={server.base_url}", cache=JudgeCache(path))
            evaluate_records(rows(2), ["faithfulness"], judge)
        assert server.calls == 0
    assert isinstance(caught.value, NotAJudgeCache) and isinstance(caught.value, ValueError)
    assert str(caught.value).startswith(f"{path} cannot be a judge cache: ") and why in str(caught.value)
    assert "\n" not in str(caught.value)


def test_an_unusable_default_cache_place_runs_uncached_with_a_warning(tmp_path, monkeypatch, caplog):
    """Where the user chose no path (a read-only home, a CI container), the judge runs without a
    cache and says so once; a path the user gives that cannot be a cache is refused (above)."""
    from mlflow_rag_eval.judges import get_judge

    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("MLFLOW_RAG_EVAL_CACHE_DIR", str(blocker / "cache"))
    with caplog.at_level("WARNING"):
        judge = get_judge("scripted")
    assert judge.cache.enabled is False
    assert "no reply cache" in caplog.text and "MLFLOW_RAG_EVAL_CACHE_DIR" in caplog.text
