"""A library touches no global state of its caller: after every route the root logger's level
and handlers are what the caller set.

Each route runs in a fresh process, so that what it imports lazily (sentence-transformers,
torch) is imported there for the first time, under ``mlflow.evaluate``'s autolog import hooks:
that is when ``mlflow.pytorch`` is imported and calls ``logging.basicConfig(level=ERROR)``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from conftest import ROOT

SETUP = """
import json, logging, sys
import mlflow, pandas as pd
sys.path.insert(0, {pipeline!r})
mlflow.set_tracking_uri({uri!r})
root = logging.getLogger()
root.setLevel(logging.WARNING)  # what the caller chose
before = (root.level, len(root.handlers), logging.root.manager.disable)
rows = pd.DataFrame({{"question": ["How much is a bike ticket?"], "answer": ["A bike ticket costs 5 euros."],
                     "contexts": [[{{"id": "p1", "text": "A bike ticket costs 5 euros."}}]]}})
"""

ROUTES = {
    "evaluator plugin, logged model": """
from pipeline import log_pipeline
with mlflow.start_run():
    info = log_pipeline(k=3)
with mlflow.start_run():
    mlflow.models.evaluate(model=info.model_uri, data=rows[["question"]], model_type="rag", evaluators="rag",
                           evaluator_config={"metrics": ["faithfulness"]})
""",
    "extra_metrics, logged model": """
from pipeline import log_pipeline
from mlflow_rag_eval import rag_metrics
with mlflow.start_run():
    info = log_pipeline(k=3)
with mlflow.start_run():
    mlflow.models.evaluate(model=info.model_uri, data=rows[["question"]], model_type=None, predictions="answer",
                           extra_metrics=rag_metrics(["faithfulness"]))
""",
    "genai scorers": """
from mlflow_rag_eval import rag_scorers
mlflow.genai.evaluate(data=[{"inputs": {"question": q}, "outputs": {"answer": a, "contexts": c}}
                            for q, a, c in rows.itertuples(index=False)], scorers=rag_scorers(["faithfulness"]))
""",
    "evaluate_records": """
from mlflow_rag_eval import evaluate_records, records_from_frame
evaluate_records(records_from_frame(rows), ["faithfulness"], progress=False)
""",
}


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_the_callers_root_logger_is_unchanged_after_the_route(route, tmp_path):
    code = textwrap.dedent(SETUP).format(pipeline=str(ROOT / "examples" / "rag_pipeline"),
                                         uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    code += textwrap.dedent(ROUTES[route])
    code += "\nprint(json.dumps({'before': before, 'after': (root.level, len(root.handlers), "
    code += "logging.root.manager.disable), 'torch': 'torch' in sys.modules}))\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["after"] == seen["before"], (route, seen)
