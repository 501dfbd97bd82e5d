"""One vocabulary: the evaluator plugin, extra_metrics and genai scorers give the same metric
keys and the same values for the same records and judge."""

from __future__ import annotations

import mlflow
import pandas as pd
import pytest
from conftest import figures_of

from mlflow_rag_eval.routes.extra_metrics import rag_metrics
from mlflow_rag_eval.routes.scorers import rag_scorers

METRICS = ["faithfulness", "answer_relevancy", "context_recall", "context_precision", "ndcg@10", "mrr"]


@pytest.fixture(scope="module")
def golden():
    from pipeline import load_golden

    df = load_golden()
    picked = pd.concat([df[df.answerable].head(6), df[~df.answerable].head(2)])
    return picked[["question", "reference", "relevant_ids", "answerable"]].reset_index(drop=True)


def _plugin(data, local_judge, **kwargs):
    with mlflow.start_run():
        return mlflow.models.evaluate(data=data, model_type="rag", evaluators="rag",
                                      evaluator_config={"judge": local_judge, "metrics": METRICS},
                                      **kwargs).metrics


def _extra_metrics(data, local_judge, **kwargs):
    with mlflow.start_run():
        return mlflow.models.evaluate(data=data, model_type=None,
                                      extra_metrics=rag_metrics(METRICS, local_judge), **kwargs).metrics


def _scorers(rows, local_judge, predict_fn=None):
    """What the genai route's run holds: MLflow's aggregates plus the rag_eval contents the
    scorers write; the object ``mlflow.genai.evaluate`` returns holds the same keys and values
    (n_error, and the CI bounds where the run has them)."""
    result = mlflow.genai.evaluate(data=rows, scorers=rag_scorers(METRICS, local_judge), predict_fn=predict_fn)
    held = mlflow.MlflowClient().get_run(result.run_id).data.metrics
    _assert_same(held, result.metrics)
    return held


def _assert_same(reference: dict, other: dict, *, n_error: bool = True):
    keys = {k for k in reference if n_error or not k.endswith("/n_error")}
    assert keys == set(other) - ({k for k in other if k.endswith("/n_error")} if not n_error else set())
    for key in keys:
        assert other[key] == pytest.approx(reference[key], abs=1e-12), key


def test_static_predictions_same_keys_and_values_on_every_route(tracking_uri, golden, local_judge):
    from pipeline import BM25, extract_answer, load_corpus

    index = BM25(load_corpus())
    data = golden.copy()
    data["contexts"] = [[{"id": p["id"], "text": p["text"]} for p, _ in index.search(q, 4)] for q in data.question]
    data["answer"] = [extract_answer(q, c, 0.34) for q, c in zip(data.question, data.contexts)]

    plugin = _plugin(data, local_judge, predictions="answer")
    extra = _extra_metrics(data, local_judge, predictions="answer")
    rows = [
        {"inputs": {"question": r.question}, "outputs": {"answer": r.answer, "contexts": r.contexts},
         "expectations": {"reference": r.reference, "relevant_ids": r.relevant_ids, "answerable": r.answerable}}
        for r in data.itertuples()
    ]
    scored = _scorers(rows, local_judge)

    assert {k.split("/")[0] for k in plugin} == {"faithfulness", "answer_relevancy", "context_recall",
                                                 "context_precision", "ndcg_at_10", "mrr"}
    _assert_same(plugin, extra)
    _assert_same(plugin, scored)


def test_logged_pyfunc_same_values_on_every_route(tracking_uri, golden, local_judge):
    from pipeline import log_pipeline

    with mlflow.start_run():
        info = log_pipeline(k=3)
    plugin = _plugin(golden, local_judge, model=info.model_uri)
    extra = _extra_metrics(golden, local_judge, model=info.model_uri, predictions="answer")

    model = mlflow.pyfunc.load_model(info.model_uri)

    def predict_fn(question):
        return model.predict(pd.DataFrame({"question": [question]}))[0]

    rows = [{"inputs": {"question": r.question},
             "expectations": {"reference": r.reference, "relevant_ids": r.relevant_ids, "answerable": r.answerable}}
            for r in golden.itertuples()]
    scored = _scorers(rows, local_judge, predict_fn=predict_fn)
    _assert_same(plugin, scored)
    _assert_same(plugin, extra)


def _traced_rag(question: str, documents: list[dict], answer: str):
    """The trace of a pipeline whose RETRIEVER span returned ``documents``."""
    from mlflow.entities import SpanType

    @mlflow.trace(span_type=SpanType.RETRIEVER)
    def retrieve(question):
        return documents

    @mlflow.trace
    def rag(question):
        retrieve(question)
        return answer

    rag(question)
    mlflow.flush_trace_async_logging()
    return mlflow.get_trace(mlflow.get_last_active_trace_id())


