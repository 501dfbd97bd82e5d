"""Production traffic against a real ``mlflow server`` (this module's own, on loopback): a traced
pipeline answers 200 requests; ``evaluate --traces --sample 50`` scores 50 of its traces in
place; a rerun scores none; after 20 new requests ``--since-last`` scores exactly those 20; a
``--max-cost`` below the estimate refuses before any judge call. Headless Chromium then shows a
scored production trace with its assessments in the MLflow UI (the screenshot is kept)."""

from __future__ import annotations

import base64
import os
import re
import shutil
import time
from pathlib import Path

import mlflow
import pytest
from browser import FLAGS, DevTools
from browser import chromium as chromium  # noqa: F401  (the fixture)
from click.testing import CliRunner
from conftest import ROOT
from mlflow import MlflowClient
from mlflow.entities import AssessmentSourceType
from pipeline import load_golden, traced_app

from mlflow_rag_eval.cli import main
from mlflow_rag_eval.testing import FakeJudgeServer, mlflow_server

SHOTS = Path(os.environ.get("RAG_EVAL_SCREENSHOTS", ROOT / "build" / "screenshots"))
METRICS = "faithfulness,context_relevance"
EXPERIMENT = "rag-app-production"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with mlflow_server(tmp_path_factory.mktemp("production_server")) as (url, _):
        yield url


@pytest.fixture
def app(server):
    """The example BM25 pipeline instrumented as an app does it, logging to the server."""
    mlflow.set_tracking_uri(server)
    experiment_id = MlflowClient(server).create_experiment(EXPERIMENT)
    answer = traced_app()

    def serve(n: int, offset: int) -> list[str]:
        questions = list(load_golden()["question"])
        ids = []
        with _experiment(experiment_id):
            for i in range(offset, offset + n):
                answer(f"{questions[i % len(questions)]} (request {i})")
                ids.append(mlflow.get_last_active_trace_id())
        mlflow.flush_trace_async_logging()
        return ids

    serve.experiment_id = experiment_id
    yield serve
    mlflow.set_tracking_uri(None)


class _experiment:
    """The app's experiment while it serves, the caller's put back afterwards."""

    def __init__(self, experiment_id: str):
        self.experiment_id, self.saved = experiment_id, None

    def __enter__(self):
        self.saved = os.environ.get("MLFLOW_EXPERIMENT_ID")
        mlflow.set_experiment(experiment_id=self.experiment_id)

    def __exit__(self, *exc):
        if self.saved is None:
            os.environ.pop("MLFLOW_EXPERIMENT_ID", None)
        else:
            os.environ["MLFLOW_EXPERIMENT_ID"] = self.saved


def _evaluate(server: str, *args: str):
    result = CliRunner().invoke(main, ["evaluate", "--traces", EXPERIMENT, "--metrics", METRICS, *args,
                                       "--tracking-uri", server])
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit), result.exc_info
    return result


def _scored(client: MlflowClient, experiment_id: str) -> dict[str, set[str]]:
    """Trace id -> the names of our Feedback on it, for every trace of the experiment."""
    out, token = {}, None
    while True:
        page = client.search_traces(locations=[experiment_id], max_results=100, page_token=token, include_spans=False)
        for t in page:
            out[t.info.trace_id] = {a.name for a in t.info.assessments
                                    if a.feedback is not None and "rag_eval.metric" in (a.metadata or {})}
        token = page.token
        if not token:
            return out


