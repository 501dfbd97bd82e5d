"""A progress bar for judge work: on a terminal, or when asked; never on a pipe unless asked;
gone before the summary is printed."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from mlflow_rag_eval._util.progress import ENV_VAR, progress_wanted
from mlflow_rag_eval.evaluation.engine import evaluate_records
from mlflow_rag_eval.records import records_from_frame


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_what_was_asked_else_the_environment_else_a_terminal(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert progress_wanted() is False and progress_wanted(True) is True
    monkeypatch.setattr(sys, "stderr", _Terminal())
    assert progress_wanted() is True and progress_wanted(False) is False
    for value, shown in (("0", False), ("off", False), ("1", True), ("TRUE", True)):
        monkeypatch.setenv(ENV_VAR, value)
        assert progress_wanted() is shown
    monkeypatch.setenv(ENV_VAR, "sometimes")
    with pytest.raises(ValueError, match="MLFLOW_RAG_EVAL_PROGRESS='sometimes'"):
        progress_wanted()


ROWS = pd.DataFrame({"question": [f"q{i}" for i in range(30)], "answer": ["A bike ticket costs 5 euros."] * 30,
                     "contexts": [[{"id": "p1", "text": "A bike ticket costs 5 euros."}]] * 30,
                     "relevant_ids": [["p1"]] * 30})


def test_the_bar_counts_rows_times_metrics_on_stderr_and_is_cleared(monkeypatch):
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    evaluate_records(records_from_frame(ROWS), ["mrr", "hit@1"], progress=True)
    shown = terminal.getvalue()
    assert "rag eval" in shown and "/60 [" in shown  # 30 rows x 2 metrics
    assert shown.rstrip(" ").endswith("\r")  # leave=False: the line is blanked, nothing stays behind
    quiet = _Terminal()
    monkeypatch.setattr(sys, "stderr", quiet)
    evaluate_records(records_from_frame(ROWS), ["mrr"], progress=False)
    assert quiet.getvalue() == ""


@pytest.mark.parametrize("flag, shown", [([], True), (["--no-progress"], False)])
def test_the_cli_shows_the_bar_when_asked_and_never_inside_the_summary(flag, shown, tmp_path, monkeypatch):
    path = tmp_path / "rows.jsonl"
    ROWS.to_json(path, orient="records", lines=True)
    env = {"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}", ENV_VAR: "1"}
    cli = Path(sys.executable).with_name("mlflow-rag-eval")
    proc = subprocess.run([str(cli), "evaluate", "--data", str(path), "--metrics", "mrr", *flag],
                          capture_output=True, text=True, timeout=300, env={**os.environ, **env}, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    bar, _, summary = proc.stderr.partition("rag eval summary")
    assert summary, proc.stderr
    assert ("/30 [" in bar) is shown
    assert ("rag eval traces" in bar) is shown  # the rows' traces being written, a bar of their own
    assert "\r" not in summary and "/30 [" not in summary  # the bar ended before the summary began


def test_an_llm_batch_moves_the_bar_row_by_row(monkeypatch):
    """Five rows are one batch: before, the bar jumped 0 -> 5 when the metric returned (an LLM
    evaluation on a CPU server showed nothing for minutes). Now each answered row moves it."""
    from mlflow_rag_eval.evaluation import engine
    from mlflow_rag_eval.judges import get_judge
    from mlflow_rag_eval.testing import FakeJudgeServer

    steps = []

    class Recorded(engine.Progress):
        def advance(self, n, **postfix):
            steps.append(n)

    monkeypatch.setattr(engine, "Progress", Recorded)
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    with FakeJudgeServer(latency=0.05) as server:
        judge = get_judge(f"openai:/gpt-4o-mini?base_url={server.base_url}&concurrency=1", cache=None)
        evaluate_records(records_from_frame(ROWS.head(5)), ["context_relevance"], judge, progress=True)
    assert sum(steps) == 5 and steps[:4] == [1, 1, 1, 1], steps


def test_the_extra_metrics_route_shows_the_bar_on_the_same_rule(monkeypatch, tracking_uri):
    import mlflow

    from mlflow_rag_eval.routes.extra_metrics import rag_metrics

    monkeypatch.delenv(ENV_VAR, raising=False)
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    with mlflow.start_run():
        mlflow.models.evaluate(data=ROWS, predictions="answer", model_type=None, extra_metrics=rag_metrics(["mrr"]))
    assert "rag eval" in terminal.getvalue() and "/30 [" in terminal.getvalue()
    monkeypatch.setenv(ENV_VAR, "0")
    quiet = _Terminal()
    monkeypatch.setattr(sys, "stderr", quiet)
    with mlflow.start_run():
        mlflow.models.evaluate(data=ROWS, predictions="answer", model_type=None, extra_metrics=rag_metrics(["mrr"]))
    assert "rag eval" not in quiet.getvalue()


def test_the_bar_says_what_it_counts_and_shows_judge_calls_only_for_a_judge_that_makes_them(monkeypatch,
                                                                                          local_judge):
    """Issue 37: the bar counted rows x metrics under the unit "row", and showed calls=0,
    cached=0 for the local judge, which calls no provider."""
    from mlflow_rag_eval.evaluation.engine import _Runner
    from mlflow_rag_eval.evaluation.suite import prepare_suite
    from mlflow_rag_eval.judges import get_judge

    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    evaluate_records(records_from_frame(ROWS), ["faithfulness", "mrr"], judge=local_judge, progress=True)
    shown = terminal.getvalue()
    assert "rag eval (30 rows x 2 metrics)" in shown and "/60 [" in shown, shown[-500:]
    assert "score/s" in shown, shown[-500:]  # the unit: one row scored by one metric
    assert "row/s" not in shown and "s/row" not in shown
    # What the bar shows beside the count (read from the runner: a redraw depends on timing).
    fields = {"answer", "contexts", "relevant_ids"}
    local = _Runner(prepare_suite(["faithfulness"], local_judge, fields), 30, progress=False)._activity()
    assert local == {"errors": 0}
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    llm = get_judge("openai:/gpt-4o-mini?base_url=http://127.0.0.1:9/v1", cache=None)
    assert _Runner(prepare_suite(["faithfulness"], llm, fields), 30, progress=False)._activity() == {
        "errors": 0, "calls": 0, "cached": 0}