def test_scorer_reads_contexts_from_retriever_spans_and_names_its_source(tracking_uri, local_judge):
    from mlflow.entities import AssessmentSourceType

    trace = _traced_rag(
        "How much is a bike ticket?",
        [{"page_content": "A bike ticket costs 5 euros per journey.", "metadata": {"doc_uri": "p1"}, "id": "p1"}],
        "A bike ticket costs 5 euros.")
    faithfulness, ndcg = rag_scorers(["faithfulness", "ndcg@10"], local_judge)
    feedback = faithfulness(inputs={"question": "How much is a bike ticket?"},
                            outputs="A bike ticket costs 5 euros.", trace=trace)
    assert feedback.value == 1.0 and feedback.error is None
    assert feedback.source.source_type == AssessmentSourceType.LLM_JUDGE
    # The judge by name, its fingerprint beside: the same Feedback the rag evaluator logs.
    assert feedback.source.source_id == "local:minilm-l6"
    assert feedback.metadata["rag_eval.judge_fingerprint"] == local_judge.info().fingerprint
    assert '"claim": "A bike ticket costs 5 euros."' in feedback.metadata["rag_eval.evidence"]
    retrieval = ndcg(inputs={"question": "q"}, outputs="a", trace=trace, expectations={"relevant_ids": ["p1"]})
    assert retrieval.value == 1.0 and retrieval.source.source_type == AssessmentSourceType.CODE


def test_scorer_reads_parent_ids_from_retriever_span_metadata(tracking_uri):
    """Chunks of one document, named by opaque ids: the retriever's metadata ``parent_id``
    is what the parent-grain metrics rank by."""
    trace = _traced_rag("q", [{"page_content": f"chunk {i}", "id": f"c{i}", "metadata": {"parent_id": doc}}
                              for i, doc in enumerate(["guide", "guide", "faq"])], "an answer")
    parent_mrr, pollution = rag_scorers(["parent_mrr", "pollution@3"], None)
    # faq is the second distinct document: reciprocal rank 1/2 (the chunk grain would say 1/3)
    assert parent_mrr(inputs={"question": "q"}, outputs="a", trace=trace,
                      expectations={"relevant_ids": ["faq"]}).value == 0.5
    # the second slot repeats "guide": one of three slots polluted
    assert pollution(inputs={"question": "q"}, outputs="a", trace=trace).value == 1 / 3


def test_scorer_turns_bad_input_into_a_named_error(local_judge):
    (faithfulness,) = rag_scorers(["faithfulness"], local_judge)
    feedback = faithfulness(inputs={"question": ""}, outputs={"answer": "x", "contexts": []})
    assert feedback.value is None
    assert "RecordError" in feedback.error.error_code or "RecordError" in str(feedback.error.error_message)


def test_scorers_check_the_rows_they_are_given_up_front_naming_the_row(tracking_uri, local_judge):
    """As the plugin route refuses bad data before any judge call: the first bad cell, by its
    row in the data, and no run; MLflow itself hands a scorer one row without its position."""
    from mlflow_rag_eval.records import RecordError

    def row(question, contexts, relevant=("p1",)):
        return {"inputs": {"question": question}, "outputs": {"answer": "A bike ticket costs 5 euros.",
                                                               "contexts": contexts},
                "expectations": {"relevant_ids": list(relevant)}}

    good = [{"id": "p1", "text": "A bike ticket costs 5 euros."}]
    rows = [row("How much is a bike ticket?", good), row("Can dogs travel?", good),
            row("   ", good), row("Is there wifi?", "not a list")]
    with pytest.raises(RecordError, match="row 2, column 'question'"):
        rag_scorers(["faithfulness", "mrr"], local_judge, data=rows)
    rows[2] = row("Where is the office?", good)
    with pytest.raises(RecordError, match="row 3, column 'contexts'"):
        rag_scorers(["faithfulness"], local_judge, data=rows)
    rows[3] = row("Is there wifi?", ["Seats recline."])  # no ids: what mrr needs
    with pytest.raises(RecordError, match="row 3, column 'contexts': mrr needs an id"):
        rag_scorers(["faithfulness", "mrr"], local_judge, data=pd.DataFrame(rows))
    assert mlflow.search_runs().empty  # nothing was evaluated
    # the same rows for a predict_fn: only what the data holds is checked
    questions = [{"inputs": r["inputs"], "expectations": r["expectations"]} for r in rows]
    assert [s.name for s in rag_scorers(["mrr"], local_judge, data=questions)] == ["mrr"]
    scorers = rag_scorers(["faithfulness"], local_judge, data=rows)
    result = mlflow.genai.evaluate(data=rows, scorers=scorers)
    assert figures_of(result.run_id)["faithfulness/n_scored"] == 4