def test_production_traces_scored_in_place_incrementally_within_a_budget(server, app, monkeypatch, chromium,
                                                                          tmp_path):
    client = MlflowClient(server)
    first_ids = app(200, 0)
    assert len(_scored(client, app.experiment_id)) == 200

    # --lag 0: the checkpoint is the newest end time (the default re-reads the last 10 minutes)
    first = _evaluate(server, "--sample", "50", "--lag", "0")
    assert first.exit_code == 0, first.output
    run_id = first.stdout.strip().splitlines()[-1]  # the run id, printed last on stdout
    scored = {t for t, names in _scored(client, app.experiment_id).items() if names}
    assert len(scored) == 50 and scored <= set(first_ids)
    assert all(names == {"faithfulness", "context_relevance"}
               for t, names in _scored(client, app.experiment_id).items() if t in scored)
    run = client.get_run(run_id)
    assert run.data.tags["mlflow.runType"] == "genai_evaluate" and run.data.params["rag_eval.traces.n_scored"] == "50"

    rerun = _evaluate(server, "--sample", "50", "--lag", "0")
    assert rerun.exit_code == 0 and "0 scored in place (no run: nothing to score)" in rerun.output, rerun.output
    assert {t for t, names in _scored(client, app.experiment_id).items() if names} == scored

    new_ids = app(20, 200)
    later = _evaluate(server, "--since-last", "--lag", "0")
    assert later.exit_code == 0, later.output
    assert "traces: 20 read, 20 scored in place" in later.output
    now_scored = {t for t, names in _scored(client, app.experiment_id).items() if names}
    assert now_scored - scored == set(new_ids)

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    with FakeJudgeServer(model="gpt-4o-mini") as judge_server:
        refused = _evaluate(server, "--sample", "50", "--judge",
                            f"openai:/gpt-4o-mini?base_url={judge_server.base_url}", "--max-cost", "0.001")
        assert refused.exit_code == 2, refused.output
        assert re.search(r"at most 100 LLM calls, .* about \$0\.0\d+", refused.output), refused.output
        assert "is above max_cost=$0.001; nothing was judged" in refused.output
        assert judge_server.calls == 0

    _screenshot_a_scored_trace(server, app.experiment_id, sorted(set(new_ids))[0], chromium, tmp_path)


def _screenshot_a_scored_trace(server: str, experiment_id: str, trace_id: str, chromium, tmp_path: Path) -> None:
    """The production trace in the MLflow UI: its spans, and its assessments pane opened (the
    drawer starts with it folded behind an "Assess" button)."""
    trace = MlflowClient(server).get_trace(trace_id)
    feedback = [a for a in trace.info.assessments if a.feedback is not None]
    assert {a.source.source_type for a in feedback} == {AssessmentSourceType.LLM_JUDGE}
    url = f"{server}/#/experiments/{experiment_id}/traces?selectedEvaluationId={trace_id}"
    tools = DevTools(chromium, [*FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1920,1080", url])
    try:
        session = _page_session(tools, server)
        _wait_for(lambda: tools.evaluate(_ASSESS_BUTTON + " != null", session), "the trace drawer's Assess button")
        tools.evaluate(_ASSESS_BUTTON + ".click()", session)
        _wait_for(lambda: "context_relevance" in tools.evaluate("document.body.innerText", session),
                  "the assessments pane")
        time.sleep(1.0)  # its values render after the names
        text = tools.evaluate("document.body.innerText", session)
        png = tools.call("Page.captureScreenshot", {"format": "png"}, session)["data"]
    finally:
        tools.close()
    assert "faithfulness" in text and "retrieve" in text and "rag_app" in text, text[:3000]
    shot = tmp_path / "production_trace.png"
    shot.write_bytes(base64.b64decode(png))
    assert shot.stat().st_size > 20_000
    SHOTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(shot, SHOTS / "production_trace.png")


_ASSESS_BUTTON = "[...document.querySelectorAll('button')].find(b => b.innerText.trim().startsWith('Assess'))"


def _wait_for(check, what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"no {what} within {timeout_s:g} s"
        time.sleep(0.25)


def _page_session(tools, server: str) -> str:
    found: list = []

    def page() -> bool:
        targets = tools.call("Target.getTargets")["targetInfos"]
        found[:] = [t for t in targets if t["type"] == "page" and t["url"].startswith(server)]
        return bool(found)

    _wait_for(page, "page of the MLflow UI")
    return tools.call("Target.attachToTarget", {"targetId": found[0]["targetId"], "flatten": True})["sessionId"]
