"""Every evaluated row is an MLflow trace with its metrics as Feedback and its expectations as
Expectations, linked to the evaluation run and the logged model, whichever route evaluated it."""

from __future__ import annotations

import json
import math

import mlflow
import pandas as pd
import pytest
from conftest import figures_of, refusing_judge
from mlflow import MlflowClient
from mlflow.entities import AssessmentSourceType, Expectation, Feedback, SpanType

from mlflow_rag_eval.judges.base import JudgeCapabilityError
from mlflow_rag_eval.records import RecordError
from mlflow_rag_eval.tracking.pipeline_traces import match_pipeline_traces
from mlflow_rag_eval.tracking.traces import (
    EVIDENCE_CHARS,
    RETRIEVER_SPAN,
    ROOT_SPAN,
    compact_evidence,
)

METRICS = ["faithfulness", "context_recall", "answer_relevancy", "ndcg@10", "mrr"]


def frame() -> pd.DataFrame:
    """Four rows: a supported answer, an abstention, one the scripted judge refuses (the
    word "refuse" in the answer), and one without reference or relevant ids."""
    bike = {"id": "p1", "text": "Bikes travel for a flat fare of 5 euros per journey."}
    dogs = {"id": "p2", "text": "Dogs travel free on all trains."}
    return pd.DataFrame({
        "question": ["How much does a bike ticket cost?", "Can I bring my cat?", "Do dogs pay?",
                     "Is there wifi?"],
        "answer": ["Bikes travel for a flat fare of 5 euros.", "I don't know.", "Dogs travel free; refuse to say more.",
                   "Wifi is free on all trains."],
        "contexts": [[bike, dogs], [dogs], [dogs, bike], []],
        "reference": ["A bike ticket costs 5 euros.", "Cats travel free in a closed carrier.", "Dogs travel free.",
                      None],
        "relevant_ids": [{"p1": 2}, ["p9"], {"p2": 1, "p7": 2}, None],
    })


def _run_traces(run_id: str) -> list:
    run = mlflow.get_run(run_id)
    return mlflow.search_traces(locations=[run.info.experiment_id], run_id=run_id, return_type="list")


def _table(run_id: str) -> pd.DataFrame:
    path = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path="eval_results_table.json")
    with open(path) as f:
        table = json.load(f)
    return pd.DataFrame(table["data"], columns=table["columns"])


def _cell(value):
    """A table cell, with the NaN that stands for "empty" in MLflow's table format as None."""
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else value


def _feedback(trace) -> dict[str, Feedback]:
    return {a.name: a for a in trace.info.assessments if isinstance(a, Feedback)}


