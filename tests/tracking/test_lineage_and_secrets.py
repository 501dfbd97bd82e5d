"""An evaluation with an LLM judge over HTTP: its lineage is on the run, its key is nowhere."""

from __future__ import annotations

import json

import mlflow
import pandas as pd
import pytest
from conftest import figures_of

from mlflow_rag_eval.judges import get_judge
from mlflow_rag_eval.judges.cache import JudgeCache
from mlflow_rag_eval.judges.prompts import PROMPTS
from mlflow_rag_eval.testing import FakeJudgeServer

SECRET = "sk-live-MARKER-do-not-store-7f3a"


@pytest.fixture
def server():
    with FakeJudgeServer(model="gpt-4o-mini-2024-07-18") as s:
        yield s


def test_lineage_on_the_run_and_no_key_in_the_store_or_cache(tracking_uri, tmp_path, server, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    cache = JudgeCache(tmp_path / "judge_cache.sqlite")
    judge = get_judge(f"openai:/gpt-4o-mini?base_url={server.base_url}", cache=cache)
    df = pd.DataFrame({
        "question": ["How much does a bike ticket cost?", "Can dogs travel?"],
        "answer": ["A bike ticket costs 5 euros.", "Dogs travel free."],
        "contexts": [["Bikes travel for a flat fare of 5 euros."], ["Dogs travel free."]],
        "reference": ["5 euros.", "Yes."],
    })
    with mlflow.start_run() as run:
        result = mlflow.models.evaluate(
            data=df, model_type="rag", evaluators="rag",
            evaluator_config={"judge": judge, "metrics": ["faithfulness", "context_precision"]},
        )
    assert figures_of(result)["faithfulness/n_error"] == 0
    # The key was really used on the wire...
    assert all(r["headers"]["Authorization"] == f"Bearer {SECRET}" for r in server.requests)

    run_data = mlflow.MlflowClient().get_run(run.info.run_id).data
    assert run_data.params["rag_eval.judge"] == "openai:/gpt-4o-mini"
    lineage = json.load(open(mlflow.artifacts.download_artifacts(
        run_id=run.info.run_id, artifact_path="rag_eval/judge_lineage.json")))
    assert lineage["judge"]["fingerprint"] == run_data.params["rag_eval.judge_fingerprint"]
    assert lineage["judge"]["params"]["base_url"] == server.base_url
    usage = lineage["usage"]
    assert usage["provider_calls"] == 4 and usage["cache_hits"] == 0
    assert usage["models"] == {"gpt-4o-mini-2024-07-18": 4}  # the model the provider reported
    assert usage["tokens_in"] > 0 and usage["cost_usd"] > 0  # priced from the shipped table
    assert {p["id"] for p in lineage["prompts"]} == {"claims_verdicts", "rate_relevance"}
    assert lineage["prompts"][0]["sha256"] == PROMPTS[lineage["prompts"][0]["id"]].sha256
    # The packages that computed the numbers, numpy's forward pass and its tokenizer among them.
    assert all(lineage["versions"][p] for p in ("mlflow-rag-eval", "mlflow", "numpy", "tokenizers"))

    # ...and lands nowhere: not in the tracking store, the artifacts or the judge cache.
    cache.close()
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), f"API key found in {path}"
