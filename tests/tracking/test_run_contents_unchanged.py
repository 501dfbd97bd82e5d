"""A run holds the same rows, traces, Feedback, tables and seals as it did before a change that
was meant only to make it faster (issue 46): the plugin route over the same 8 rows, with an
LLM judge whose replies depend only on the request (the scripted backend) and with the
default local judge, compared with what the code wrote before the speed work (``run_contents/``,
written at e574037 plus this test). A change meant to move a run's contents rewrites them on
purpose: ``RAG_EVAL_WRITE_RUN_CONTENTS=1 pytest tests/tracking/test_run_contents_unchanged.py``,
and the diff of those files is part of its review."""

from __future__ import annotations

import json
import os
from pathlib import Path

import mlflow
import pandas as pd
import pytest
from run_contents import differences, run_contents

from mlflow_rag_eval.evaluation import engine

EXPECTED = Path(__file__).parent / "run_contents"


@pytest.fixture(scope="module")
def rows() -> pd.DataFrame:
    from pipeline import BM25, extract_answer, load_corpus, load_golden

    golden = load_golden()
    golden = pd.concat([golden[golden.answerable].head(6), golden[~golden.answerable].head(2)])
    index = BM25(load_corpus())
    contexts = [[{"id": p["id"], "text": p["text"]} for p, _ in index.search(q, 3)] for q in golden.question]
    return pd.DataFrame({"question": golden.question.tolist(), "reference": golden.reference.tolist(),
                         "relevant_ids": golden.relevant_ids.tolist(), "answerable": golden.answerable.tolist(),
                         "contexts": contexts,
                         "answer": [extract_answer(q, c, 0.34) for q, c in zip(golden.question, contexts)]})


def _evaluate(rows: pd.DataFrame, judge: str) -> dict:
    with mlflow.start_run() as run:
        mlflow.models.evaluate(data=rows, model_type="rag", evaluators="rag",
                               evaluator_config={"judge": judge, "progress": False})
    return run_contents(run.info.run_id)


def _compare(name: str, contents: dict) -> None:
    path = EXPECTED / f"{name}.json"
    if os.environ.get("RAG_EVAL_WRITE_RUN_CONTENTS") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(contents, indent=1, sort_keys=True, ensure_ascii=False) + "\n")
    expected = json.loads(path.read_text())
    found = differences(expected, json.loads(json.dumps(contents)))
    assert not found, f"the run's contents moved in {len(found)} places:\n" + "\n".join(found[:40])


@pytest.mark.parametrize("batch", [engine.STREAMED_BATCH_SIZE, 3], ids=["one batch", "batches of 3"])
def test_a_run_judged_by_an_llm_holds_what_it_held_before(tracking_uri, rows, monkeypatch, tmp_path, batch):
    # The scripted LLM judge: the LLM judge's whole path (prompts, schema, cache, parsing, the
    # embeddings of answer relevancy) with replies that depend only on the request; a loopback
    # server's port would be in the judge's base_url, hence in its fingerprint.
    monkeypatch.setenv("MLFLOW_RAG_EVAL_CACHE_DIR", str(tmp_path))  # every reply asked for, none replayed
    # In batches of 3, the rows' traces are written by the stream while later batches are judged.
    monkeypatch.setattr(engine, "STREAMED_BATCH_SIZE", batch)
    contents = _evaluate(rows, "scripted")
    assert len(contents["traces"]) == len(rows) and contents["traces"][0]["assessments"]
    _compare("llm_judge", contents)


def test_a_run_judged_by_the_local_judge_holds_what_it_held_before(tracking_uri, rows):
    contents = _evaluate(rows, "local:minilm-l6")
    assert len(contents["traces"]) == len(rows) and contents["traces"][0]["assessments"]
    _compare("local_judge", contents)