def test_each_row_is_a_trace_whose_feedback_is_the_table(tracking_uri):
    df = frame()
    judge = refusing_judge("refuse")
    with mlflow.start_run() as run:
        result = mlflow.models.evaluate(data=df, model_type="rag", evaluators="rag",
                                        evaluator_config={"judge": judge, "metrics": METRICS})
    run_id = run.info.run_id
    logged = MlflowClient().get_run(run_id)
    assert logged.data.tags["mlflow.runType"] == "genai_evaluate"  # an MLflow 3 evaluation run
    assert figures_of(result)["faithfulness/n_error"] == 1

    table = _table(run_id)
    traces = {t.info.trace_id: t for t in _run_traces(run_id)}
    assert sorted(traces) == sorted(table["trace_id"])  # one trace per row, none more
    fingerprint = logged.data.params["rag_eval.judge_fingerprint"]
    n_feedback = n_errors = 0
    for i, row in table.iterrows():
        trace = traces[row["trace_id"]]
        assert trace.info.trace_metadata["mlflow.sourceRun"] == run_id
        assert trace.info.trace_metadata["rag_eval.row"] == str(i)
        root, retriever = trace.data.spans
        assert (root.name, root.span_type, root.parent_id) == (ROOT_SPAN, SpanType.CHAIN, None)
        assert root.inputs == {"question": df.question[i]} and root.outputs == {"answer": df.answer[i]}
        assert (retriever.name, retriever.span_type, retriever.parent_id) == (RETRIEVER_SPAN, SpanType.RETRIEVER,
                                                                               root.span_id)
        assert retriever.outputs == [
            {"page_content": c["text"], "metadata": {"rank": rank, "doc_uri": c["id"]}, "id": c["id"]}
            for rank, c in enumerate(df.contexts[i], start=1)
        ]
        feedback = _feedback(trace)
        for key in ("faithfulness", "context_recall", "answer_relevancy", "ndcg_at_10", "mrr"):
            score, error = _cell(row[f"{key}/score"]), _cell(row[f"{key}/error"])
            if score is None and error is None:  # not applicable: no Feedback (MLflow's UI would show "Error")
                assert key not in feedback, (i, key)
                continue
            fb = feedback[key]
            n_feedback += 1
            assert fb.span_id == root.span_id
            assert fb.metadata["mlflow.assessment.sourceRunId"] == run_id
            judged = key not in ("ndcg_at_10", "mrr")
            source = AssessmentSourceType.LLM_JUDGE if judged else AssessmentSourceType.CODE
            assert fb.source.source_type == source
            if judged:
                assert fb.source.source_id == "scripted:/scripted-rules-v1"
                assert fb.metadata["rag_eval.judge_fingerprint"] == fingerprint
            if error is not None:  # a failed judgement is an assessment error, never a value
                n_errors += 1
                assert fb.value is None and fb.error.error_code == "Refusal"
                assert fb.error.error_message == error
            else:
                assert fb.error is None
                assert fb.value == pytest.approx(score, abs=1e-12)
                assert fb.rationale == row[f"{key}/justification"]
        expectations = {a.name: a.value for a in trace.info.assessments if isinstance(a, Expectation)}
        if _cell(df.reference[i]) is None:
            assert expectations == {}
        else:
            grades = df.relevant_ids[i]
            grades = dict.fromkeys(grades, 1) if isinstance(grades, list) else grades
            assert expectations == {"reference": df.reference[i], "relevant_ids": grades}
    assert n_errors == 1 and n_feedback == 17
    evidence = json.loads(_feedback(traces[table.trace_id[0]])["faithfulness"].metadata["rag_eval.evidence"])
    assert evidence["claims"] == [{"claim": "Bikes travel for a flat fare of 5 euros.", "value": True,
                                   "reason": "words found in a passage",
                                   "evidence": "Bikes travel for a flat fare of 5 euros per journey.",
                                   "source_index": 0}]


def test_a_logged_pipeline_links_its_rows_to_the_model(tracking_uri, local_judge):
    from pipeline import load_golden, log_pipeline

    golden = load_golden().head(6)[["question", "reference", "relevant_ids", "answerable"]]
    info = log_pipeline(k=3)  # a logged model of its own: the evaluation run logs no model
    with mlflow.start_run() as run:
        mlflow.models.evaluate(model=info.model_uri, data=golden, model_type="rag", evaluators="rag",
                               evaluator_config={"judge": local_judge, "metrics": ["faithfulness", "hit@5"]})
    logged = MlflowClient().get_run(run.info.run_id)
    assert [m.model_id for m in logged.inputs.model_inputs] == [info.model_id]
    assert logged.data.tags["rag_eval.model_id"] == info.model_id
    traces = _run_traces(run.info.run_id)
    assert len(traces) == 6
    assert {t.info.trace_metadata.get("mlflow.modelId") for t in traces} == {info.model_id}
    by_model = mlflow.search_traces(locations=[logged.info.experiment_id], model_id=info.model_id,
                                    return_type="list", include_spans=False)
    assert sorted(t.info.trace_id for t in by_model) == sorted(t.info.trace_id for t in traces)


class TracedRag(mlflow.pyfunc.PythonModel):
    """A pipeline whose own code is traced: one trace per question, a RETRIEVER span inside."""

    PASSAGES = [{"id": "p1", "text": "Bikes travel for a flat fare of 5 euros per journey."},
                {"id": "p2", "text": "Dogs travel free on all trains."}]

    @mlflow.trace(span_type=SpanType.RETRIEVER)
    def retrieve(self, question):
        return [p for p in self.PASSAGES if set(question.lower().split()) & set(p["text"].lower().split())]

    @mlflow.trace(name="answer_question")
    def answer(self, question):
        contexts = self.retrieve(question)
        return {"answer": contexts[0]["text"] if contexts else "I don't know.", "contexts": contexts}

    def predict(self, context, model_input, params=None):
        return [self.answer(q) for q in model_input["question"]]


class BatchTracedRag(TracedRag):
    """A pipeline tracing the whole batch in one trace."""

    @mlflow.trace(name="predict_batch")
    def predict(self, context, model_input, params=None):
        return [TracedRag.answer.__wrapped__(self, q) for q in model_input["question"]]


QUESTIONS = pd.DataFrame({"question": ["Do dogs travel free?", "What do bikes cost?", "Do dogs travel free?"],
                          "reference": ["Dogs travel free.", "5 euros.", "Dogs travel free."]})


