"""One promotion at a time (``gate/promotion.py``): two gates started together against a real
``mlflow server`` (sqlite, and PostgreSQL), 20 pairs each; the alias always ends where a
sequential run would put it.

Each pair is a fresh model whose v1 holds ``champion``; v2 is better than v1; v3 answers as v1
does, so it passes against v1 and is refused against v2. Run one after the other, in either
order, the alias ends on v2 (v2 then v3: v3 refused; v3 then v2: v2 passes against v3). Before
the lease, both gates read v1, both passed, and the alias ended on whichever wrote last: on v3,
compared with a champion that was no longer the champion. Now the loser decides nothing (exit 2,
naming the winner) and is gated again, as its caller would.

The evaluations are made once per server; each pair's versions are registered from those runs
(``mv.run_id``), so a pair costs two gate runs, not three evaluations.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import mlflow
import pytest
from gate_support import POLICY, _predictions
from mlflow import MlflowClient

from mlflow_rag_eval.gate import gate
from mlflow_rag_eval.testing import mlflow_server, postgres_server

PAIRS = 20


@pytest.fixture(scope="module")
def sqlite_server(tmp_path_factory):
    with mlflow_server(tmp_path_factory.mktemp("race_sqlite")) as (url, _):
        yield url


@pytest.fixture(scope="module")
def postgresql_server(tmp_path_factory):
    with postgres_server() as database, mlflow_server(tmp_path_factory.mktemp("race_pg"),
                                                      backend_store_uri=database) as (url, _):
        yield url


def _evaluations(local_judge) -> list[str]:
    """Evaluation runs of v1 (4 wrong answers), v2 (none) and v3 (as v1)."""
    runs = []
    for n_bad in (4, 0, 4):
        model_id = mlflow.create_external_model(name="rag").model_id
        with mlflow.start_run() as run:
            mlflow.models.evaluate(data=_predictions(n_bad=n_bad), model_type="rag", evaluators="rag",
                                   model_id=model_id, evaluator_config={
                                       "judge": local_judge, "metrics": ["faithfulness", "mrr", "ndcg@10"],
                                       "log_traces": False})
        runs.append(run.info.run_id)
    return runs


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_two_gates_at_once_end_where_a_sequential_run_would(backend, request, local_judge, monkeypatch):
    url = request.getfixturevalue(f"{backend}_server")
    monkeypatch.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    monkeypatch.delenv("MLFLOW_EXPERIMENT_ID", raising=False)
    mlflow.set_tracking_uri(url)
    try:
        mlflow.set_experiment(f"race-{backend}")
        runs = _evaluations(local_judge)
        client = MlflowClient()
        outcomes = []
        for pair in range(PAIRS):
            name = f"race-{backend}-{pair}"
            client.create_registered_model(name)
            for run_id in runs:
                client.create_model_version(name, f"runs:/{run_id}/model", run_id=run_id)
            client.set_registered_model_alias(name, "champion", "1")
            start = threading.Barrier(2)

            def at_once(version: str, name=name, start=start):
                start.wait()
                return gate(name, version, POLICY, client=MlflowClient())

            with ThreadPoolExecutor(2) as pool:
                decisions = list(pool.map(at_once, ["2", "3"]))
            codes = tuple(d.exit_code for d in decisions)
            outcomes.append(codes)
            passed = [d for d in decisions if d.exit_code == 0]
            if len(passed) == 2:  # legitimate only if one decided after the other had moved the alias
                assert {d.champion_version for d in passed} & {d.candidate_version for d in passed}, codes
            for lost in (d for d in decisions if d.exit_code == 2):
                assert "this decision was not recorded" in lost.reasons[0], lost.reasons
                assert ("another gate is promoting" in lost.reasons[0]
                        or "moved to v" in lost.reasons[0]), lost.reasons
                again = gate(name, lost.candidate_version, POLICY, client=client)
                assert again.exit_code in (0, 1), again.to_text()
            assert str(client.get_model_version_by_alias(name, "champion").version) == "2", (pair, codes)
            assert not client.search_registered_models(f"name = '{name}.rag_eval-promotion-lease'")
        assert any(2 in codes for codes in outcomes), outcomes  # the race was run, not avoided
    finally:
        mlflow.set_tracking_uri(None)
