"""Shared by the gate's tests: golden-like predictions on a small corpus, a policy, a fresh
sqlite registry per test, and registered versions evaluated on it.

A plain module (``from gate_support import ...``): tests/gate has no ``__init__.py``, so pytest's
default ``prepend`` import mode puts the folder on ``sys.path``. Its fixtures reach the test
modules that name it in ``pytest_plugins``: registered once, so the session's template store is
created once. It holds no assertion, and says so to pytest (PYTEST_DONT_REWRITE), which
otherwise warns that a plugin imported before it was registered cannot be rewritten.
"""

from __future__ import annotations

import json
import shutil

import mlflow
import pandas as pd
import pytest

N = 15
PASSAGES = [f"Route {i} trains leave platform {i + 2} every {10 + i} minutes." for i in range(N)]
DISTRACTORS = [{"id": "d1", "text": "The station cafe opens at seven in the morning."},
               {"id": "d2", "text": "Lost property is kept at the ticket office."}]
POLICY = {
    "require_metrics": ["faithfulness", "mrr"],
    "min_scored_rows": 10,
    "max_error_rate": 0.05,
    "floors": {"faithfulness/mean": 0.6, "mrr/mean": 0.3},
    "max_regression": {"faithfulness": 0.03, "mrr": 0.05, "ndcg@10": 0.05},
    "calibration": {"required": False},
}


def _wrong(i: int) -> str:
    """An answer whose numbers no context holds: unsupported for the local judge."""
    return f"Route {i} trains leave platform {i + 40} every {90 + i} minutes."


def _predictions(n_bad: int = 0, question_suffix: str = "") -> pd.DataFrame:
    """Static predictions on the golden rows; the first ``n_bad`` rows answer wrongly and rank
    the relevant passage last."""
    rows = []
    for i in range(N):
        relevant = {"id": f"p{i}", "text": PASSAGES[i]}
        bad = i < n_bad
        rows.append({
            "question": f"How often do route {i} trains leave, and from which platform?{question_suffix}",
            "answer": _wrong(i) if bad else PASSAGES[i],
            "contexts": [*DISTRACTORS, relevant] if bad else [relevant, *DISTRACTORS],
            "reference": f"Every {10 + i} minutes, from platform {i + 2}.",
            "relevant_ids": [f"p{i}"],
        })
    return pd.DataFrame(rows)


@pytest.fixture(scope="session")
def _template_db(tmp_path_factory):
    """An initialised empty store, copied per test: creating the schema costs seconds."""
    path = tmp_path_factory.mktemp("gate_store") / "mlflow.db"
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{path}", registry_uri=f"sqlite:///{path}")
    client.search_experiments()
    client.search_registered_models()
    return path


@pytest.fixture
def registry(tmp_path, monkeypatch, _template_db):
    """A fresh sqlite tracking store + model registry (a copy of the template) for each test."""
    shutil.copy(_template_db, tmp_path / "mlflow.db")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_ID", "")
    monkeypatch.delenv("MLFLOW_EXPERIMENT_ID")
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment("tests")
    yield mlflow.MlflowClient()
    if mlflow.active_run():
        mlflow.end_run()
    mlflow.clear_active_model()
    mlflow.set_tracking_uri(None)


def _register(name: str) -> tuple[str, str]:
    """A registered version of a (trivially) logged model: (version, model id)."""
    model = mlflow.create_external_model(name="rag")
    return str(mlflow.register_model(f"models:/{model.model_id}", name).version), model.model_id


def _evaluate(model_id: str, data: pd.DataFrame, judge) -> str:
    with mlflow.start_run() as run:
        mlflow.models.evaluate(data=data, model_type="rag", evaluators="rag", model_id=model_id,
                               evaluator_config={"judge": judge, "metrics": ["faithfulness", "mrr", "ndcg@10", "hit@5"]})
    return run.info.run_id


def _candidate(name: str, data: pd.DataFrame, judge) -> tuple[str, str]:
    version, model_id = _register(name)
    return version, _evaluate(model_id, data, judge)


def _decision_json(client, run_id: str) -> dict:
    return json.loads(mlflow.artifacts.load_text(f"runs:/{run_id}/rag_eval/gate_decision.json"))


def _labelled(flip: bool = False) -> pd.DataFrame:
    """Faithful (label 1) and unfaithful (label 0) answers on the same contexts."""
    rows = []
    for i in range(12):
        rows.append({"answer": PASSAGES[i], "contexts": [PASSAGES[i]], "label": 0 if flip else 1})
        rows.append({"answer": _wrong(i), "contexts": [PASSAGES[i]], "label": 1 if flip else 0})
    return pd.DataFrame(rows)


def _sliced_version(name: str, *, bad_hard: bool, slice_by=("difficulty",)) -> tuple[str, str]:
    """A registered version evaluated on retrieval metrics (no judge) with a ``difficulty``
    column: every third row is hard; ``bad_hard`` ranks the relevant passage last on those."""
    data = _predictions()
    data["difficulty"] = ["hard" if i % 3 == 0 else "easy" for i in range(N)]
    if bad_hard:
        data["contexts"] = [[*DISTRACTORS, c[0]] if i % 3 == 0 else c for i, c in enumerate(data.contexts)]
    version, model_id = _register(name)
    with mlflow.start_run() as run:
        mlflow.models.evaluate(data=data, model_type="rag", evaluators="rag", model_id=model_id,
                               evaluator_config={"metrics": ["mrr", "hit@5"], "slice_by": list(slice_by),
                                                 "log_traces": False})
    return version, run.info.run_id


SLICED_POLICY = {"require_metrics": ["mrr"], "min_scored_rows": 5, "max_error_rate": 0.0,
                 "slice_floors": {"difficulty": {"*": {"mrr/mean": 0.5}, "hard": {"mrr/mean": 0.9}}},
                 "max_regression": {"mrr": 1.0}, "calibration": {"required": False}}