def test_traces_the_pipeline_made_are_the_rows_traces(tracking_uri, local_judge):
    with mlflow.start_run():
        info = mlflow.pyfunc.log_model(name="traced", python_model=TracedRag())
    with mlflow.start_run() as run:
        mlflow.models.evaluate(model=info.model_uri, data=QUESTIONS, model_type="rag", evaluators="rag",
                               evaluator_config={"judge": local_judge, "metrics": ["faithfulness", "context_recall"]})
    traces = _run_traces(run.info.run_id)
    assert len(traces) == 3  # the pipeline's own traces; no synthetic duplicate
    table = _table(run.info.run_id)
    by_id = {t.info.trace_id: t for t in traces}
    for i, trace_id in enumerate(table.trace_id):
        trace = by_id[trace_id]
        root = trace.data._get_root_span()
        assert root.name == "answer_question" and root.inputs == {"question": QUESTIONS.question[i]}
        assert [s.name for s in trace.data.spans if s.span_type == SpanType.RETRIEVER] == ["retrieve"]
        assert trace.info.trace_metadata["mlflow.modelId"] == info.model_id
        feedback = _feedback(trace)
        assert set(feedback) == {"faithfulness", "context_recall"}
        assert feedback["faithfulness"].value == pytest.approx(table["faithfulness/score"][i], abs=1e-12)
        assert feedback["faithfulness"].span_id == root.span_id
        assert {a.name for a in trace.info.assessments if isinstance(a, Expectation)} == {"reference"}
    assert len(set(table.trace_id)) == 3  # the repeated question took the traces in order


def test_a_batch_trace_belongs_to_no_row(tracking_uri, local_judge):
    with mlflow.start_run():
        info = mlflow.pyfunc.log_model(name="batch", python_model=BatchTracedRag())
    with mlflow.start_run() as run:
        mlflow.models.evaluate(model=info.model_uri, data=QUESTIONS, model_type="rag", evaluators="rag",
                               evaluator_config={"judge": local_judge, "metrics": ["faithfulness"]})
    traces = _run_traces(run.info.run_id)
    names = sorted(t.data._get_root_span().name for t in traces)
    assert names == ["predict_batch"] + [ROOT_SPAN] * 3  # the batch trace stays as the pipeline made it
    batch = next(t for t in traces if t.data._get_root_span().name == "predict_batch")
    assert not _feedback(batch)
    assert set(_table(run.info.run_id).trace_id) == {t.info.trace_id for t in traces} - {batch.info.trace_id}


def test_matching_takes_one_question_per_trace():
    class T:  # the two attributes matching reads
        def __init__(self, trace_id, t, inputs):
            root = type("Root", (), {"inputs": inputs})()
            self.info = type("Info", (), {"trace_id": trace_id, "request_time": t})()
            self.data = type("Data", (), {"_get_root_span": lambda self: root})()

    questions = ["a?", "b?", "a?"]
    traces = [T("t-batch", 0, {"model_input": {"question": ["a?", "b?", "a?"]}}), T("t2", 2, {"q": "a?"}),
              T("t1", 1, {"q": "a?", "other": "not a question"}), T("t3", 3, {"question": "b?"}),
              T("t4", 4, {"question": "c?"})]
    assert match_pipeline_traces(traces, questions) == ["t1", "t3", "t2"]
    assert match_pipeline_traces([], questions) == [None, None, None]


def rubric_metric():
    from mlflow_rag_eval.metrics.rubric import rubric

    return rubric("concise", criteria="The answer is short.", steps=["Count the sentences."])


