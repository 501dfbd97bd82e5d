"""What a user sees in the MLflow UI after ``make demo``: the two quickstart runs on the
experiment's Evaluation runs page, a run's rows with their metric assessments, and the two runs
compared row by row — read from a real ``mlflow server`` by headless Chromium.

The screenshots go to ``$RAG_EVAL_SCREENSHOTS`` (default ``build/screenshots``) for a person to
look at; the assertions read the rendered DOM.
"""

from __future__ import annotations

import html
import os
import re
from pathlib import Path

import pytest
from browser import chromium as chromium  # noqa: F401  (the fixture)
from browser import render
from conftest import ROOT

from mlflow_rag_eval.keys import metric_key
from mlflow_rag_eval.testing import mlflow_server

SHOTS = Path(os.environ.get("RAG_EVAL_SCREENSHOTS", ROOT / "build" / "screenshots"))


@pytest.fixture(scope="module")
def ui(demo, tmp_path_factory):
    """The demo's store behind ``mlflow server --workers 1`` on loopback."""
    with mlflow_server(tmp_path_factory.mktemp("ui_server"), backend_store_uri=demo.uri) as (url, _):
        yield url


def _text(dom: str) -> str:
    dom = re.sub(r"<(script|style)\b.*?</\1>", " ", dom, flags=re.S)
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", dom)))


def _page(chromium, url: str, name: str, tmp_path: Path) -> str:
    SHOTS.mkdir(parents=True, exist_ok=True)
    shot = SHOTS / f"{name}.png"
    shot.unlink(missing_ok=True)
    text = _text(render(chromium, url, tmp_path / f"profile-{name}", screenshot=shot, window="1920,1080"))
    _assert_not_blank(shot)
    return text


def _assert_not_blank(shot: Path) -> None:
    from PIL import Image

    assert shot.exists() and shot.stat().st_size > 20_000, shot
    with Image.open(shot) as img:
        assert img.size == (1920, 1080)
        colours = img.convert("RGB").getcolors(maxcolors=1 << 16)
    assert colours is None or len(colours) > 100, f"{shot} looks blank"


def _names(demo) -> dict[str, str]:
    from mlflow import MlflowClient

    client = MlflowClient(demo.uri)
    return {run_id: client.get_run(run_id).info.run_name for run_id, _ in demo.runs.values()}


def test_evaluation_runs_page_lists_both_demo_runs(ui, demo, chromium, tmp_path):
    text = _page(chromium, f"{ui}/#/experiments/{demo.experiment_id}/evaluation-runs", "evaluation_runs", tmp_path)
    names = _names(demo)
    assert sorted(names.values()) == ["bm25-top5-extractive", "bm25-top5-overconfident"]
    # the golden set is an evaluation dataset, not a run: only the evaluations are listed
    assert "golden set" not in text
    listed = re.search(r"Run Name Status Type Created at (.*)", text)
    assert listed, text[:2000]
    for name in names.values():
        assert re.search(rf"\b{name}\b Eval\b", listed.group(1)), (name, listed.group(1)[:500])
    assert "Evaluate and improve the quality" not in text  # the page's empty state


def test_a_run_shows_its_rows_with_metric_assessments(ui, demo, chromium, tmp_path):
    from mlflow import MlflowClient

    (run_id, metrics), _ = demo.runs.values()
    text = _page(chromium, f"{ui}/#/experiments/{demo.experiment_id}/runs/{run_id}/traces", "run_evaluation",
                 tmp_path)
    assert f"{demo.n_rows} of {demo.n_rows}" in text  # every golden row is a trace of the run
    # Every metric of the run is an assessment of its rows (the table shows a few by default),
    # the three expectations too.
    names = MlflowClient(demo.uri).get_run(run_id).data.params["rag_eval.metrics"].split(",")
    assert re.search(rf"Assessments \(\d+/{len(names)}\)", text) and "Expectations (3/3)" in text, text[:3000]
    keys = [metric_key(name) for name in names]
    shown = {key: float(m.group(1)) for key in keys if (m := re.search(rf"\b{key} AVG ([0-9.]+)", text))}
    assert len(shown) >= 2, text[:3000]
    for key, average in shown.items():  # each shown with the run's average of the rows' values
        assert average == pytest.approx(metrics[f"{key}/mean"], abs=0.006), key
    traces = MlflowClient(demo.uri).search_traces(locations=[demo.experiment_id], run_id=run_id, max_results=500,
                                                  include_spans=False)
    visible = [t.info.trace_id for t in traces if t.info.trace_id in text]
    assert len(visible) >= 5, "the rows on screen are the run's traces"


def test_the_two_runs_compared_row_by_row(ui, demo, chromium, tmp_path):
    (run_a, _), (run_b, _) = demo.runs.values()
    names = _names(demo)
    url = f"{ui}/#/experiments/{demo.experiment_id}/evaluation-runs?selectedRunUuid={run_b}&compareToRunUuid={run_a}"
    text = _page(chromium, url, "runs_compared", tmp_path)
    colour = r"(?:#[0-9a-f]{6} )?"  # each run's colour swatch
    assert re.search(rf"Comparing {colour}{names[run_b]} to {colour}{names[run_a]}", text), text[:3000]
    assert f"{demo.n_rows} of {demo.n_rows}" in text
    # Rows pair on the question: each question appears once, with a trace of each run.
    first_question = re.search(r'\{ "question": "([^"]+)" \}', text)
    assert first_question and text.count(f'"question": "{first_question.group(1)}"') == 1


def test_the_golden_set_is_on_the_datasets_page(ui, demo, chromium, tmp_path):
    text = _page(chromium, f"{ui}/#/experiments/{demo.experiment_id}/datasets", "datasets", tmp_path)
    assert "northwind-generated" in text, text[:3000]
