"""Production traces scored in place (``evaluate_traces``, ``evaluate --traces``) on a sqlite
store: traces of a real ``@mlflow.trace`` pipeline, read into records, scored once, a checkpoint
for the next run, and the budget that refuses or stops a run (with the shipped fake LLM server)."""

from __future__ import annotations

import json
import threading

import mlflow
import pandas as pd
import pytest
from click.testing import CliRunner
from conftest import figures_of
from mlflow import MlflowClient
from mlflow.entities import AssessmentSource, AssessmentSourceType, Document, SpanType
from pipeline import BM25, generate_answer, load_corpus, load_golden

from mlflow_rag_eval.cli import main
from mlflow_rag_eval.evaluation.budget import Budget, BudgetExceeded, estimate_cost
from mlflow_rag_eval.evaluation.engine import evaluate_records
from mlflow_rag_eval.evaluation.suite import prepare_suite
from mlflow_rag_eval.judges import get_judge
from mlflow_rag_eval.records import records_from_frame
from mlflow_rag_eval.routes import trace_scoring
from mlflow_rag_eval.routes.production_traces import (
    CHECKPOINT_TAG,
    LEASE_TAG,
    LeaseHeld,
    UnreadableTrace,
    evaluate_traces,
    record_from_trace,
)
from mlflow_rag_eval.testing import FakeJudgeServer, Reply

METRICS = ["faithfulness", "context_relevance"]
QUESTIONS = list(load_golden()["question"])


class TracedRag:
    """The example BM25 pipeline, traced as an app instruments itself: a root span with the
    question, a RETRIEVER span returning MLflow Documents."""

    def __init__(self):
        self.index = BM25(load_corpus())

        @mlflow.trace(span_type=SpanType.RETRIEVER, name="retrieve")
        def retrieve(query: str):
            return [Document(page_content=p["text"], metadata={"doc_uri": p["id"]}) for p, _ in self.index.search(query, 3)]

        @mlflow.trace(name="rag_app")
        def answer(question: str):
            docs = retrieve(question)
            contexts = [{"id": d.metadata["doc_uri"], "text": d.page_content} for d in docs]
            return {"answer": generate_answer(question, contexts, 0.34)}

        self.answer = answer

    def serve(self, questions) -> list[str]:
        ids = []
        for q in questions:
            self.answer(q)
            ids.append(mlflow.get_last_active_trace_id())
        mlflow.flush_trace_async_logging()
        return ids


@pytest.fixture
def app(tracking_uri):
    return TracedRag()


def _our_feedback(client, trace_id: str) -> dict[str, object]:
    trace = client.get_trace(trace_id)
    return {a.name: a for a in trace.info.assessments if a.feedback is not None and
            "rag_eval.metric" in (a.metadata or {})}


def _experiment_id() -> str:
    return mlflow.get_experiment_by_name("tests").experiment_id


def test_a_sample_is_scored_in_place_once_and_since_last_scores_only_the_new(app, local_judge, capsys):
    app.serve(QUESTIONS[:30])
    client = MlflowClient()
    first = evaluate_traces("tests", metrics=METRICS, judge=local_judge, sample=8, page_size=7, lag=0)
    assert first.read == 30 and len(first.scored) == 8 and first.skipped == {"not in the sample": 22}
    for trace_id in first.scored:  # every verdict on the production trace itself
        feedback = _our_feedback(client, trace_id)
        assert set(feedback) == set(METRICS)
        assert all(f.source.source_type == AssessmentSourceType.LLM_JUDGE for f in feedback.values())
        assert {f.metadata["rag_eval.judge_fingerprint"] for f in feedback.values()} == {local_judge.info().fingerprint}
    run = client.get_run(first.run_id)
    assert run.data.tags["mlflow.runType"] == "genai_evaluate"  # on the Evaluation runs page
    assert run.data.params["rag_eval.traces.n_scored"] == "8"
    assert figures_of(first.run_id)["faithfulness/n_scored"] == 8
    sample = json.loads(mlflow.artifacts.load_text(f"runs:/{first.run_id}/rag_eval/traces.json"))
    assert sorted(sample["trace_ids"]) == sorted(first.scored)
    linked = client.search_traces(locations=[_experiment_id()], run_id=first.run_id, max_results=100)
    assert sorted(t.info.trace_id for t in linked) == sorted(first.scored)

    again = evaluate_traces("tests", metrics=METRICS, judge=local_judge, sample=8, lag=0)
    assert again.scored == [] and again.run_id is None and again.skipped["already scored by this judge "
                                                                         "(the trace carries the Feedback)"] == 8
    assert all(len(_our_feedback(client, t)) == 2 for t in first.scored)  # nothing added twice

    new = app.serve(QUESTIONS[30:35])
    later = evaluate_traces("tests", metrics=METRICS, judge=local_judge, since_last=True, lag=0)
    assert sorted(later.scored) == sorted(new) and later.read == 5
    tag = client.get_experiment(_experiment_id()).tags[later.checkpoint_tag]
    assert later.checkpoint_tag.startswith(CHECKPOINT_TAG)
    # lag 0: the checkpoint is the newest end time seen
    assert int(tag) == max(t.info.request_time + t.info.execution_duration
                           for t in client.search_traces(locations=[_experiment_id()], max_results=100))
    assert "rag eval budget: 5 rows, judge local:minilm-l6: no paid LLM call (cost $0)" in capsys.readouterr().err