def test_bad_input_stops_before_the_pipeline_runs_and_logs_no_trace(tracking_uri, local_judge):
    calls = []

    class Counting(mlflow.pyfunc.PythonModel):
        def predict(self, context, model_input, params=None):
            calls.append(len(model_input))
            return [{"answer": "x", "contexts": []}] * len(model_input)

    info = mlflow.pyfunc.log_model(name="counting", python_model=Counting())
    bad = pd.DataFrame({"question": ["q1?", "q2?"], "reference": ["r", float("nan")], "relevant_ids": [["a"], "b"]})
    good = bad.assign(relevant_ids=[["a"], ["b"]])
    with mlflow.start_run() as run:
        with pytest.raises(RecordError, match=r"row 1, column 'relevant_ids'"):
            mlflow.models.evaluate(model=info.model_uri, data=bad, model_type="rag", evaluators="rag",
                                   evaluator_config={"judge": local_judge})
        with pytest.raises(ValueError, match="unknown metric 'faithfulnes'"):
            mlflow.models.evaluate(model=info.model_uri, data=good, model_type="rag", evaluators="rag",
                                   evaluator_config={"judge": local_judge, "metrics": ["hit@5", "faithfulnes"]})
        with pytest.raises(JudgeCapabilityError, match="'concise' needs"):  # the local judge grades no rubric
            mlflow.models.evaluate(model=info.model_uri, data=good, model_type="rag", evaluators="rag",
                                   evaluator_config={"judge": local_judge, "metrics": [rubric_metric()]})
    assert calls == []  # the pipeline never ran
    experiment_id = run.info.experiment_id
    assert mlflow.search_traces(locations=[experiment_id], return_type="list") == []
    data = MlflowClient().get_run(run.info.run_id).data
    assert data.metrics == {} and "mlflow.runType" not in data.tags


def test_log_traces_false_logs_the_rest(tracking_uri, local_judge):
    with mlflow.start_run() as run:
        mlflow.models.evaluate(data=frame(), model_type="rag", evaluators="rag",
                               evaluator_config={"judge": local_judge, "metrics": ["hit@5"], "log_traces": False})
    assert _run_traces(run.info.run_id) == []
    data = MlflowClient().get_run(run.info.run_id).data
    assert figures_of(run.info.run_id)["hit_at_5/n_scored"] == 3 and data.tags["mlflow.runType"] == "genai_evaluate"
    assert _table(run.info.run_id).trace_id.isna().all()
    with mlflow.start_run(), pytest.raises(ValueError, match="log_traces"):
        mlflow.models.evaluate(data=frame(), model_type="rag", evaluators="rag",
                               evaluator_config={"metrics": ["hit@5"], "log_traces": "no"})


def test_compact_evidence_fits_and_says_what_it_dropped():
    claims = [{"claim": f"claim {i} " + "word " * 100, "value": i % 2 == 0, "reason": "r"} for i in range(40)]
    text = compact_evidence({"claims": claims, "note": "n"})
    assert len(text) <= EVIDENCE_CHARS
    doc = json.loads(text)
    assert doc["claims_more"] == 40 - len(doc["claims"]) > 0
    assert all(len(c["claim"]) <= 300 for c in doc["claims"]) and doc["note"] == "n"
    assert compact_evidence({}) is None


def test_genai_route_runs_hold_what_the_evaluator_runs_hold(tracking_uri, monkeypatch):
    from mlflow_rag_eval import rag_scorers
    from mlflow_rag_eval.compare import compare_runs

    monkeypatch.setenv("MLFLOW_GENAI_EVAL_MAX_WORKERS", "2")
    df = frame()
    judge = refusing_judge("refuse")
    with mlflow.start_run() as plugin:
        mlflow.models.evaluate(data=df, model_type="rag", evaluators="rag",
                               evaluator_config={"judge": judge, "metrics": METRICS})
    rows = []
    for r in df.itertuples():
        expectations = {"reference": r.reference, "relevant_ids": r.relevant_ids}
        rows.append({"inputs": {"question": r.question}, "outputs": {"answer": r.answer, "contexts": r.contexts},
                     "expectations": {k: v for k, v in expectations.items() if v is not None}})
    with mlflow.start_run() as genai:
        mlflow.genai.evaluate(data=rows, scorers=rag_scorers(METRICS, judge))
    a, b = (MlflowClient().get_run(r.info.run_id).data for r in (plugin, genai))
    for key in ("rag_eval.evaluated", "rag_eval.judge_fingerprint", "rag_eval.dataset_digest", "mlflow.runType"):
        assert a.tags[key] == b.tags[key], key
    # the seal's digests are of each run's own table (its trace ids) and lineage (its timings)
    digests = {"rag_eval.seal.rows_sha256", "rag_eval.seal.lineage_sha256"}
    assert {k: v for k, v in a.params.items() if k not in digests} == {
        k: v for k, v in b.params.items() if k not in digests}
    assert digests <= set(a.params) and digests <= set(b.params)
    assert a.metrics == pytest.approx(b.metrics, abs=1e-12)  # the means and CI bounds
    figures = figures_of(genai.info.run_id)
    assert figures == pytest.approx(figures_of(plugin.info.run_id), abs=1e-12)  # n_error included
    assert figures["faithfulness/n_error"] == 1
    table = _table(genai.info.run_id)
    traces = {t.info.trace_id: t for t in _run_traces(genai.info.run_id)}
    assert set(table.trace_id) == set(traces)
    for _, row in table.iterrows():
        feedback = _feedback(traces[row.trace_id])
        if _cell(row["ndcg_at_10/score"]) is None and _cell(row["ndcg_at_10/error"]) is None:
            assert "ndcg_at_10" not in feedback  # not applicable: no assessment
        if _cell(row["faithfulness/error"]) is not None:
            assert feedback["faithfulness"].value is None
            assert feedback["faithfulness"].error.error_code == "Refusal"
    comparison = compare_runs(plugin.info.run_id, genai.info.run_id, log_to=None)  # accepted
    assert {d.metric for d in comparison.deltas} == {"faithfulness", "context_recall", "answer_relevancy",
                                                     "ndcg_at_10", "mrr"}
    assert all(d.delta == pytest.approx(0, abs=1e-12) for d in comparison.deltas if d.delta is not None)


