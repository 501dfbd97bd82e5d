"""Production traces scored exactly once against a real ``mlflow server`` (sqlite behind it, on
127.0.0.1, one per module): two concurrent runs, a lease held by another run, a retention job
deleting traces between pages, a trace deleted before its Feedback is written."""

from __future__ import annotations

import threading
from collections import Counter

import mlflow
import pytest
from mlflow import MlflowClient
from mlflow.entities import SpanType

from mlflow_rag_eval.routes.production_traces import LEASE_TAG, LeaseHeld, evaluate_traces
from mlflow_rag_eval.testing import mlflow_server as loopback_mlflow_server
from mlflow_rag_eval.tracking.lease import ExperimentLease

METRICS = ["faithfulness", "context_relevance"]


@pytest.fixture(scope="module")
def server_url(tmp_path_factory):
    # 180 s: on a loaded 2-core machine the server takes more than the default 60 s to come up
    with loopback_mlflow_server(tmp_path_factory.mktemp("mlflow_server"), timeout_s=180) as (url, _artifacts):
        yield url


@pytest.fixture
def experiment(server_url, request):
    """A fresh experiment on the server for this test, as the tracking URI and experiment."""
    mlflow.set_tracking_uri(server_url)
    name = f"prod-{request.node.name}"[:200]
    mlflow.set_experiment(name)
    yield name
    mlflow.set_tracking_uri(None)


def _serve(experiment: str, n: int) -> list[str]:
    ids = []
    for i in range(n):
        with mlflow.start_span("app") as root:
            root.set_inputs({"question": f"How much is a bike ticket? ({i})"})
            with mlflow.start_span("search", span_type=SpanType.RETRIEVER) as span:
                span.set_outputs([{"page_content": "Bikes travel for a flat fare of 5 euros.",
                                   "metadata": {"doc_uri": "p1"}}])
            root.set_outputs({"answer": "A bike ticket costs 5 euros."})
        ids.append(root.trace_id)
    mlflow.flush_trace_async_logging()
    _wait_written(experiment, ids)
    return ids


def _wait_written(experiment: str, ids: list[str], timeout_s: float = 120.0) -> None:
    """Until the server holds every trace, ended (a loaded server lands them late)."""
    import time

    client, deadline = MlflowClient(), time.monotonic() + timeout_s
    experiment_id = mlflow.get_experiment_by_name(experiment).experiment_id
    while time.monotonic() < deadline:
        done = {t.info.trace_id for t in client.search_traces(locations=[experiment_id], max_results=500,
                                                              include_spans=False, filter_string="trace.status = 'OK'")}
        if done >= set(ids):
            return
        time.sleep(1)
    raise AssertionError(f"{len(set(ids) - done)} traces not written in {timeout_s:g} s")


def _feedback_counts(client, trace_ids) -> Counter:
    """(metric, number of valid Feedbacks of ours) per trace, counted."""
    out = Counter()
    for trace_id in trace_ids:
        mine = Counter(a.name for a in client.get_trace(trace_id).info.assessments
                       if a.feedback is not None and a.valid is not False and "rag_eval.metric" in (a.metadata or {}))
        out[tuple(sorted(mine.items()))] += 1
    return out


def test_two_concurrent_runs_score_every_trace_once(experiment, local_judge):
    ids = _serve(experiment, 40)
    results, errors, unexpected = [], [], []

    def run():
        try:
            results.append(evaluate_traces(experiment, metrics=METRICS, judge=local_judge, since_last=True,
                                           page_size=10, client=MlflowClient()))
        except LeaseHeld as exc:
            errors.append(exc)
        except Exception as exc:  # noqa: BLE001 - named in the assertion below
            import traceback

            unexpected.append("".join(traceback.format_exception(exc)))

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not unexpected, unexpected[0]
    assert len(results) + len(errors) == 2
    scored = [t for r in results for t in r.scored]
    assert sorted(scored) == sorted(ids)  # each trace scored by one run only
    assert _feedback_counts(MlflowClient(), ids) == {(("context_relevance", 1), ("faithfulness", 1)): 40}
    for exc in errors:  # the second run names the first
        assert "another run scores these traces" in str(exc) and "held by" in str(exc)


