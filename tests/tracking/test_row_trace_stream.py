"""The plugin route writes a finished batch's row traces while the next batches are judged
(issue 46: one ``start_trace`` a row was a third of a 1,000-row evaluation's wall time), and
the run holds what it held when the traces were written after the scoring
(``test_run_contents_unchanged.py`` compares a run in batches of 3 with the recorded one)."""

from __future__ import annotations

import threading
import time

import mlflow
import pandas as pd
import pytest
from mlflow import MlflowClient

from mlflow_rag_eval.evaluation import engine
from mlflow_rag_eval.testing import FakeJudgeServer
from mlflow_rag_eval.tracking import traces
from mlflow_rag_eval.tracking.traces import ROW_METADATA

N_ROWS = 12


@pytest.fixture
def rows() -> pd.DataFrame:
    return pd.DataFrame({
        "question": [f"Question {i}: how long does a refund take?" for i in range(N_ROWS)],
        "answer": [f"Row {i}: a refund takes {i + 3} days." for i in range(N_ROWS)],
        "contexts": [[f"Passage {i}: refunds are paid within {i + 3} days."] for i in range(N_ROWS)],
    })


@pytest.fixture
def streamed_writes(monkeypatch):
    """Each write of row traces with rows in it: (its rows, its thread); ``server["it"]``: the judge."""
    writes, server = [], {}
    real = traces._write_row_traces

    def write(result, new_rows, *args, **kwargs):
        if new_rows:
            writes.append((list(new_rows), threading.current_thread().name))
        return real(result, new_rows, *args, **kwargs)

    monkeypatch.setattr(traces, "_write_row_traces", write)
    monkeypatch.setattr(engine, "STREAMED_BATCH_SIZE", 4)
    return writes, server


def _evaluate(rows, server) -> str:
    with mlflow.start_run() as run:
        mlflow.models.evaluate(data=rows, model_type="rag", evaluators="rag", evaluator_config={
            "judge": f"openai:/fake-judge?base_url={server.base_url}", "metrics": ["faithfulness"],
            "progress": False})
    return run.info.run_id


def _row_traces(run_id: str) -> dict[int, object]:
    found = mlflow.search_traces(run_id=run_id, return_type="list", max_results=100)
    return {int(t.info.trace_metadata[ROW_METADATA]): t for t in found}


def test_a_batchs_traces_are_written_while_the_next_batches_are_judged(tracking_uri, rows, streamed_writes,
                                                                       monkeypatch, tmp_path):
    monkeypatch.setenv("MLFLOW_RAG_EVAL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    writes, server = streamed_writes
    real, judged_meanwhile = traces._write_row_traces, []

    def write(result, new_rows, *args, **kwargs):
        if new_rows and not judged_meanwhile:  # the first batch's write waits (a while at most) for another call
            asked, deadline = server["it"].calls, time.monotonic() + 20
            while server["it"].calls == asked and time.monotonic() < deadline:
                time.sleep(0.01)
            judged_meanwhile.append(server["it"].calls > asked)
        return real(result, new_rows, *args, **kwargs)

    monkeypatch.setattr(traces, "_write_row_traces", write)
    with FakeJudgeServer(latency=0.05, model="fake-judge") as judge:
        server["it"] = judge
        run_id = _evaluate(rows, judge)
    assert judged_meanwhile == [True]  # the judge was asked more while the first batch was being written
    assert [w[0] for w in writes] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]  # each batch once, in order
    assert all(name.startswith("rag_eval_traces") for _, name in writes)
    written = _row_traces(run_id)
    assert sorted(written) == list(range(N_ROWS))
    fingerprint = MlflowClient().get_run(run_id).data.params["rag_eval.judge_fingerprint"]
    for row, trace in written.items():
        (feedback,) = [a for a in trace.info.assessments if a.name == "faithfulness"]
        assert feedback.metadata["rag_eval.judge_fingerprint"] == fingerprint
        assert trace.info.request_preview and f"Question {row}:" in trace.info.request_preview


def test_a_judge_that_becomes_another_mid_run_has_every_trace_written_after_the_run(tracking_uri, rows,
                                                                                   streamed_writes, monkeypatch,
                                                                                   tmp_path):
    monkeypatch.setenv("MLFLOW_RAG_EVAL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    writes, server = streamed_writes
    real = traces._write_row_traces

    def write(result, new_rows, *args, **kwargs):  # after the first batch, the server answers as another model
        out = real(result, new_rows, *args, **kwargs)
        if new_rows:
            server["it"].model = "fake-judge-2"
        return out

    monkeypatch.setattr(traces, "_write_row_traces", write)
    with FakeJudgeServer(latency=0.02, model="fake-judge") as judge:
        server["it"] = judge
        run_id = _evaluate(rows, judge)
    run = MlflowClient().get_run(run_id)
    fingerprint = run.data.params["rag_eval.judge_fingerprint"]
    written = _row_traces(run_id)
    assert sorted(written) == list(range(N_ROWS))  # the streamed traces were deleted, none is there twice
    experiment_traces = mlflow.search_traces(locations=[run.info.experiment_id], return_type="list", max_results=100)
    assert len(experiment_traces) == N_ROWS
    prints = {a.metadata["rag_eval.judge_fingerprint"] for t in written.values() for a in t.info.assessments
              if a.name == "faithfulness"}
    assert prints == {fingerprint}  # every Feedback names the judge the run names
