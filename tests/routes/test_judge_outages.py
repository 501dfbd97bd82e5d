"""Issue 47 through the CLI and the store: a provider that goes away in the middle of a night's
evaluation. A 20 s outage is waited out and every row is scored; one past the outage budget
leaves a logged run holding every row judged before, the rest named, which the same command
run again finishes from the judge cache without asking for any row twice.

The judge is a real ``openai:/`` judge against :class:`~mlflow_rag_eval.testing.faults.FaultyServer`
(loopback), answering with :func:`~mlflow_rag_eval.testing.faults.judge_answer`.
"""

from __future__ import annotations

import re
import time

import mlflow
import pandas as pd
import pytest
from click.testing import CliRunner

from mlflow_rag_eval.cli import main
from mlflow_rag_eval.compare import load_evaluation
from mlflow_rag_eval.testing.faults import FaultMix, FaultyServer

N_ROWS = 40


@pytest.fixture
def rows_file(tmp_path):
    path = tmp_path / "rows.jsonl"
    pd.DataFrame({
        "question": [f"Question {i}: what does a bike ticket cost?" for i in range(N_ROWS)],
        "answer": [f"Row {i}: a bike ticket costs {i} euros." for i in range(N_ROWS)],
        "contexts": [[f"Passage {i}: bike tickets cost {i} euros on every line."] for i in range(N_ROWS)],
    }).to_json(path, orient="records", lines=True)
    return path


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    """A judge cache of the test's own: what a rerun finds is what this test's runs put there."""
    monkeypatch.setenv("MLFLOW_RAG_EVAL_CACHE_DIR", str(tmp_path / "judge-cache"))
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")


def _row_of(request) -> int:
    return int(re.search(r"Row (\d+):", request.prompt).group(1))


def _evaluate(rows_file, server, *options):
    return CliRunner().invoke(main, [
        "evaluate", "--data", str(rows_file), "--metrics", "faithfulness", "--no-progress",
        "--judge", f"openai:/faulty-judge?base_url={server.base_url}", "--concurrency", "4", "--timeout", "5",
        *options])


def test_a_20_s_outage_in_the_middle_is_waited_out_and_every_row_is_scored(tracking_uri, rows_file, own_cache):
    mix = FaultMix(outage_after=15, outage_s=20.0)
    with FaultyServer(mix) as server:
        started = time.monotonic()
        result = _evaluate(rows_file, server)
        took = time.monotonic() - started
    assert result.exit_code == 0, result.output
    assert mix.counts["outage"] >= 1 and 20.0 <= took < 60.0, (mix.counts, took)
    table = load_evaluation(result.stdout.strip().splitlines()[-1]).table
    assert table["faithfulness/error"].isna().all(), table["faithfulness/error"].dropna().tolist()
    assert table["faithfulness/score"].notna().sum() == N_ROWS


def test_an_outage_past_the_budget_logs_what_was_judged_and_a_rerun_finishes_it(tracking_uri, rows_file,
                                                                                  own_cache):
    mix = FaultMix(outage_after=15, outage_s=float("inf"))
    with FaultyServer(mix) as server:
        stopped = _evaluate(rows_file, server, "--outage-budget", "2")
        answered = {_row_of(r) for r in server.requests[:15]}
        mix.outage_s, before = 0.0, server.calls  # the provider is back
        rerun = _evaluate(rows_file, server, "--outage-budget", "2")
        asked_again = [_row_of(r) for r in server.requests[before:]]

    assert stopped.exit_code == 2, stopped.output
    message = stopped.stderr.strip().splitlines()[-1]
    assert re.match(r"evaluation stopped: run [0-9a-f]{32} holds the rows judged, 25 rows not judged: judge "
                    r"'openai:/faulty-judge' stopped answering: no answer for 2 s", message), message
    run_id = re.search(r"run ([0-9a-f]{32})", message).group(1)
    run = mlflow.MlflowClient().get_run(run_id)
    assert run.data.tags["rag_eval.rows_not_judged"] == "25"
    assert "stopped answering" in run.data.tags["rag_eval.stopped"]
    table = load_evaluation(run_id).table
    judged = table[table["faithfulness/error"].isna()]
    assert sorted(_row_of_text(a) for a in judged["answer"]) == sorted(answered)
    assert judged["faithfulness/score"].notna().all()
    assert table["faithfulness/error"].dropna().str.startswith("JudgeStopped: not judged: judge").sum() == 25
    traces = mlflow.search_traces(locations=[run.info.experiment_id], run_id=run_id, return_type="list")
    assert len(traces) == N_ROWS  # every row is in the evaluation's traces, judged or named

    assert rerun.exit_code == 0, rerun.output
    assert sorted(asked_again) == sorted(set(range(N_ROWS)) - answered)  # no call repeated, none missing
    again = load_evaluation(rerun.stdout.strip().splitlines()[-1]).table
    assert again["faithfulness/error"].isna().all()
    first = dict(zip(table["answer"], table["faithfulness/score"]))
    assert all(first[a] == s for a, s in zip(again["answer"], again["faithfulness/score"]) if a in set(judged["answer"]))


def _row_of_text(answer: str) -> int:
    return int(re.match(r"Row (\d+):", answer).group(1))
