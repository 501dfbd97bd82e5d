"""The MLflow release range: declared as the compatibility module says, and each difference of
an older release adapted there (the matrix, ``bench/compat.py``, runs the real releases; here the
installed one stands in, with the older behaviour put in front of it where a test needs it)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import tomllib
import warnings
from pathlib import Path
from types import SimpleNamespace

import mlflow
import pandas as pd
import pytest
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException
from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
from mlflow.utils import mlflow_tags
from packaging.requirements import Requirement

from mlflow_rag_eval._util import mlflow_compat
from mlflow_rag_eval._util.mlflow_compat import MlflowReleaseWarning

ROOT = Path(__file__).resolve().parents[2]
ROWS = pd.DataFrame({
    "question": ["How much does a bike ticket cost?", "Do dogs pay?", "Is there wifi?"],
    "answer": ["Bikes travel for 5 euros.", "Dogs travel free.", "Wifi is free."],
    "contexts": [[{"id": "p1", "text": "Bikes travel for 5 euros."}], [{"id": "p2", "text": "Dogs travel free."}],
                 [{"id": "p3", "text": "Wifi is free on all trains."}]],
    "relevant_ids": [["p1"], ["p2"], ["p9"]],
})


@pytest.fixture
def fresh_warnings(monkeypatch):
    """No feature warned about yet in this process."""
    monkeypatch.setattr(mlflow_compat, "_WARNED", set())


def _release_warnings(record) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, MlflowReleaseWarning)]


def test_pyproject_declares_the_supported_range():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = [Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["dev"]]
    mlflows = [r for r in requirements if r.name == "mlflow"]
    assert len(mlflows) == 2  # the base and the dev extra's mlflow[gateway]
    for requirement in mlflows:
        assert str(requirement.specifier) == str(Requirement(f"mlflow{mlflow_compat.SUPPORTED}").specifier)
        assert requirement.specifier.contains("3.4.0") and not requirement.specifier.contains("3.3.2")
        assert requirement.specifier.contains(mlflow_compat.MLFLOW_VERSION)


def test_a_missing_feature_is_warned_about_once_naming_it_and_its_release(fresh_warnings):
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for _ in range(3):
            mlflow_compat.warn_missing("linked gadgets", "3.99.0", "gadgets are logged unlinked")
        mlflow_compat.warn_missing("other gadgets", "3.98.0", "left out")
    messages = _release_warnings(record)
    assert messages == [
        f"MLflow {mlflow_compat.MLFLOW_VERSION} has no linked gadgets (MLflow 3.99.0 and later): "
        "gadgets are logged unlinked",
        f"MLflow {mlflow_compat.MLFLOW_VERSION} has no other gadgets (MLflow 3.98.0 and later): left out",
    ]


def test_the_run_type_tag_on_releases_with_and_without_it(fresh_warnings, monkeypatch):
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        tags = mlflow_compat.evaluation_run_tags()
    assert tags == {mlflow_tags.MLFLOW_RUN_TYPE: mlflow_tags.MLFLOW_RUN_TYPE_GENAI_EVALUATE}  # MLflow's own names
    assert _release_warnings(record) == []

    monkeypatch.setattr(mlflow_compat, "_HAS_RUN_TYPE", False)  # MLflow before 3.11.0
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert mlflow_compat.evaluation_run_tags() == {"mlflow.runType": "genai_evaluate"}
        assert mlflow_compat.evaluation_run_tags() == {"mlflow.runType": "genai_evaluate"}
    (message,) = _release_warnings(record)
    assert "evaluation run type tag (MLflow 3.11.0 and later)" in message


class _Release34Client(MlflowClient):
    """MLflow 3.4.0's ``search_traces`` signature (``experiment_ids``, no ``locations``)."""

    def search_traces(self, experiment_ids, filter_string=None, max_results=100, order_by=None, page_token=None,
                      run_id=None, include_spans=True, model_id=None):
        return super().search_traces(experiment_ids=experiment_ids, filter_string=filter_string,
                                     max_results=max_results, order_by=order_by, page_token=page_token,
                                     run_id=run_id, include_spans=include_spans, model_id=model_id)


def _evaluated_run() -> str:
    with mlflow.start_run() as run:
        mlflow.models.evaluate(data=ROWS, model_type="rag", evaluators="rag",
                               evaluator_config={"metrics": ["mrr", "hit@5"]})
    return run.info.run_id


def test_search_traces_on_either_signature(tracking_uri):
    run_id = _evaluated_run()
    experiment_id = mlflow.get_run(run_id).info.experiment_id
    for client in (MlflowClient(), _Release34Client()):
        traces = mlflow_compat.search_traces(client, experiment_id, run_id=run_id, include_spans=False)
        assert len(traces) == len(ROWS)


def test_traces_fetched_one_by_one_where_no_batch_call_exists(tracking_uri):
    run_id = _evaluated_run()
    client = MlflowClient()
    ids = [t.info.trace_id for t in mlflow_compat.search_traces(client, mlflow.get_run(run_id).info.experiment_id,
                                                                 run_id=run_id)]
    tracing = client._tracing_client
    without_batch = SimpleNamespace(get_trace=tracing.get_trace)  # the TracingClient of MLflow before 3.11.0
    one_by_one = mlflow_compat.batch_get_traces(without_batch, ids)
    assert [t.info.trace_id for t in one_by_one] == ids
    assert [len(t.data.spans) for t in one_by_one] == [2] * len(ids)


def test_a_store_taking_one_trace_per_span_call_gets_every_span(tracking_uri, monkeypatch):
    """SQL and REST stores before 3.12.0 refuse spans of several traces in one log_spans call."""
    calls = []
    original = SqlAlchemyStore.log_spans

    def one_trace_per_call(self, location, spans, *args, **kwargs):
        trace_ids = {span.trace_id for span in spans}
        if len(trace_ids) > 1:
            raise MlflowException(f"All spans must belong to the same trace. Found trace IDs: {trace_ids}")
        calls.append(len(spans))
        return original(self, location, spans, *args, **kwargs)

    monkeypatch.setattr(SqlAlchemyStore, "log_spans", one_trace_per_call)
    run_id = _evaluated_run()
    traces = mlflow_compat.search_traces(MlflowClient(), mlflow.get_run(run_id).info.experiment_id, run_id=run_id)
    assert sorted(len(t.data.spans) for t in traces) == [2] * len(ROWS)
    assert calls == [2] * len(ROWS)


def test_an_evaluator_that_cannot_load_says_why_when_rag_is_asked_for(tmp_path):
    """MLflow only warns when an evaluator's entry point fails to import, then says no evaluator
    could evaluate the model: the rag evaluator loads whatever fails, and names the cause."""
    script = textwrap.dedent(f"""
        import sys
        sys.modules["mlflow_rag_eval.tracking.run_logging"] = None  # an import of the evaluator fails
        import mlflow, pandas as pd
        mlflow.set_tracking_uri("sqlite:///{tmp_path / 'mlflow.db'}")
        data = pd.DataFrame({{"question": ["q"], "answer": ["a"], "contexts": [[{{"id": "p1", "text": "t"}}]]}})
        with mlflow.start_run():
            mlflow.models.evaluate(data=data, predictions="answer", model_type="rag", evaluators="rag")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: the rag evaluator cannot run on MLflow "), last
    assert "mlflow_rag_eval.tracking.run_logging" in last and mlflow_compat.SUPPORTED in last