def test_every_route_logs_the_same_worst10_mean_in_each_metrics_direction(tracking_uri):
    """No judge: mrr (higher is better) and pollution@3 (lower is better) from ids. Each
    route logs ``<key>/worst10_mean``, the mean of the worst ceil(n / 10) rows: for pollution
    the highest (the rows at 2/3 and 1/3), not the 0 of the clean rows (``run_metrics="all"``:
    by default the run logs the means, and the rest is in its statistics table)."""
    parents = [["a", "b", "c"], ["a", "a", "a"], ["a", "a", "b"]] + [["a", "b", "c"]] * 9
    contexts = [[{"id": f"c{r}-{i}", "text": f"chunk {i}", "parent_id": p} for i, p in enumerate(ps)]
                for r, ps in enumerate(parents)]
    relevant = [[f"c{r}-{r % 3}"] for r in range(len(parents))]
    data = pd.DataFrame({"question": [f"question {r}" for r in range(len(parents))], "answer": "an answer",
                         "contexts": contexts, "relevant_ids": relevant})
    metrics = ["mrr", "pollution@3"]
    with mlflow.start_run():
        plugin = mlflow.models.evaluate(data=data, model_type="rag", evaluators="rag", predictions="answer",
                                        evaluator_config={"metrics": metrics, "log_traces": False,
                                                          "run_metrics": "all"}).metrics
    with mlflow.start_run():
        extra = mlflow.models.evaluate(data=data, model_type=None, predictions="answer",
                                       extra_metrics=rag_metrics(metrics, None, run_metrics="all")).metrics
    rows = [{"inputs": {"question": r.question}, "outputs": {"answer": r.answer, "contexts": r.contexts},
             "expectations": {"relevant_ids": r.relevant_ids}} for r in data.itertuples()]
    result = mlflow.genai.evaluate(data=rows, scorers=rag_scorers(metrics, None, run_metrics="all"))
    scored = mlflow.MlflowClient().get_run(result.run_id).data.metrics

    assert plugin["pollution_at_3/worst10_mean"] == pytest.approx((2 / 3 + 1 / 3) / 2)  # 12 rows: the worst 2
    assert plugin["mrr/worst10_mean"] == pytest.approx(1 / 3)  # relevant at rank 3 on 4 rows: two of them
    assert plugin["pollution_at_3/p10"] == 0.0
    _assert_same(plugin, extra)
    _assert_same(plugin, scored)
    _assert_same(plugin, result.metrics)  # the object genai.evaluate returns, as the run


def test_one_golden_set_has_one_name_and_digest_on_every_route(tracking_uri, golden, tmp_path):
    """Issue 45: the same rows through the plugin (a bare DataFrame, which MLflow logs as
    ``dataset`` under a digest of its own), the genai scorers and the CLI each name the golden
    set golden-<digest8> under the digest every route logs; a name given is kept; a frame passed
    through ``golden_dataset`` is the run's one input."""
    from click.testing import CliRunner

    from mlflow_rag_eval.cli import main
    from mlflow_rag_eval.golden import golden_dataset

    data = golden.head(4).copy()
    data["contexts"] = [[{"id": "p1", "text": "A passage."}, {"id": "p2", "text": "Another."}]] * len(data)
    data["answer"] = "An answer."
    cheap = ["mrr", "hit@5"]
    client = mlflow.MlflowClient()

    def golden_inputs(run_id: str) -> tuple[str, set[tuple[str, str]]]:
        run = client.get_run(run_id)
        digest = run.data.params["rag_eval.dataset_digest"]
        return digest, {(d.dataset.name, d.dataset.digest) for d in run.inputs.dataset_inputs
                        if d.dataset.digest == digest}

    runs = {}
    with mlflow.start_run() as run:
        mlflow.models.evaluate(data=data, model_type="rag", evaluators="rag", predictions="answer",
                               evaluator_config={"metrics": cheap})
    runs["plugin"] = run.info.run_id
    rows = [{"inputs": {"question": r.question}, "outputs": {"answer": r.answer, "contexts": r.contexts},
             "expectations": {"reference": r.reference, "relevant_ids": r.relevant_ids, "answerable": r.answerable}}
            for r in data.itertuples()]
    runs["scorers"] = mlflow.genai.evaluate(data=rows, scorers=rag_scorers(cheap)).run_id
    path = tmp_path / "rows.jsonl"
    data.to_json(path, orient="records", lines=True)
    result = CliRunner().invoke(main, ["evaluate", "--data", str(path), "--metrics", ",".join(cheap), "--no-progress"])
    assert result.exit_code == 0, result.output
    runs["cli"] = result.stdout.strip().splitlines()[-1]

    found = {route: golden_inputs(run_id) for route, run_id in runs.items()}
    (digest,) = {d for d, _ in found.values()}
    assert all(inputs == {(f"golden-{digest[:8]}", digest)} for _, inputs in found.values()), found
    note = client.get_run(runs["plugin"]).data.tags["mlflow.note.content"]
    assert f"**golden-{digest[:8]}**" in note  # the description names it too

    with mlflow.start_run() as named:
        mlflow.models.evaluate(data=data, model_type="rag", evaluators="rag", predictions="answer",
                               evaluator_config={"metrics": cheap, "dataset_name": "northwind-4"})
    assert golden_inputs(named.info.run_id)[1] == {("northwind-4", digest)}
    with mlflow.start_run() as passed:
        mlflow.models.evaluate(data=golden_dataset(data, predictions="answer"), model_type="rag", evaluators="rag",
                               evaluator_config={"metrics": cheap})
    inputs = client.get_run(passed.info.run_id).inputs.dataset_inputs
    assert [(d.dataset.name, d.dataset.digest) for d in inputs] == [(f"golden-{digest[:8]}", digest)]
