"""log_evaluation makes a few bulk MLflow client calls, the same few for 100 rows as for 10,000,
plus, per row, the one call MLflow has for a trace: ``start_trace``, carrying all its assessments.

Not timed (``bench/log_evaluation.py`` times it): a call per row would show up here as a count that
grows with the rows, whatever the machine's speed.
"""

from __future__ import annotations

import functools
import inspect
from collections import Counter

import mlflow
from conftest import figures_of
from mlflow import MlflowClient
from mlflow.tracing.client import TracingClient

from mlflow_rag_eval.evaluation.engine import evaluate_records
from mlflow_rag_eval.records import Context, RagRecord
from mlflow_rag_eval.tracking.run_logging import TABLE_FILE, log_evaluation
from mlflow_rag_eval.tracking.traces import LINKS_PER_CALL, SPANS_PER_CALL

RETRIEVAL_METRICS = ["hit@5", "precision@5", "recall@5", "mrr", "map", "ndcg@10"]
MAX_CALLS = 10
PER_ROW_METHODS = {"log_metric", "log_param", "set_tag", "log_image", "log_text", "log_dict"}


def make_records(n: int) -> list[RagRecord]:
    """10 ranked passages per question; a relevant id at rank (i % 12) + 1 (none past 10)."""
    records = []
    for i in range(n):
        ids = [f"d{i}-{j}" for j in range(10)]
        records.append(
            RagRecord(
                question=f"question {i}?",
                answer=f"answer {i}.",
                contexts=tuple(Context(text=f"passage {d} about topic {i % 97}.", id=d) for d in ids),
                reference=f"reference {i}.",
                relevant_ids={f"d{i}-{i % 12}": 1, f"d{i}-11": 2} if i % 7 else None,
            )
        )
    return records


class ClientCalls:
    """Counts public ``MlflowClient`` and ``TracingClient`` method calls: ``outer`` (made by
    the caller) and ``all`` (also those the clients make on themselves, e.g. ``log_text`` ->
    ``log_artifact``)."""

    def __init__(self, monkeypatch):
        self.outer: Counter[str] = Counter()
        self.all: Counter[str] = Counter()
        self._depth = 0
        for cls in (MlflowClient, TracingClient):
            for name, fn in list(vars(cls).items()):
                if not name.startswith("_") and inspect.isfunction(fn):
                    monkeypatch.setattr(cls, name, self._wrap(f"{cls.__name__}.{name}", fn))

    def _wrap(self, name, fn):
        @functools.wraps(fn)
        def counted(*args, **kwargs):
            self.all[name] += 1
            if self._depth == 0:
                self.outer[name] += 1
            self._depth += 1
            try:
                return fn(*args, **kwargs)
            finally:
                self._depth -= 1

        return counted

    def take(self) -> tuple[Counter[str], Counter[str]]:
        taken = (self.outer.copy(), self.all.copy())
        self.outer.clear()
        self.all.clear()
        return taken


def test_log_evaluation_makes_the_same_few_calls_for_100_and_10000_rows(tracking_uri, monkeypatch):
    client = MlflowClient()
    experiment_id = mlflow.get_experiment_by_name("tests").experiment_id
    results = {n: evaluate_records(make_records(n), metrics=RETRIEVAL_METRICS, progress=False) for n in (100, 10_000)}
    runs = {n: client.create_run(experiment_id).info.run_id for n in results}

    calls = ClientCalls(monkeypatch)
    counted = {}
    for n, result in results.items():
        log_evaluation(result, runs[n], client, log_traces=False)
        counted[n] = calls.take()
    monkeypatch.undo()  # the checks below use the client unwrapped

    (outer_small, all_small), (outer_large, all_large) = counted[100], counted[10_000]
    assert outer_large == outer_small, "log_evaluation's own calls depend on the row count"
    assert all_large == all_small, "MLflow's calls inside log_evaluation's depend on the row count"
    assert 0 < sum(outer_large.values()) <= MAX_CALLS, outer_large
    assert sum(all_large.values()) <= 2 * MAX_CALLS, all_large
    assert outer_large["MlflowClient.log_batch"] == 1
    assert "MlflowClient.log_metric" not in all_large and "MlflowClient.log_param" not in all_large
    for method in PER_ROW_METHODS:  # a per-file call is fine; a per-row one is not
        assert all_large[f"MlflowClient.{method}"] <= 5, (method, all_large)

    # The calls did carry every row: the 10,000-row table and the aggregates are on the run.
    data = client.get_run(runs[10_000]).data
    n_judged = sum(1 for i in range(10_000) if i % 7)
    assert figures_of(runs[10_000])["hit_at_5/n_scored"] == n_judged
    assert data.params["rag_eval.metrics"] == ",".join(RETRIEVAL_METRICS)
    assert TABLE_FILE in {f.path for f in client.list_artifacts(runs[10_000])}


def test_traces_cost_one_call_per_row_and_batches_for_the_rest(tracking_uri, monkeypatch):
    """With traces: one ``start_trace`` per row (it carries the row's Feedback and Expectations:
    MLflow has no batch call for traces), spans and run links in batches, nothing else per row."""
    client = MlflowClient()
    experiment_id = mlflow.get_experiment_by_name("tests").experiment_id
    sizes = (100, 1_500)
    results = {n: evaluate_records(make_records(n), metrics=RETRIEVAL_METRICS, progress=False) for n in sizes}
    runs = {n: client.create_run(experiment_id).info.run_id for n in sizes}

    calls = ClientCalls(monkeypatch)
    counted = {}
    for n, result in results.items():
        log_evaluation(result, runs[n], client)
        counted[n] = calls.take()[0]
    monkeypatch.undo()

    per_row = {"TracingClient.start_trace"}
    batched = {"TracingClient.log_spans", "MlflowClient.link_traces_to_run"}
    for n, outer in counted.items():
        assert outer["TracingClient.start_trace"] == n
        assert outer["TracingClient.log_spans"] == -(-2 * n // SPANS_PER_CALL)  # two spans a row
        assert outer["MlflowClient.link_traces_to_run"] == -(-n // LINKS_PER_CALL)
        assert "TracingClient.log_assessment" not in outer and "MlflowClient.log_feedback" not in outer
    small, large = counted[sizes[0]], counted[sizes[1]]
    rest = {k: v for k, v in large.items() if k not in per_row and k not in batched}
    assert rest == {k: v for k, v in small.items() if k not in per_row and k not in batched}

    # Every row's trace and assessments are in the store.
    traces = mlflow.search_traces(locations=[experiment_id], run_id=runs[sizes[1]], return_type="list",
                                  include_spans=False, max_results=5_000)
    assert len(traces) == sizes[1]
    n_feedback = sum(sum(a.name == "hit_at_5" for a in t.info.assessments) for t in traces)
    assert n_feedback == sum(1 for i in range(sizes[1]) if i % 7)
