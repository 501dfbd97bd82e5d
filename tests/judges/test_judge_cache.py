"""The judge-reply cache: keys, guards, concurrent writers, killed writers, CLI."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time

import pandas as pd
import pytest
from click.testing import CliRunner

from mlflow_rag_eval.cli import main
from mlflow_rag_eval.evaluation.engine import evaluate_records
from mlflow_rag_eval.judges.cache import CACHE_DIR_ENV, JudgeCache, NotAJudgeCache
from mlflow_rag_eval.judges.llm.judge import LLMJudge
from mlflow_rag_eval.judges.providers.scripted import ScriptedBackend
from mlflow_rag_eval.records import records_from_frame

BASE_PARTS = {
    "provider": "openai",
    "model": "gpt-4o-mini",
    "base_url": "https://api.openai.com/v1",
    "params": {"temperature": 0.0, "max_tokens": 256, "seed": 7},
    "template_id": "faithfulness",
    "template_version": "2",
    "messages": [
        {"role": "system", "content": "Judge."},
        {"role": "user", "content": "Ünïcode?"},
    ],
    "schema": {"type": "object", "properties": {"verdict": {"type": "boolean"}}},
}


def _integrity(path) -> str:
    with sqlite3.connect(path) as conn:
        return conn.execute("PRAGMA integrity_check").fetchone()[0]


def _journal_mode(path) -> str:
    with sqlite3.connect(path) as conn:
        return conn.execute("PRAGMA journal_mode").fetchone()[0]


# --- workers for the "spawn" processes (module level so the child can import them) ----------


def _writer(path: str, worker: int, n: int, start) -> None:
    """Write ``n`` own entries from two threads, plus the keys every worker shares."""
    start.wait(30)
    cache = JudgeCache(path)

    def write(indices):
        for i in indices:
            cache.put(f"w{worker}-{i}", {"worker": worker, "i": i, "text": "x" * 200})
            if i % 10 == 0:
                cache.put(f"shared-{i}", {"worker": worker, "i": i})

    threads = [threading.Thread(target=write, args=(range(k, n, 2),)) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    cache.close()


def _endless_writer(path: str, done) -> None:
    """Write entries 0, 1, 2, ... forever, publishing how many have been committed."""
    cache = JudgeCache(path)
    i = 0
    while True:
        cache.put(f"k{i}", {"i": i, "text": "y" * 2000})
        i += 1
        done.value = i


# --- keys and guards ------------------------------------------------------------------------


def test_put_get_round_trip(tmp_path):
    cache = JudgeCache(tmp_path / "c.sqlite")
    key = JudgeCache.make_key(**BASE_PARTS)
    assert cache.get(key) is None
    value = {"text": '{"verdict": true}', "model": "gpt-4o-mini", "tokens_in": 12, "refusal": None}
    cache.put(key, value)
    assert cache.get(key) == value
    cache.put(key, {"text": "replaced"})
    assert cache.get(key) == {"text": "replaced"}
    cache.close()
    assert JudgeCache(tmp_path / "c.sqlite").get(key) == {"text": "replaced"}  # persisted


def test_make_key_is_stable_across_dict_order():
    shuffled = {k: BASE_PARTS[k] for k in reversed(list(BASE_PARTS))}
    shuffled["params"] = {"seed": 7, "max_tokens": 256, "temperature": 0.0}
    key = JudgeCache.make_key(**BASE_PARTS)
    assert JudgeCache.make_key(**shuffled) == key
    assert len(key) == 64 and int(key, 16) >= 0


@pytest.mark.parametrize(
    "change",
    [
        {"model": "gpt-4o"},
        {"provider": "endpoints"},
        {"base_url": "http://localhost:8080/v1"},
        {"params": {**BASE_PARTS["params"], "temperature": 0.7}},
        {"params": {**BASE_PARTS["params"], "seed": 8}},
        {"template_version": "3"},
        {"template_id": "relevance"},
        {"messages": [*BASE_PARTS["messages"][:1], {"role": "user", "content": "Unicode?"}]},
        {"schema": {"type": "object", "properties": {"verdict": {"type": "string"}}}},
        {"schema": None},
        {"extra": "anything"},
    ],
    ids=lambda c: next(iter(c)),
)
def test_make_key_changes_with_any_part(change):
    assert JudgeCache.make_key(**{**BASE_PARTS, **change}) != JudgeCache.make_key(**BASE_PARTS)


@pytest.mark.parametrize(
    "parts",
    [
        {"params": {"api_key": "sk-abc"}},
        {"api_key": "sk-abc"},
        {"headers": {"Authorization": "Bearer sk-abc"}},
        {"headers": [{"X-Api-Key": "abc"}]},
        {"identity": {"nested": {"hf_token": "hf_abc"}}},
        {"identity": {"accessToken": "abc"}},
        {"client_secret": "abc"},
        {"db": {"PASSWORD": "abc"}},
    ],
)
def test_make_key_refuses_secret_names(parts):
    with pytest.raises(ValueError, match="credential"):
        JudgeCache.make_key(**parts)


def test_make_key_allows_token_counts_and_tokenizers():
    JudgeCache.make_key(params={"max_tokens": 10, "maxTokens": 10}, identity={"tokenizer": "bpe"})


def test_make_key_refuses_non_json():
    with pytest.raises(TypeError):
        JudgeCache.make_key(params={"obj": object()})


@pytest.mark.parametrize(
    "value, error",
    [
        ({"error": "timeout"}, ValueError),
        ({"text": "", "refusal": "I can't help with that"}, ValueError),
        ({"text": "ok", "request": {"headers": {"Authorization": "Bearer x"}}}, ValueError),
        ("not a dict", TypeError),
    ],
)
def test_put_refuses_failures_secrets_and_non_dicts(tmp_path, value, error):
    cache = JudgeCache(tmp_path / "c.sqlite")
    with pytest.raises(error):
        cache.put("k", value)
    assert cache.stats()["entries"] == 0
    cache.put("k", {"text": "ok", "error": None})  # a falsy error is fine


# --- concurrency and crashes ----------------------------------------------------------------


def test_threads_share_one_cache(tmp_path):
    cache = JudgeCache(tmp_path / "c.sqlite")

    def write(t):
        for i in range(100):
            cache.put(f"t{t}-{i}", {"t": t, "i": i})
            assert cache.get(f"t{t}-{i}") == {"t": t, "i": i}

    threads = [threading.Thread(target=write, args=(t,)) for t in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert cache.stats()["entries"] == 600
    cache.close()


def test_processes_and_threads_write_at_once(tmp_path):
    path = str(tmp_path / "shared.sqlite")
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Event()
    n, workers = 300, 4
    procs = [ctx.Process(target=_writer, args=(path, w, n, start)) for w in range(workers)]
    for p in procs:
        p.start()
    start.set()  # all writers begin together, racing to create the file and switch it to WAL
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * workers

    cache = JudgeCache(path)
    for w in range(workers):
        for i in range(n):
            assert cache.get(f"w{w}-{i}") == {"worker": w, "i": i, "text": "x" * 200}
    for i in range(0, n, 10):
        assert cache.get(f"shared-{i}")["i"] == i
    assert cache.stats()["entries"] == workers * n + n // 10
    cache.close()
    assert _integrity(path) == "ok"
    assert _journal_mode(path) == "wal"


def test_killed_writer_keeps_committed_entries(tmp_path):
    path = str(tmp_path / "killed.sqlite")
    ctx = multiprocessing.get_context("spawn")
    done = ctx.Value("i", 0)
    proc = ctx.Process(target=_endless_writer, args=(path, done))
    proc.start()
    deadline = time.monotonic() + 30
    while done.value < 300 and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)  # no cleanup, most likely in the middle of a put
    proc.join(10)
    committed = done.value
    assert proc.exitcode == -signal.SIGKILL and committed >= 300

    cache = JudgeCache(path)
    for i in range(committed):
        assert cache.get(f"k{i}") == {"i": i, "text": "y" * 2000}
    assert cache.stats()["entries"] in (committed, committed + 1)  # +1: killed after commit
    cache.put("after", {"text": "resumed"})  # the file is writable again
    cache.close()
    assert _integrity(path) == "ok"


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="no fork")
def test_forked_child_reopens_its_own_connection(tmp_path):
    cache = JudgeCache(tmp_path / "c.sqlite")
    cache.put("parent", {"v": 1})  # the connection is open when we fork
    proc = multiprocessing.get_context("fork").Process(
        target=lambda: cache.put("child", {"v": 2}) or cache.close()
    )
    proc.start()
    proc.join(30)
    assert proc.exitcode == 0
    assert cache.get("child") == {"v": 2} and cache.get("parent") == {"v": 1}
    cache.close()
    assert _integrity(tmp_path / "c.sqlite") == "ok"


# --- stats, clear, disabled, location -------------------------------------------------------


def test_stats_and_clear(tmp_path):
    cache = JudgeCache(tmp_path / "c.sqlite")
    for i in range(50):
        cache.put(f"k{i}", {"text": "z" * 1000})
    stats = cache.stats()
    assert stats["path"] == str(tmp_path / "c.sqlite")
    assert stats["entries"] == 50 and stats["bytes"] > 50_000
    assert cache.clear() == 50
    assert cache.get("k0") is None
    after = cache.stats()
    assert after["entries"] == 0 and after["bytes"] < stats["bytes"]
    assert cache.clear() == 0
    cache.close()


def test_missing_file_is_empty_and_stays_missing(tmp_path):
    cache = JudgeCache(tmp_path / "no" / "c.sqlite")
    assert cache.get("k") is None
    assert cache.stats() == {"path": str(tmp_path / "no" / "c.sqlite"), "entries": 0, "bytes": 0}
    assert cache.clear() == 0
    assert not (tmp_path / "no").exists()


def test_disabled_cache_never_stores():
    cache = JudgeCache.disabled()
    assert not cache.enabled and cache.path is None
    key = cache.make_key(**BASE_PARTS)
    assert key == JudgeCache.make_key(**BASE_PARTS)
    cache.put(key, {"text": "ok"})
    assert cache.get(key) is None
    assert cache.stats()["entries"] == 0 and cache.clear() == 0
    with pytest.raises(ValueError):
        cache.put(key, {"error": "boom"})
    cache.close()


def test_default_location_honours_env_and_is_created_on_first_put(tmp_path, monkeypatch):
    cache_dir = tmp_path / "deep" / "cache"
    monkeypatch.setenv(CACHE_DIR_ENV, str(cache_dir))
    cache = JudgeCache()
    assert cache.path == cache_dir / "judge_cache.sqlite"
    assert cache.get("k") is None and cache.stats()["entries"] == 0
    assert not (tmp_path / "deep").exists()
    cache.put("k", {"text": "ok"})
    assert cache.path.is_file() and cache.get("k") == {"text": "ok"}
    cache.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="XDG layout is Linux's")
def test_default_location_without_env_follows_xdg(tmp_path, monkeypatch):
    monkeypatch.delenv(CACHE_DIR_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    cache = JudgeCache()
    assert cache.path == tmp_path / "xdg" / "mlflow-rag-eval" / "judge_cache.sqlite"
    assert not (tmp_path / "xdg").exists()


# --- damaged caches: never fatal, never silent --------------------------------------------

GARBAGE = b"this is not an sqlite database\n" * 200
PASSAGES = ["Bikes travel for a flat fare of 5 euros per journey.", "Dogs travel free on all trains."]


def _set_raw(path, key, raw) -> None:
    """Overwrite one entry's stored value behind the cache's back (another writer, a bad disk)."""
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE judge_cache SET value = ? WHERE key = ?", (raw, key))


def _rows(path) -> int:
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT COUNT(*) FROM judge_cache").fetchone()[0]


def _moved_aside(path) -> list:
    return sorted(path.parent.glob(f"{path.name}.corrupt-*"))


@pytest.mark.parametrize("raw", ["{not json", "[1, 2]", "null", b"\xff\xfe\x00", 42],
                         ids=["not-json", "a-list", "null", "not-utf8", "a-number"])
def test_a_value_that_does_not_decode_is_dropped_and_read_as_a_miss(tmp_path, caplog, raw):
    path = tmp_path / "c.sqlite"
    with JudgeCache(path) as cache:
        cache.put("bad", {"text": "ok"})
        cache.put("good", {"text": "fine"})
    _set_raw(path, "bad", raw)
    cache = JudgeCache(path)
    with caplog.at_level("WARNING", logger="mlflow_rag_eval.judges.cache"):
        assert cache.get("bad") is None
    assert "does not decode" in caplog.text and "asked again" in caplog.text
    assert cache.get("good") == {"text": "fine"}  # the other entries are untouched
    assert _rows(path) == 1  # the bad entry is gone, not re-read (and re-warned) on every run
    cache.put("bad", {"text": "refetched"})
    assert cache.get("bad") == {"text": "refetched"}
    cache.close()


@pytest.mark.parametrize("content", ["garbage", "foreign-sqlite", "wrong-columns"])
def test_a_file_that_is_not_a_judge_cache_is_moved_aside_and_replaced(tmp_path, caplog, content):
    path = tmp_path / "c.sqlite"
    if content == "garbage":
        path.write_bytes(GARBAGE)
    else:
        conn = sqlite3.connect(path)
        table = "experiments (id INTEGER, name TEXT)" if content == "foreign-sqlite" else "judge_cache (k TEXT, v TEXT)"
        conn.execute(f"CREATE TABLE {table}")
        conn.commit()
        conn.close()
    before = path.read_bytes()
    cache = JudgeCache(path)
    with caplog.at_level("WARNING", logger="mlflow_rag_eval.judges.cache"):
        assert cache.get("k") is None  # a miss, not an error
    (aside,) = _moved_aside(path)
    assert aside.read_bytes() == before  # kept as it was, for whoever wants to look at it
    assert f"Moved it to {aside.name}" in caplog.text and "cannot be used" in caplog.text
    cache.put("k", {"text": "ok"})
    assert cache.get("k") == {"text": "ok"} and cache.stats()["entries"] == 1
    cache.close()
    assert _integrity(path) == "ok" and _journal_mode(path) == "wal"


def test_a_file_malformed_while_in_use_is_moved_aside(tmp_path, caplog):
    path = tmp_path / "c.sqlite"
    with JudgeCache(path) as cache:
        for i in range(300):
            cache.put(f"k{i}", {"text": "z" * 1500})
    with open(path, "r+b") as f:  # pages past the schema overwritten: opens, fails on reading
        f.seek(3 * 4096)
        f.write(os.urandom(path.stat().st_size - 3 * 4096))
    cache = JudgeCache(path)
    with caplog.at_level("WARNING", logger="mlflow_rag_eval.judges.cache"):
        assert cache.get("k250") is None
    assert "malformed" in caplog.text and len(_moved_aside(path)) == 1
    cache.put("k250", {"text": "again"})
    assert cache.get("k250") == {"text": "again"}
    cache.close()
    assert _integrity(path) == "ok"


def _faithfulness_rows():
    return records_from_frame(pd.DataFrame({
        "question": ["How much do bikes cost?", "Can dogs travel?", "Can cats fly?"],
        "answer": ["Bikes travel for a flat fare of 5 euros.", "Dogs travel free on all trains.",
                   "Cats fly for 3 euros."],
        "contexts": [PASSAGES] * 3,
    }))


def _scripted(path) -> LLMJudge:
    return LLMJudge(ScriptedBackend(), cache=JudgeCache(path))


def test_a_judge_reasks_a_corrupt_row_and_scores_it(tmp_path, caplog):
    path = tmp_path / "c.sqlite"
    first = _scripted(path)
    clean = evaluate_records(_faithfulness_rows(), ["faithfulness"], first)
    assert first.usage()["provider_calls"] == 3
    first.cache.close()
    with sqlite3.connect(path) as conn:
        (key,) = conn.execute("SELECT key FROM judge_cache ORDER BY created_at LIMIT 1").fetchone()
    _set_raw(path, key, "{truncated")

    again = _scripted(path)
    with caplog.at_level("WARNING", logger="mlflow_rag_eval.judges.cache"):
        rerun = evaluate_records(_faithfulness_rows(), ["faithfulness"], again)
    (metric,) = rerun.metrics
    assert [r.value for r in metric.rows] == [r.value for r in clean.metrics[0].rows] == [1.0, 1.0, 0.0]
    assert metric.summary.n_error == 0
    assert again.usage()["cache_hits"] == 2 and again.usage()["provider_calls"] == 1  # only it re-asked
    assert "does not decode" in caplog.text
    third = _scripted(path)
    evaluate_records(_faithfulness_rows(), ["faithfulness"], third)
    assert third.usage()["cache_hits"] == 3 and third.usage()["provider_calls"] == 0  # stored again


def test_a_judge_on_a_garbage_cache_file_scores_every_row(tmp_path, caplog):
    path = tmp_path / "c.sqlite"
    path.write_bytes(GARBAGE)
    judge = _scripted(path)
    with caplog.at_level("WARNING", logger="mlflow_rag_eval.judges.cache"):
        result = evaluate_records(_faithfulness_rows(), ["faithfulness"], judge)
    (metric,) = result.metrics
    assert metric.summary.n_error == 0 and [r.value for r in metric.rows] == [1.0, 1.0, 0.0]
    assert judge.usage()["provider_calls"] == 3 and "cannot be used" in caplog.text
    assert caplog.text.count("cannot be used") == 1  # moved once, not once per row
    (aside,) = _moved_aside(path)
    assert aside.read_bytes() == GARBAGE
    judge.cache.close()
    again = _scripted(path)
    evaluate_records(_faithfulness_rows(), ["faithfulness"], again)
    assert again.usage()["cache_hits"] == 3


def test_stats_and_clear_refuse_a_file_that_is_not_a_judge_cache(tmp_path):
    path = tmp_path / "c.sqlite"
    path.write_bytes(GARBAGE)
    cache = JudgeCache(path)
    with pytest.raises(NotAJudgeCache, match="not an sqlite database"):
        cache.stats()
    with pytest.raises(NotAJudgeCache, match="not an sqlite database"):
        cache.clear()
    assert path.read_bytes() == GARBAGE and not _moved_aside(path)


# --- CLI ------------------------------------------------------------------------------------


def test_cli_info_and_clear(tmp_path):
    path = tmp_path / "cli.sqlite"
    runner = CliRunner()

    result = runner.invoke(main, ["cache", "info", "--path", str(path)])
    assert result.exit_code == 0, result.output
    assert "not created yet" in result.output and "entries: 0" in result.output
    assert not path.exists()

    with JudgeCache(path) as cache:
        for i in range(3):
            cache.put(f"k{i}", {"text": "ok"})
    result = runner.invoke(main, ["cache", "info", "--path", str(path)])
    assert result.exit_code == 0, result.output
    assert str(path) in result.output and "entries: 3" in result.output
    assert "KiB" in result.output

    result = runner.invoke(main, ["cache", "clear", "--path", str(path)], input="n\n")
    assert result.exit_code != 0 and JudgeCache(path).stats()["entries"] == 3  # declined

    result = runner.invoke(main, ["cache", "clear", "--path", str(path), "--yes"])
    assert result.exit_code == 0, result.output
    assert "Removed 3 entries" in result.output
    assert JudgeCache(path).stats()["entries"] == 0


def test_cli_import_is_light():
    code = (
        "import sys, mlflow_rag_eval.cli; "
        "heavy = [m for m in ('torch', 'sentence_transformers', 'mlflow') if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def _mlflow_db(path):
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{path}")
    client.create_experiment("kept-as-it-is")
    return path


def _snapshot(path):
    return path.read_bytes(), path.stat().st_mtime_ns, sorted(p.name for p in path.parent.iterdir())


@pytest.mark.parametrize("command", [["info"], ["clear", "--yes"], ["clear"]])
def test_cli_refuses_an_mlflow_database_and_leaves_it_untouched(tmp_path, command):
    path = _mlflow_db(tmp_path / "mlflow.db")
    with sqlite3.connect(path) as conn:
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert mode != "wal" and "judge_cache" not in tables
    before = _snapshot(path)
    time.sleep(0.01)  # an mtime written now would differ
    result = CliRunner().invoke(main, ["cache", *command, "--path", str(path)], input="y\n")
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "is not a judge cache" in lines[0] and "alembic_version" in lines[0], lines
    assert "Traceback" not in result.output
    assert _snapshot(path) == before  # same bytes, same mtime, no -wal/-shm/-journal beside it
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == mode


@pytest.mark.parametrize("command", [["info"], ["clear", "--yes"]])
def test_cli_refuses_a_garbage_file(tmp_path, command):
    path = tmp_path / "c.sqlite"
    path.write_bytes(GARBAGE)
    result = CliRunner().invoke(main, ["cache", *command, "--path", str(path)])
    assert result.exit_code == 2 and "not an sqlite database" in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert path.read_bytes() == GARBAGE and not _moved_aside(path)


def test_cli_info_writes_nothing_to_a_judge_cache(tmp_path):
    path = tmp_path / "c.sqlite"
    with JudgeCache(path) as cache:
        cache.put("k", {"text": "ok"})
    before = path.read_bytes(), path.stat().st_mtime_ns
    result = CliRunner().invoke(main, ["cache", "info", "--path", str(path)])
    assert result.exit_code == 0 and "entries: 1" in result.output
    assert (path.read_bytes(), path.stat().st_mtime_ns) == before
