"""Production traces scored in place (``evaluate_traces``, ``evaluate --traces``) on a sqlite
store: traces of a real ``@mlflow.trace`` pipeline, read into records, scored once, a checkpoint
for the next run, and the budget that refuses or stops a run (with the shipped fake LLM server)."""

from __future__ import annotations

import json

import mlflow
import pandas as pd
import pytest
from click.testing import CliRunner
from mlflow import MlflowClient
from mlflow.entities import AssessmentSource, AssessmentSourceType, Document, SpanType
from pipeline import BM25, generate_answer, load_corpus, load_golden

from mlflow_rag_eval.cli import main
from mlflow_rag_eval.evaluation.budget import Budget, BudgetExceeded, estimate_cost
from mlflow_rag_eval.evaluation.engine import evaluate_records
from mlflow_rag_eval.evaluation.suite import prepare_suite
from mlflow_rag_eval.judges import get_judge
from mlflow_rag_eval.records import records_from_frame
from mlflow_rag_eval.routes.production_traces import CHECKPOINT_TAG, evaluate_traces, record_from_trace
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
    first = evaluate_traces("tests", metrics=METRICS, judge=local_judge, sample=8, page_size=7)
    assert first.read == 30 and len(first.scored) == 8 and first.skipped == {"not in the sample": 22}
    for trace_id in first.scored:  # every verdict on the production trace itself
        feedback = _our_feedback(client, trace_id)
        assert set(feedback) == set(METRICS)
        assert all(f.source.source_type == AssessmentSourceType.LLM_JUDGE for f in feedback.values())
        assert {f.metadata["rag_eval.judge_fingerprint"] for f in feedback.values()} == {local_judge.info().fingerprint}
    run = client.get_run(first.run_id)
    assert run.data.tags["mlflow.runType"] == "genai_evaluate"  # on the Evaluation runs page
    assert run.data.params["rag_eval.traces.n_scored"] == "8"
    assert run.data.metrics["faithfulness/n_scored"] == 8
    sample = json.loads(mlflow.artifacts.load_text(f"runs:/{first.run_id}/rag_eval/traces.json"))
    assert sorted(sample["trace_ids"]) == sorted(first.scored)
    linked = client.search_traces(locations=[_experiment_id()], run_id=first.run_id, max_results=100)
    assert sorted(t.info.trace_id for t in linked) == sorted(first.scored)

    again = evaluate_traces("tests", metrics=METRICS, judge=local_judge, sample=8)
    assert again.scored == [] and again.run_id is None and again.skipped["already scored by this judge "
                                                                         "(the trace carries the Feedback)"] == 8
    assert all(len(_our_feedback(client, t)) == 2 for t in first.scored)  # nothing added twice

    new = app.serve(QUESTIONS[30:35])
    later = evaluate_traces("tests", metrics=METRICS, judge=local_judge, since_last=True)
    assert sorted(later.scored) == sorted(new) and later.read == 5
    tag = client.get_experiment(_experiment_id()).tags[later.checkpoint_tag]
    assert later.checkpoint_tag.startswith(CHECKPOINT_TAG)
    assert int(tag) == max(t.info.request_time for t in client.search_traces(locations=[_experiment_id()],
                                                                              max_results=100))
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


def _costly_reply(tokens: int) -> Reply:
    content = json.dumps({"claims": [{"claim": "The fare is 5 euros.", "supported": True, "reason": "stated",
                                      "evidence": None, "passage": 0}]})
    return Reply(body={"id": "x", "object": "chat.completion", "model": "gpt-4o-mini",
                       "choices": [{"index": 0, "finish_reason": "stop",
                                    "message": {"role": "assistant", "content": content}}],
                       "usage": {"prompt_tokens": tokens, "completion_tokens": 10}})


def test_a_run_that_reaches_max_cost_stops_and_keeps_what_it_scored(app, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    ids = app.serve(QUESTIONS[:10])
    # Each reply reports 200k prompt tokens ($0.03 at gpt-4o-mini's price): far above the estimate.
    with FakeJudgeServer(model="gpt-4o-mini", reply=_costly_reply(200_000)) as server:
        out = evaluate_traces("tests", metrics=["faithfulness"], judge=_llm(server), max_cost=0.05, page_size=2)
    assert out.estimate.cost_usd < 0.05 and server.calls == 2
    client = MlflowClient()
    ids = sorted(ids, key=lambda t: (client.get_trace(t).info.request_time, t))  # the order traces are read in
    assert out.scored == ids[:2] and out.skipped == {"not scored: the budget was reached": 8}
    tags = MlflowClient().get_run(out.run_id).data.tags
    assert tags["rag_eval.budget.stopped"].startswith("max_cost=$0.05 reached: $0.0600 spent")
    assert tags["rag_eval.budget.rows_not_scored"] == "8"
    client = MlflowClient()
    assert [len(_our_feedback(client, t)) for t in ids] == [1, 1] + [0] * 8
    # The checkpoint stays before the first trace left unscored: the next run picks it up.
    assert out.checkpoint_ms == client.get_trace(ids[2]).info.request_time - 1


def test_a_failed_judgement_is_a_feedback_with_an_error_and_is_not_asked_again(app, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    (trace_id,) = app.serve(QUESTIONS[:1])
    broken = Reply(body={"id": "x", "object": "chat.completion", "model": "gpt-4o-mini",
                         "choices": [{"index": 0, "finish_reason": "stop",
                                      "message": {"role": "assistant", "content": "no JSON here"}}]})
    with FakeJudgeServer(model="gpt-4o-mini", reply=broken) as server:
        evaluate_traces("tests", metrics=["faithfulness"], judge=_llm(server))
        feedback = _our_feedback(MlflowClient(), trace_id)["faithfulness"]
        assert feedback.value is None and feedback.error.error_code == "ParseError"
        calls = server.calls
        again = evaluate_traces("tests", metrics=["faithfulness"], judge=_llm(server))
        assert again.scored == [] and server.calls == calls


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
    with FakeJudgeServer(model="gpt-4o-mini", reply=_costly_reply(200_000)) as server:
        budget = Budget(0.05)
        result = evaluate_records(records, ["faithfulness"], _llm(server), budget=budget)
    rows = result.metrics[0].rows
    assert [r.status for r in rows] == ["scored"] * 16 + ["skipped"] * 24  # one batch, then the cap
    assert rows[-1].justification.startswith("not applicable: not scored: max_cost=$0.05 reached")
    assert budget.rows_not_scored == 24 and budget.run_tags()["rag_eval.budget.rows_not_scored"] == "24"


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