def test_a_run_exits_naming_the_holder_of_the_lease_or_waits_for_it(experiment, local_judge):
    _serve(experiment, 3)
    client = MlflowClient()
    probe = evaluate_traces(experiment, metrics=["faithfulness"], judge=local_judge, sample=1)
    lease_name = LEASE_TAG + probe.checkpoint_tag.rsplit(".", 1)[1]
    other = ExperimentLease(client, probe.experiment_id, lease_name, ttl_s=60, settle_s=0)
    other.acquire()
    with pytest.raises(LeaseHeld, match=other.owner.replace(".", r"\.")):
        evaluate_traces(experiment, metrics=["faithfulness"], judge=local_judge)
    threading.Timer(1.0, other.release).start()
    waited = evaluate_traces(experiment, metrics=["faithfulness"], judge=local_judge, lease_wait=30)
    assert len(waited.scored) == 2  # the sample's trace was scored before
    assert lease_name not in client.get_experiment(probe.experiment_id).tags  # released


class _RetentionJob(MlflowClient):
    """The real client; after the first page of traces is read, a retention job deletes the
    oldest ``n`` traces of the experiment (what a cron'd cleanup does while we page)."""

    def __init__(self, n: int, experiment_id: str, **kwargs):
        super().__init__(**kwargs)
        self.n, self.experiment_id, self.pages, self.deleted = n, experiment_id, 0, []

    def search_traces(self, *args, **kwargs):
        page = super().search_traces(*args, **kwargs)
        self.pages += 1
        if self.pages == 1:
            cleaner = MlflowClient()
            oldest = cleaner.search_traces(locations=[self.experiment_id], order_by=["timestamp_ms ASC"],
                                           max_results=self.n)
            self.deleted = [t.info.trace_id for t in oldest]
            cleaner.delete_traces(self.experiment_id, trace_ids=self.deleted)
        return page


def test_a_retention_job_deleting_between_pages_skips_no_live_trace(experiment, local_judge):
    ids = _serve(experiment, 30)
    client = _RetentionJob(10, mlflow.get_experiment_by_name(experiment).experiment_id)
    out = evaluate_traces(experiment, metrics=["faithfulness"], judge=local_judge, page_size=10, client=client)
    live = [t for t in ids if t not in client.deleted]
    assert len(client.deleted) == 10 and client.pages >= 3
    assert sorted(t for t in out.scored if t in live) == sorted(live)  # offset paging would skip 10 of them
    assert _feedback_counts(MlflowClient(), live) == {(("faithfulness", 1),): 20}


class _DeletesBeforeWriting(MlflowClient):
    """The real client; the moment the evaluation run is created (traces read, none written),
    one candidate trace is deleted."""

    def __init__(self, victim: str, **kwargs):
        super().__init__(**kwargs)
        self.victim = victim

    def create_run(self, experiment_id, *args, **kwargs):
        MlflowClient().delete_traces(experiment_id, trace_ids=[self.victim])
        return super().create_run(experiment_id, *args, **kwargs)


def test_a_trace_deleted_before_its_feedback_is_written_is_skipped_and_counted(experiment, local_judge):
    ids = _serve(experiment, 5)
    out = evaluate_traces(experiment, metrics=["faithfulness"], judge=local_judge,
                          client=_DeletesBeforeWriting(ids[2]))
    assert sorted(out.scored) == sorted(ids[:2] + ids[3:])
    assert out.skipped["deleted before its Feedback was written"] == 1
    run = MlflowClient().get_run(out.run_id)
    assert run.info.status == "FINISHED" and run.data.params["rag_eval.traces.n_scored"] == "4"