def test_traces_in_other_shapes_are_read_and_unreadable_ones_counted(tracking_uri, local_judge):
    def trace(inputs, outputs, documents=None, expectation=None):
        with mlflow.start_span("app") as root:
            root.set_inputs(inputs)
            if documents is not None:
                with mlflow.start_span("search", span_type=SpanType.RETRIEVER) as span:
                    span.set_outputs(documents)
            root.set_outputs(outputs)
        trace_id = root.trace_id
        mlflow.flush_trace_async_logging()
        if expectation:
            mlflow.log_expectation(trace_id=trace_id, name=expectation[0], value=expectation[1],
                                   source=AssessmentSource(AssessmentSourceType.HUMAN, "labeler"))
        return trace_id

    docs = [{"page_content": "Bikes travel for a flat fare of 5 euros.", "metadata": {"doc_uri": "p1"}},
            {"page_content": "Dogs travel free.", "id": "p2", "metadata": {}}]
    chat = trace({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Bike fare?"}]},
                 {"choices": [{"message": {"role": "assistant", "content": "5 euros."}}]}, docs,
                 expectation=("expected_response", "A bike costs 5 euros."))
    query = trace({"query": "Do dogs pay?"}, "Dogs travel free.", docs, expectation=("relevant_ids", ["p2"]))
    trace({"question": "Bike fare?"}, {"answer": "5 euros."})  # no RETRIEVER span
    trace({"question": "Bike fare?"}, {"unknown": 3}, docs)  # no answer
    client = MlflowClient()

    chat_record = record_from_trace(client.get_trace(chat))
    assert (chat_record.question, chat_record.answer, chat_record.reference) == (
        "Bike fare?", "5 euros.", "A bike costs 5 euros.")
    assert chat_record.context_ids == ["p1", "p2"]
    assert record_from_trace(client.get_trace(query)).relevant_ids == {"p2": 1.0}

    out = evaluate_traces("tests", metrics=["faithfulness", "hit@5"], judge=local_judge)
    assert sorted(out.scored) == sorted([chat, query])
    assert out.skipped == {"unreadable: no RETRIEVER span": 1, "unreadable: no answer in the root span's outputs": 1}
    assert _our_feedback(client, query)["hit_at_5"].value == 1.0  # from the trace's Expectation
    assert _our_feedback(client, query)["hit_at_5"].source.source_type == AssessmentSourceType.CODE
    assert "hit_at_5" not in _our_feedback(client, chat)  # no relevant_ids: not applicable, no Feedback
    traces_json = json.loads(mlflow.artifacts.load_text(f"runs:/{out.run_id}/rag_eval/traces.json"))
    assert traces_json["skipped"] == out.skipped  # the counts are on the run too


def _llm(server, **options):
    return get_judge(f"openai:/gpt-4o-mini?base_url={server.base_url}", cache=False, **options)


def test_max_cost_below_the_estimate_refuses_before_any_call(app, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    app.serve(QUESTIONS[:6])
    with FakeJudgeServer(model="gpt-4o-mini") as server:
        with pytest.raises(BudgetExceeded, match=r"estimated cost \$0\.\d+ .* is above max_cost=\$1e-05"):
            evaluate_traces("tests", metrics=METRICS, judge=_llm(server), max_cost=0.00001)
        assert server.calls == 0
        result = CliRunner().invoke(main, ["evaluate", "--traces", "tests", "--metrics", ",".join(METRICS),
                                           "--judge", f"openai:/gpt-4o-mini?base_url={server.base_url}",
                                           "--max-cost", "0.00001", "--tracking-uri", mlflow.get_tracking_uri()])
        assert result.exit_code == 2, result.output
        assert "is above max_cost" in result.output and "at most 12 LLM calls" in result.output
        assert server.calls == 0
    client = MlflowClient()
    assert client.search_runs([_experiment_id()]) == []  # nothing logged
    assert not [k for k in client.get_experiment(_experiment_id()).tags if k.startswith(CHECKPOINT_TAG)]


#: a judge allowed long replies, as a reasoning model is: _costly_reply's 50k reply tokens fit its max_tokens
LONG_REPLIES = 60_000


def _costly_reply(tokens: int) -> Reply:
    """A reply billed ``tokens`` reply tokens (a long reply, within :data:`LONG_REPLIES`)."""
    content = json.dumps({"claims": [{"claim": "The fare is 5 euros.", "supported": True, "reason": "stated",
                                      "evidence": None, "passage": 0}]})
    return Reply(body={"id": "x", "object": "chat.completion", "model": "gpt-4o-mini",
                       "choices": [{"index": 0, "finish_reason": "stop",
                                    "message": {"role": "assistant", "content": content}}],
                       "usage": {"prompt_tokens": 10, "completion_tokens": tokens}})


def test_a_run_that_reaches_max_cost_stops_and_keeps_what_it_scored(app, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    ids = app.serve(QUESTIONS[:10])
    # Each reply reports 50k reply tokens ($0.03 at gpt-4o-mini's price): far above the estimate.
    with FakeJudgeServer(model="gpt-4o-mini", reply=_costly_reply(50_000)) as server:
        out = evaluate_traces("tests", metrics=["faithfulness"], judge=_llm(server, max_tokens=LONG_REPLIES),
                              max_cost=0.05, page_size=2, lag=0)
    # The first trace's reply cost 0.03, hundreds of times its estimate: the next trace is
    # reserved at that rate, which the cap no longer allows. The cap holds: spent <= max_cost.
    assert out.estimate.cost_usd < 0.05 and server.calls == 1
    client = MlflowClient()
    ids = sorted(ids, key=lambda t: (client.get_trace(t).info.request_time, t))  # the order traces are read in
    assert out.scored == ids[:1] and out.skipped == {"not scored: the budget was reached": 9}
    tags = MlflowClient().get_run(out.run_id).data.tags
    assert tags["rag_eval.budget.stopped"].startswith("max_cost=$0.05 reached: $0.0300 spent")
    assert float(tags["rag_eval.budget.spent_usd"]) <= 0.05 and tags["rag_eval.budget.rows_not_scored"] == "9"
    assert tags["rag_eval.judge.calls"] == "1" and tags["rag_eval.judge.tokens_out"] == "50000"
    assert [len(_our_feedback(client, t)) for t in ids] == [1] + [0] * 9
    # The checkpoint stays before the first trace left unscored: the next run picks it up.
    assert out.checkpoint_ms == client.get_trace(ids[1]).info.request_time - 1


def test_a_failed_judgement_is_a_feedback_with_an_error_and_is_judged_again(app, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    (trace_id,) = app.serve(QUESTIONS[:1])
    broken = Reply(body={"id": "x", "object": "chat.completion", "model": "gpt-4o-mini",
                         "choices": [{"index": 0, "finish_reason": "stop",
                                      "message": {"role": "assistant", "content": "no JSON here"}}]})
    client = MlflowClient()
    with FakeJudgeServer(model="gpt-4o-mini", reply=broken) as server:
        evaluate_traces("tests", metrics=["faithfulness"], judge=_llm(server), since_last=True, lag=0)
        feedback = _our_feedback(client, trace_id)["faithfulness"]
        assert feedback.value is None and feedback.error.error_code == "ParseError"
        assert client.get_trace(trace_id).info.tags["mlflow_rag_eval.retry"] == "true"
        server.reply = None  # the judge answers again
        again = evaluate_traces("tests", metrics=["faithfulness"], judge=_llm(server), since_last=True, lag=0)
    assert again.scored == [trace_id]  # behind the checkpoint, read again for its retry tag
    mine = [a for a in client.get_trace(trace_id).info.assessments if a.name == "faithfulness"]
    assert [(a.valid, a.error is None) for a in mine] == [(False, False), (True, True)]
    assert mine[1].overrides == mine[0].assessment_id
    assert "mlflow_rag_eval.retry" not in client.get_trace(trace_id).info.tags


def test_the_data_route_and_the_plugin_refuse_an_estimate_above_max_cost(tracking_uri, monkeypatch, tmp_path):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    frame = pd.DataFrame({"question": ["Bike fare?", "Dogs?"], "answer": ["5 euros.", "Free."],
                          "contexts": [["Bikes cost 5 euros."], ["Dogs travel free."]]})
    path = tmp_path / "rows.jsonl"
    frame.to_json(path, orient="records", lines=True)
    with FakeJudgeServer(model="gpt-4o-mini") as server:
        judge = f"openai:/gpt-4o-mini?base_url={server.base_url}"
        result = CliRunner().invoke(main, ["evaluate", "--data", str(path), "--metrics", "faithfulness",
                                           "--judge", judge, "--max-cost", "0", "--tracking-uri", tracking_uri])
        assert result.exit_code == 2 and "is above max_cost=$0" in result.output, result.output
        with pytest.raises(BudgetExceeded, match="is above max_cost"), mlflow.start_run():
            mlflow.models.evaluate(data=frame, model_type="rag", evaluators="rag",
                                   evaluator_config={"judge": judge, "metrics": ["faithfulness"], "max_cost": 0.0})
        assert server.calls == 0
        with pytest.raises(ValueError, match=r"evaluator_config\['max_cost'\] must be a number"), mlflow.start_run():
            mlflow.models.evaluate(data=frame, model_type="rag", evaluators="rag",
                                   evaluator_config={"metrics": ["faithfulness"], "max_cost": "1"})


def test_the_engine_stops_at_max_cost_and_leaves_the_rest_unscored(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    frame = pd.DataFrame({"question": [f"Question {i}?" for i in range(40)], "answer": ["5 euros."] * 40,
                          "contexts": [[f"Passage {i}: bikes cost 5 euros."] for i in range(40)]})
    records = records_from_frame(frame)
    with FakeJudgeServer(model="gpt-4o-mini", reply=_costly_reply(50_000)) as server:
        budget = Budget(0.05)
        result = evaluate_records(records, ["faithfulness"], _llm(server, max_tokens=LONG_REPLIES), budget=budget)
    rows = result.metrics[0].rows
    # The run's first call goes alone and reports 50k reply tokens: every later call of the
    # batch is reserved at that length, which the cap no longer allows (refused: the row's error,
    # no request sent); the next batches are not started. The cap holds: $0.03 of $0.05.
    assert server.calls == 1 and budget.spent == pytest.approx(0.0300015) and budget.ledger.calls_refused == 15
    assert sorted(r.status for r in rows[:16]) == ["error"] * 15 + ["scored"]
    assert {r.error.split(":")[0] for r in rows[:16] if r.status == "error"} == {"BudgetExhausted"}
    assert [r.status for r in rows[16:]] == ["skipped"] * 24
    assert rows[-1].justification.startswith("not applicable: not scored: max_cost=$0.05 reached: $0.0300 spent")
    assert budget.rows_not_scored == 24 and budget.run_tags()["rag_eval.budget.rows_not_scored"] == "24"
    assert budget.run_tags()["rag_eval.budget.calls_refused"] == "15"


def test_the_estimate_counts_the_templates_calls_and_prices(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    frame = pd.DataFrame({"question": ["Bike fare?"] * 3, "answer": ["5 euros. Bikes ride free on Sundays."] * 3,
                          "contexts": [["Bikes cost 5 euros.", "Dogs travel free."]] * 3, "reference": ["5 euros."] * 3})
    records = records_from_frame(frame)
    judge = get_judge("openai:/gpt-4o?base_url=http://127.0.0.1:9/v1", cache=False)
    suite = prepare_suite(["faithfulness", "context_recall", "answer_correctness", "context_precision", "mrr"],
                          judge, {"answer", "contexts", "reference", "relevant_ids"})
    estimate = estimate_cost(suite.metrics, records, judge)
    assert estimate.calls_by_metric == {"faithfulness": 3, "context_recall": 3, "answer_correctness": 6,
                                        "context_precision": 3}
    assert estimate.calls == 15 and estimate.tokens_in > 15 * 200  # the templates' own text
    price = {"input": 2.5, "output": 10.0}  # gpt-4o in judges/prices.json
    assert estimate.cost_usd == pytest.approx((estimate.tokens_in * price["input"]
                                               + estimate.tokens_out * price["output"]) / 1e6, rel=1e-3)
    local = estimate_cost(suite.metrics, records, get_judge("scripted"))
    assert local.cost_usd == 0.0


# --------------------------------------------------------------------------- issue 36: left to cron


def _rag_trace(question: str, *, tags=None, expectations=(), documents=None, start_ns=None, end_ns=None,
               error: bool = False) -> str:
    """A trace as a RAG app writes it: a root span and a RETRIEVER span; ``start_ns``/``end_ns``
    for a request that ran long (MLflow writes it when it ends, stamped with its start)."""
    docs = documents if documents is not None else [
        {"page_content": "Bikes travel for a flat fare of 5 euros.", "metadata": {"doc_uri": "p1"}},
        {"page_content": "Dogs travel free.", "metadata": {"doc_uri": "p2"}}]
    root = mlflow.start_span_no_context("app", inputs={"question": question}, start_time_ns=start_ns, tags=tags)
    child = mlflow.start_span_no_context("search", span_type=SpanType.RETRIEVER, parent_span=root,
                                         start_time_ns=start_ns)
    child.set_outputs(docs)
    child.end(end_time_ns=end_ns)
    root.set_outputs({"answer": "A bike ticket costs 5 euros."})
    root.end(end_time_ns=end_ns, status="ERROR" if error else "OK")
    mlflow.flush_trace_async_logging()
    for name, value in expectations:
        mlflow.log_expectation(trace_id=root.trace_id, name=name, value=value,
                               source=AssessmentSource(AssessmentSourceType.HUMAN, "labeler"))
    return root.trace_id


def test_a_filter_in_mlflows_grammar_selects_by_tag_metadata_and_status_with_the_time_window(tracking_uri,
                                                                                             local_judge):
    prod = [_rag_trace(f"Bike fare {i}?", tags={"env": "prod"}) for i in range(3)]
    dev = _rag_trace("Bike fare dev?", tags={"env": "dev"})
    failed = _rag_trace("Bike fare failed?", tags={"env": "prod"}, error=True)
    client = MlflowClient()
    client.set_trace_tag(dev, "team", "search")
    out = evaluate_traces("tests", metrics=["faithfulness"], judge=local_judge, filter_string="tags.env = 'prod'")
    assert sorted(out.scored) == sorted(prod + [failed]) and out.read == 4
    with_status = evaluate_traces("tests", metrics=["context_relevance"], judge=local_judge, since="24h",
                                  filter_string="tags.env = 'prod' AND trace.status = 'OK'")
    assert sorted(with_status.scored) == sorted(prod)
    later = _rag_trace("Bike fare later?", tags={"env": "prod"})
    since_last = evaluate_traces("tests", metrics=["faithfulness"], judge=local_judge, since_last=True,
                                 filter_string="tags.env = 'prod'")
    assert since_last.scored == [later]
    # trace metadata, through the CLI
    source_run = client.get_trace(dev).info.trace_metadata.get("mlflow.user")
    assert source_run  # MLflow stamps the user on every trace
    result = CliRunner().invoke(main, ["evaluate", "--traces", "tests", "--metrics", "faithfulness",
                                       "--filter", f"metadata.`mlflow.user` = '{source_run}' AND tags.env = 'dev'",
                                       "--tracking-uri", mlflow.get_tracking_uri()])
    assert result.exit_code == 0, result.output
    assert set(_our_feedback(client, dev)) == {"faithfulness"}


def _corrupt_spans(tracking_uri: str, trace_id: str) -> None:
    import sqlite3

    con = sqlite3.connect(tracking_uri.removeprefix("sqlite:///"))
    with con:
        changed = con.execute("UPDATE spans SET content = 'not json' WHERE trace_id = ?", (trace_id,)).rowcount
    con.close()
    assert changed, "the store keeps no span rows for this trace"


def test_a_trace_whose_spans_do_not_decode_is_skipped_by_id_and_the_others_scored(tracking_uri, local_judge):
    good = [_rag_trace(f"Bike fare {i}?") for i in range(5)]
    bad = _rag_trace("Bike fare broken?")
    _corrupt_spans(tracking_uri, bad)
    out = evaluate_traces("tests", metrics=["faithfulness"], judge=local_judge, page_size=3)
    assert sorted(out.scored) == sorted(good)
    (reason,) = [r for r in out.skipped if r.startswith("unreadable: it cannot be fetched or decoded")]
    assert out.skipped[reason] == 1 and list(out.unreadable) == [bad]
    tagged = MlflowClient().search_traces(locations=[_experiment_id()], include_spans=False,
                                          filter_string="tags.`mlflow_rag_eval.retry` = 'true'")
    assert [t.info.trace_id for t in tagged] == [bad]  # read again next time
    again = evaluate_traces("tests", metrics=["faithfulness"], judge=local_judge, since_last=True, lag=0)
    assert list(again.unreadable) == [bad] and again.scored == [] and again.read == 6  # the bad one read again


def test_invalid_expectations_skip_their_trace_only_and_it_is_scored_once_fixed(tracking_uri, local_judge):
    good = [_rag_trace(f"Dogs {i}?", expectations=[("relevant_ids", ["p2"])]) for i in range(3)]
    bad = _rag_trace("Dogs bad?", expectations=[("relevant_ids", {"p0": "inf", "p1": 1})])
    out = evaluate_traces("tests", metrics=["hit@5"], judge=local_judge, since_last=True, lag=0)
    assert sorted(out.scored) == sorted(good)
    assert all(_our_feedback(MlflowClient(), t)["hit_at_5"].value == 1.0 for t in good)
    assert out.unreadable == {bad: "its Expectation 'relevant_ids' is invalid: grade of id 'p0' must be a number, "
                                    "got str"}
    mlflow.log_expectation(trace_id=bad, name="relevant_ids", value=["p1"],  # the newest Expectation wins
                           source=AssessmentSource(AssessmentSourceType.HUMAN, "labeler"))
    fixed = evaluate_traces("tests", metrics=["hit@5"], judge=local_judge, since_last=True, lag=0)
    assert fixed.scored == [bad] and _our_feedback(MlflowClient(), bad)["hit_at_5"].value == 1.0
    assert "mlflow_rag_eval.retry" not in MlflowClient().get_trace(bad).info.tags


@pytest.mark.parametrize(("name", "value", "reason"), [
    ("relevant_ids", [{"id": "p1", "grade": 2}, {"id": "p1", "grade": 1}], "id 'p1' is listed twice, with grades 2 and 1"),
    ("relevant_ids", {"p1": True}, "grade of id 'p1' must be a number, got bool"),
    ("answerable", "false", "must be a boolean, got 'false'"),
])
def test_expectations_are_read_by_the_data_routes_rules(tracking_uri, name, value, reason):
    trace_id = _rag_trace("Bike fare?", expectations=[(name, value)])
    with pytest.raises(UnreadableTrace, match="is invalid") as refused:
        record_from_trace(MlflowClient().get_trace(trace_id))
    assert refused.value.reason == f"its Expectation {name!r} is invalid: {reason}"


def test_nested_retrievers_give_the_outer_ones_documents(tracking_uri):
    with mlflow.start_span("app") as root:
        root.set_inputs({"question": "Bike fare?"})
        with mlflow.start_span("hybrid", span_type=SpanType.RETRIEVER) as outer:
            with mlflow.start_span("bm25", span_type=SpanType.RETRIEVER) as inner:
                inner.set_outputs([{"page_content": "Dogs travel free.", "metadata": {"doc_uri": "p2"}}])
            outer.set_outputs([{"page_content": "Bikes cost 5 euros.", "metadata": {"doc_uri": "p1"}}])
        root.set_outputs({"answer": "5 euros."})
    mlflow.flush_trace_async_logging()
    record = record_from_trace(MlflowClient().get_trace(root.trace_id))
    assert record.context_ids == ["p1"]  # what the generator was given, not the inner span's (started last)


def test_a_reviewers_verdict_is_never_scored_over(tracking_uri, local_judge):
    overridden, human = _rag_trace("Bike fare?"), _rag_trace("Dogs?")
    evaluate_traces("tests", metrics=["faithfulness"], judge=local_judge)
    client = MlflowClient()
    ours = _our_feedback(client, overridden)["faithfulness"]
    mlflow.override_feedback(trace_id=overridden, assessment_id=ours.assessment_id, value=0.0,
                             source=AssessmentSource(AssessmentSourceType.HUMAN, "reviewer"))
    mlflow.log_feedback(trace_id=human, name="context_relevance", value=0.0,
                        source=AssessmentSource(AssessmentSourceType.HUMAN, "reviewer"))
    again = evaluate_traces("tests", metrics=["faithfulness", "context_relevance"], judge=local_judge)
    # only context_relevance on the overridden trace is left: the person's verdicts stand
    assert again.scored == [overridden] and set(_our_feedback(client, overridden)) == {"faithfulness",
                                                                                      "context_relevance"}
    faithfulness = [a for a in client.get_trace(overridden).info.assessments if a.name == "faithfulness"]
    assert [(a.source.source_type, a.valid) for a in faithfulness] == [("LLM_JUDGE", False), ("HUMAN", True)]
    relevance = [a for a in client.get_trace(human).info.assessments if a.name == "context_relevance"]
    assert [a.source.source_type for a in relevance] == ["HUMAN"]
    assert evaluate_traces("tests", metrics=["faithfulness", "context_relevance"], judge=local_judge).scored == []


def test_a_long_request_written_after_the_checkpoint_passed_its_start_is_scored(tracking_uri, local_judge):
    import time

    start = time.time_ns()
    _rag_trace("Bike fare first?")
    first = evaluate_traces("tests", metrics=["faithfulness"], judge=local_judge, since_last=True, lag="60s")
    # a request that started before the first run and ended after it
    late = _rag_trace("Bike fare long?", start_ns=start - 5_000_000_000, end_ns=time.time_ns())
    assert first.checkpoint_ms < MlflowClient().get_trace(late).info.request_time + 60_000
    second = evaluate_traces("tests", metrics=["faithfulness"], judge=local_judge, since_last=True, lag="60s")
    assert second.scored == [late]
    assert second.skipped == {"already scored by this judge (the trace carries the Feedback)": 1}  # the overlap


def test_experiments_are_named_by_prefix_and_an_ambiguous_bare_value_is_refused(tracking_uri, local_judge):
    _rag_trace("Bike fare?")
    tests_id = _experiment_id()
    other = MlflowClient().create_experiment(tests_id)  # an experiment *named* like the id of "tests"
    uri = mlflow.get_tracking_uri()
    result = CliRunner().invoke(main, ["evaluate", "--traces", tests_id, "--metrics", "faithfulness",
                                       "--tracking-uri", uri])
    assert result.exit_code == 2 and "is ambiguous" in result.output and f"id:{tests_id}" in result.output
    assert MlflowClient().search_runs([tests_id, other]) == []
    assert evaluate_traces(f"id:{tests_id}", metrics=["faithfulness"], judge=local_judge).experiment_id == tests_id
    assert evaluate_traces(f"name:{tests_id}", metrics=["faithfulness"], judge=local_judge).experiment_id == other


def test_a_server_that_does_not_answer_like_mlflow_is_an_error(tmp_path):
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Empty(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _empty(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        do_GET = do_POST = _empty

    server = ThreadingHTTPServer(("127.0.0.1", 0), Empty)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        result = CliRunner().invoke(main, ["evaluate", "--traces", "prod", "--metrics", "hit@5",
                                           "--tracking-uri", f"http://127.0.0.1:{server.server_port}"])
    finally:
        server.shutdown()
    assert result.exit_code == 2, result.output
    assert "does not answer like MLflow" in result.output


def test_the_estimate_counts_only_what_the_judge_cache_cannot_answer(app, monkeypatch, tmp_path):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("MLFLOW_RAG_EVAL_CACHE_DIR", str(tmp_path / "judge_cache"))
    app.serve(QUESTIONS[:3])
    with FakeJudgeServer(model="gpt-4o-mini") as server:
        def judge():
            return get_judge(f"openai:/gpt-4o-mini?base_url={server.base_url}")  # the reply cache on

        first = evaluate_traces("tests", metrics=["faithfulness"], judge=judge())
        calls = server.calls
        assert first.estimate.cost_usd > 0 and calls >= 3 and first.spending["calls"] == calls
        app.serve(QUESTIONS[:3])  # the same requests again: the cache holds every reply
        again = evaluate_traces("tests", metrics=["faithfulness"], judge=judge(),
                                max_cost=first.estimate.cost_usd / 10)  # refused before, though it costs 0
    assert again.estimate.cost_usd == 0 and again.estimate.calls == 0 and len(again.scored) == 3
    assert server.calls == calls and again.spending["calls"] == 0 and again.spending["cache_hits"] == calls


def test_replies_without_usage_are_charged_at_the_estimate_and_the_cap_holds(app, monkeypatch, capsys):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    app.serve(QUESTIONS[:10])
    content = json.dumps({"claims": [{"claim": "The fare is 5 euros.", "supported": True, "reason": "stated",
                                      "evidence": None, "passage": 0}]})
    no_usage = Reply(body={"id": "x", "object": "chat.completion", "model": "gpt-4o-mini",
                           "choices": [{"index": 0, "finish_reason": "stop",
                                        "message": {"role": "assistant", "content": content}}]})
    with FakeJudgeServer(model="gpt-4o-mini", reply=no_usage) as server:
        probe = _llm(server)
        records = [record_from_trace(t) for t in MlflowClient().search_traces(locations=[_experiment_id()],
                                                                            max_results=10)]
        suite = prepare_suite(["faithfulness"], probe, {"answer", "contexts"})
        estimate = estimate_cost(suite.metrics, records, probe)
        per_call = estimate.cost_usd / estimate.calls
        # The cap leaves room for one more call at max_tokens: what a call is held at before it is sent.
        cap = estimate.cost_usd + 1024 * 0.6e-6 + per_call
        out = evaluate_traces("tests", metrics=["faithfulness"], judge=_llm(server), max_cost=cap)
    assert out.spending["usage_unknown"] == out.spending["calls"] == server.calls == 10
    # Each reply charged at its call's estimate, counted as the estimate before the run counts it: never $0.
    assert out.budget.spent == pytest.approx(sum(estimate.row_costs)) == pytest.approx(estimate.cost_usd, abs=1e-6)
    assert len(out.scored) == 10 and out.budget.stopped is None
    assert MlflowClient().get_run(out.run_id).data.tags["rag_eval.budget.spent_usd"] == f"{out.budget.spent:.6f}"
    err = capsys.readouterr().err
    assert "judge: 10 calls, 0 cache hits" in err and "(10 replies without usage, charged at the estimate)" in err


def test_a_second_judge_on_the_same_traces_gets_names_of_its_own(app, local_judge):
    """Issue 37: two judges' Feedback on one trace sat under one name, and MLflow's UI averaged
    a local-judge 1 with an LLM-judge 0.667. The first judge keeps the metric's name; a second
    one's Feedback goes under <metric>/<judge name>, once (it is done the next time)."""
    ids = app.serve(QUESTIONS[:3])
    client = MlflowClient()
    metrics = ["faithfulness", "context_relevance"]
    evaluate_traces("tests", metrics=metrics, judge=local_judge, lag=0)
    scripted = get_judge("scripted")
    second = evaluate_traces("tests", metrics=metrics, judge=scripted, lag=0)
    assert sorted(second.scored) == sorted(ids)
    name = scripted.info().name
    for trace_id in ids:
        feedback = _our_feedback(client, trace_id)
        assert set(feedback) == {"faithfulness", "context_relevance", f"faithfulness/{name}",
                                 f"context_relevance/{name}"}, set(feedback)
        assert feedback["faithfulness"].source.source_id == local_judge.info().name
        assert feedback[f"faithfulness/{name}"].source.source_id == name
        assert feedback[f"faithfulness/{name}"].metadata["rag_eval.metric"] == "faithfulness"
    third = evaluate_traces("tests", metrics=metrics, judge=scripted, lag=0)
    assert third.scored == []  # the second judge's Feedback counts as done under its own name
    assert all(len(_our_feedback(client, t)) == 4 for t in ids)


class _LongReplies(FakeJudgeServer):
    """The fake judge writing a long reason for every claim and passage, within the request's
    ``max_tokens`` as a provider does, and keeping its bill: each reply's usage as it reported it."""

    REASON = "The passage states it in so many words, and nothing in the other passages contradicts it. " * 4

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.bill: list[tuple[int, int, int]] = []  # (prompt tokens, completion tokens, max_tokens asked)

    def _completion(self, body):
        out = super()._completion(body)
        reply = json.loads(out["choices"][0]["message"]["content"])
        for item in reply.get("claims", []) + reply.get("verdicts", []):
            item["reason"] = self.REASON
        out["choices"][0]["message"]["content"] = text = json.dumps(reply)
        out["usage"]["completion_tokens"] = len(text) // 4
        with self.lock:
            self.bill.append((out["usage"]["prompt_tokens"], out["usage"]["completion_tokens"], body["max_tokens"]))
        return out

    def billed_usd(self) -> float:
        """What the replies cost at gpt-4o-mini's list price, as the server counted them."""
        return sum(tokens_in * 0.15 + tokens_out * 0.60 for tokens_in, tokens_out, _ in self.bill) / 1e6


def test_a_few_traces_with_long_replies_stop_at_the_cap_call_by_call(app, monkeypatch):
    # Two traces, both metrics: one trace's two calls together cost more than the cap, though the
    # estimate of both traces is within it. Checking the cap before each trace lets the first
    # trace's calls run past it; checking it before each call stops at the cap.
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    app.serve(QUESTIONS[:2])
    with _LongReplies(model="gpt-4o-mini") as server:
        probe = _llm(server)
        records = [record_from_trace(t) for t in MlflowClient().search_traces(locations=[_experiment_id()])]
        estimate = estimate_cost(prepare_suite(METRICS, probe, {"answer", "contexts"}).metrics, records, probe)
        cap = round(estimate.cost_usd, 6)  # the most the estimate allows
        out = evaluate_traces("tests", metrics=METRICS, judge=_llm(server), max_cost=cap, lag=0)
    assert server.bill and all(tokens_out <= max_tokens for _, tokens_out, max_tokens in server.bill)
    assert server.billed_usd() > len(server.bill) * estimate.cost_usd / estimate.calls  # dearer than estimated
    assert server.billed_usd() <= cap  # what the provider would bill: the cap holds
    assert out.budget.spent == pytest.approx(server.billed_usd())
    tags = MlflowClient().get_run(out.run_id).data.tags
    assert tags["rag_eval.budget.stopped"].startswith(f"max_cost=${cap:g} reached")
    assert float(tags["rag_eval.budget.spent_usd"]) <= cap
    assert out.spending["calls"] == server.calls == len(server.bill) < 2 * len(records)
    assert tags["rag_eval.budget.calls_refused"] == str(out.budget.ledger.calls_refused) != "0"
    # The trace under way when the cap was reached: its refused metric is an error (never a
    # score), tagged to be scored again; the next trace is not started.
    client = MlflowClient()
    first, second = sorted(client.search_traces(locations=[_experiment_id()]), key=lambda t: t.info.request_time)
    assert out.scored == [first.info.trace_id] and out.skipped == {"not scored: the budget was reached": 1}
    feedback = _our_feedback(client, first.info.trace_id)
    refused = [f for f in feedback.values() if f.error is not None]
    assert len(feedback) == 2 and [f.error.error_code for f in refused] == ["BudgetExhausted"] * len(refused)
    assert [f.value for f in feedback.values() if f.error is None] and all(f.value is None for f in refused)
    assert len(refused) == len(METRICS) - server.calls
    assert client.get_trace(first.info.trace_id).info.tags.get("mlflow_rag_eval.retry") == "true"
    assert _our_feedback(client, second.info.trace_id) == {}


def test_a_misspelled_experiment_is_answered_with_the_closest_names(tracking_uri):
    MlflowClient().create_experiment("kestrel-prod")
    uri = mlflow.get_tracking_uri()
    for given in ("kestrel-prd", "name:kestrel-prd"):
        result = CliRunner().invoke(main, ["evaluate", "--traces", given, "--metrics", "faithfulness",
                                           "--tracking-uri", uri])
        assert result.exit_code == 2, result.output
        assert "no experiment named 'kestrel-prd' (did you mean 'kestrel-prod'?)" in result.output


def test_a_judge_that_stays_away_past_its_outage_budget_stops_the_run_and_the_next_run_finishes(app, monkeypatch):
    """Issue 47 on production traces: what was judged before the outage keeps its Feedback, the
    traces of the share in flight get a JudgeStopped error (judged again next run), the rest are
    left for the next run (the checkpoint before them), which asks for nothing twice."""
    from mlflow_rag_eval.testing.faults import FaultMix, FaultyServer

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    ids = app.serve(QUESTIONS[:8])
    client = MlflowClient()
    ids = sorted(ids, key=lambda t: (client.get_trace(t).info.request_time, t))  # the order traces are read in
    records = {t: record_from_trace(client.get_trace(t)) for t in ids}
    held = {t: (r.answer, *(c.text for c in r.contexts)) for t, r in records.items()}  # what its prompt holds
    assert len(set(held.values())) == len(ids)
    mix = FaultMix(outage_after=2, outage_s=float("inf"))

    def asked(requests) -> list[str]:
        return [t for r in requests for t in ids if all(text in r.prompt for text in held[t])]

    with FaultyServer(mix) as server:
        judge = f"openai:/gpt-4o-mini?base_url={server.base_url}"
        out = evaluate_traces("tests", metrics=["faithfulness"], judge=get_judge(judge, cache=False, outage_budget=1),
                              page_size=2, since_last=True, lag=0)
        first = asked(server.requests[:2])
        in_flight = [_our_feedback(client, t)["faithfulness"].error for t in ids[2:4]]
        mix.outage_s, before = 0.0, server.calls  # the provider is back
        again = evaluate_traces("tests", metrics=["faithfulness"], judge=get_judge(judge, cache=False), page_size=2,
                                since_last=True, lag=0)
        second = asked(server.requests[before:])

    (reason, n), = out.skipped.items()
    assert reason.startswith("not scored: judge 'openai:/gpt-4o-mini' stopped answering: no answer for 1 s") and n == 4
    assert sorted(first) == sorted(ids[:2]) and all(_our_feedback(client, t)["faithfulness"].error is None
                                                    for t in ids[:2])
    assert [e.error_code for e in in_flight] == ["JudgeStopped"] * 2  # the share in flight: read again next run
    assert out.checkpoint_ms == client.get_trace(ids[4]).info.request_time - 1
    assert sorted(second) == sorted(ids[2:]) and sorted(again.scored) == sorted(ids[2:])
    assert all(_our_feedback(client, t)["faithfulness"].error is None for t in ids)


def test_a_shares_feedback_is_written_while_the_next_share_is_judged(app, local_judge, monkeypatch):
    ids = app.serve(QUESTIONS[:6])
    second_share_judged, overlapped = threading.Event(), []
    real_score, real_write = trace_scoring.score_records, trace_scoring.log_assessments_on_live_traces
    shares = []

    def score(*args, **kwargs):
        shares.append(len(args[1]))
        if len(shares) == 2:
            second_share_judged.set()
        return real_score(*args, **kwargs)

    def write(client, by_trace):
        if not overlapped:  # the first write waits (a while at most) for the next share's judging
            overlapped.append(second_share_judged.wait(20))
        return real_write(client, by_trace)

    monkeypatch.setattr(trace_scoring, "score_records", score)
    monkeypatch.setattr(trace_scoring, "log_assessments_on_live_traces", write)
    out = evaluate_traces("tests", metrics=METRICS, judge=local_judge, page_size=2, lag=0)
    assert overlapped == [True] and shares == [2, 2, 2]
    assert sorted(out.scored) == sorted(ids)
    client = MlflowClient()
    assert all(set(_our_feedback(client, t)) == set(METRICS) for t in ids)
    assert figures_of(out.run_id)["faithfulness/n_scored"] == 6


def test_a_run_that_loses_its_lease_writes_no_share_after_it(app, local_judge, monkeypatch):
    ids = app.serve(QUESTIONS[:6])
    client = MlflowClient()
    real_write = trace_scoring.log_assessments_on_live_traces
    writes = []

    def write(store_client, by_trace):
        gone = real_write(store_client, by_trace)
        writes.append(sorted(by_trace))
        if len(writes) == 1:  # another run takes the lease once the first share is written
            experiment = client.get_experiment(_experiment_id())
            (name,) = [k for k in experiment.tags if k.startswith(LEASE_TAG)]
            client.set_experiment_tag(experiment.experiment_id, name,
                                      json.dumps({"owner": "another-host:1:cafe", "expires_ms": 2**62}))
        return gone

    monkeypatch.setattr(trace_scoring, "log_assessments_on_live_traces", write)
    with pytest.raises(LeaseHeld, match="lost its lease"):
        evaluate_traces("tests", metrics=METRICS, judge=local_judge, page_size=2, lag=0)
    assert len(writes) == 1  # the second share was judged meanwhile, and never written
    with_feedback = [t for t in ids if _our_feedback(client, t)]
    assert sorted(with_feedback) == writes[0]