def test_the_file_store_gets_the_traces_too(tmp_path, monkeypatch, local_judge):
    """MLflow's legacy file store cannot log spans: each trace's spans go up as its artifact."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.delenv("MLFLOW_EXPERIMENT_ID", raising=False)
    mlflow.set_tracking_uri((tmp_path / "mlruns").as_uri())
    try:
        experiment_id = mlflow.create_experiment("file-store")
        with mlflow.start_run(experiment_id=experiment_id) as run:
            mlflow.models.evaluate(data=frame(), model_type="rag", evaluators="rag",
                                   evaluator_config={"judge": local_judge, "metrics": ["faithfulness", "mrr"]})
        traces = _run_traces(run.info.run_id)
        assert len(traces) == 4
        for trace in traces:
            assert [s.name for s in trace.data.spans] == [ROOT_SPAN, RETRIEVER_SPAN]
            assert "faithfulness" in _feedback(trace)
    finally:
        mlflow.set_tracking_uri(None)


def test_an_evaluation_run_that_logged_its_model_is_warned_about(tracking_uri, local_judge, caplog):
    from pipeline import load_golden, log_pipeline

    golden = load_golden().head(3)[["question", "reference", "relevant_ids"]]
    with mlflow.start_run():
        info = log_pipeline(k=2)  # the model logged inside the evaluation run
        with caplog.at_level("WARNING", logger="mlflow_rag_eval.tracking.run_logging"):
            mlflow.models.evaluate(model=info.model_uri, data=golden, model_type="rag", evaluators="rag",
                                   evaluator_config={"judge": local_judge, "metrics": ["hit@5"]})
    assert any("Evaluation runs page lists only runs that logged none" in r.message for r in caplog.records)


def test_a_row_trace_lasts_the_rows_latency_when_the_data_has_it(tracking_uri):
    """Issue 37: every synthetic trace showed a duration of 0.00ms. A latency_ms column (or the
    model's output of that name) is the row's duration: the root span lasts it, and so does the
    trace. A row without one stays an instant, as a batch prediction times no row."""
    df = frame().drop(columns=["relevant_ids"])
    df["latency_ms"] = [1250.0, 80, None, 3.5]
    with mlflow.start_run() as run:
        mlflow.models.evaluate(data=df, model_type="rag", evaluators="rag",
                               evaluator_config={"judge": "scripted", "metrics": ["faithfulness"]})
    traces = {int(t.info.trace_metadata["rag_eval.row"]): t for t in _run_traces(run.info.run_id)}
    for row, latency in enumerate(df["latency_ms"]):
        trace = traces[row]
        root = next(s for s in trace.data.spans if s.name == ROOT_SPAN)
        if latency is None or math.isnan(latency):
            assert trace.info.execution_duration == 0 and root.end_time_ns == root.start_time_ns
            continue
        assert root.end_time_ns - root.start_time_ns == round(latency * 1_000_000), row
        # in whole milliseconds (the store may round the span's ends: 3.5 ms reads 3 or 4)
        assert abs(trace.info.execution_duration - latency) <= 1, (row, trace.info.execution_duration)
        assert abs(trace.info.request_time - root.start_time_ns / 1_000_000) <= 1
    with mlflow.start_run(), pytest.raises(RecordError, match="row 1, column 'latency_ms': must be a number"):
        bad = df.assign(latency_ms=[1.0, -2.0, None, 3.0])
        mlflow.models.evaluate(data=bad, model_type="rag", evaluators="rag",
                               evaluator_config={"judge": "scripted", "metrics": ["faithfulness"]})
