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


def _store_files_holding(root, secret: str) -> list[str]:
    """The files under ``root`` (the sqlite store and its artifacts) that hold ``secret``."""
    return [str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]


def test_a_key_pasted_into_the_data_is_redacted_in_the_traces_too(tracking_uri, tmp_path, monkeypatch, local_judge):
    """Issue 45: the rows table showed *** but the traces' previews and spans held the key."""
    from click.testing import CliRunner

    from mlflow_rag_eval.cli import main

    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    df = pd.DataFrame({
        "question": [f"Why does {SECRET} fail?", "How much does a bike ticket cost?"],
        "answer": [f"The key {SECRET} was revoked.", "A bike ticket costs 5 euros."],
        "contexts": [[f"Revoked keys: {SECRET}."], ["Bikes travel for a flat fare of 5 euros."]],
        "reference": [f"{SECRET} is revoked.", "5 euros."],
    })
    metrics = ["faithfulness", "context_precision", "answer_correctness"]
    with mlflow.start_run() as run:
        mlflow.models.evaluate(data=df, model_type="rag", evaluators="rag",
                               evaluator_config={"judge": local_judge, "metrics": metrics})
    data = tmp_path / "rows.jsonl"
    data.write_text(df.to_json(orient="records", lines=True))
    cli = CliRunner().invoke(main, ["evaluate", "--data", str(data), "--metrics", ",".join(metrics)])
    assert cli.exit_code == 0, cli.output
    traces = mlflow.search_traces(locations=[run.info.experiment_id], return_type="list")
    assert len(traces) == 4  # two rows, two routes: the store was written, and read back
    first = next(t for t in traces if "fail?" in (t.info.request_preview or ""))
    assert "***" in first.info.request_preview and "***" in first.info.response_preview
    data.unlink()  # the input file holds it, as the user wrote it; nothing else may
    assert _store_files_holding(tmp_path, SECRET) == []
