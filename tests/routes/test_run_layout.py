"""What an evaluation run shows a person in the MLflow UI: each metric's mean and CI bounds as
run metrics (the rest in its statistics table, unless ``run_metrics="all"``, on every route),
each logged once, the evaluated model linked once, the judge and the golden set named, a
description with rounded figures and a link to the report."""

from __future__ import annotations

import json

import mlflow
import pandas as pd
import pytest

from mlflow_rag_eval.evaluation.engine import evaluate_records
from mlflow_rag_eval.evaluation.slices import attach_columns, compute_slices
from mlflow_rag_eval.evaluation.statistics import ALL_ROWS, STATISTICS_FILE
from mlflow_rag_eval.keys import RUN_STATS, split_aggregate_key
from mlflow_rag_eval.records import records_from_frame
from mlflow_rag_eval.routes.extra_metrics import rag_metrics
from mlflow_rag_eval.routes.scorers import rag_scorers

RETRIEVAL = ["hit@5", "mrr", "ndcg@10"]  # no judge: quick on every route


@pytest.fixture(scope="module")
def golden():
    from pipeline import load_golden

    df = load_golden()
    picked = pd.concat([df[df.answerable].head(8), df[~df.answerable].head(2)])
    return picked[["question", "reference", "relevant_ids", "answerable"]].reset_index(drop=True)


def _static(golden) -> pd.DataFrame:
    from pipeline import BM25, extract_answer, load_corpus

    index = BM25(load_corpus())
    data = golden.copy()
    data["contexts"] = [[{"id": p["id"], "text": p["text"]} for p, _ in index.search(q, 4)] for q in data.question]
    data["answer"] = [extract_answer(q, c, 0.34) for q, c in zip(data.question, data.contexts)]
    data["kind"] = ["answerable" if a else "unanswerable" for a in data.answerable]
    return data


def _statistics(run_id: str) -> pd.DataFrame:
    table = json.loads(mlflow.artifacts.load_text(f"runs:/{run_id}/{STATISTICS_FILE}"))
    return pd.DataFrame(table["data"], columns=table["columns"])


def _old_keys(data, metrics) -> set[str]:
    """Every statistic of the run and of each slice, as runs logged them all before."""
    records = attach_columns(records_from_frame(data), data, ["kind"])
    result = evaluate_records(records, metrics, None, progress=False)
    return set(result.aggregates()) | set(compute_slices(result, ["kind"]).as_metrics())


def _plugin(data, **config) -> str:
    with mlflow.start_run() as run:
        mlflow.models.evaluate(data=data, predictions="answer", model_type="rag", evaluators="rag",
                               evaluator_config={"metrics": RETRIEVAL, "slice_by": ["kind"], "log_traces": False,
                                                 **config})
    return run.info.run_id


def _extra(data, **options) -> str:
    with mlflow.start_run() as run:
        mlflow.models.evaluate(data=data, predictions="answer", model_type=None,
                               extra_metrics=rag_metrics(RETRIEVAL, **options))
    return run.info.run_id


def _genai(data, **options) -> str:
    rows = [{"inputs": {"question": r.question}, "outputs": {"answer": r.answer, "contexts": r.contexts},
             "expectations": {"relevant_ids": r.relevant_ids}, "tags": {"kind": r.kind}} for r in data.itertuples()]
    return mlflow.genai.evaluate(data=rows, scorers=rag_scorers(RETRIEVAL, slice_by=["kind"], **options)).run_id


def test_a_run_logs_the_means_and_keeps_the_rest_in_its_statistics_table(tracking_uri, golden):
    data = _static(golden)
    run_id = _plugin(data)
    metrics = mlflow.MlflowClient().get_run(run_id).data.metrics
    assert {split_aggregate_key(k)[1] for k in metrics} == set(RUN_STATS)
    assert {k.split("/")[0] for k in metrics} == {"hit_at_5", "mrr", "ndcg_at_10"}
    table = _statistics(run_id)
    assert list(table["slice"].unique()) == [ALL_ROWS, "kind=answerable", "kind=unanswerable"]
    whole = table[table["slice"] == ALL_ROWS].set_index("metric")
    assert whole.loc["mrr", "n_scored"] == 8 and whole.loc["mrr", "n_skipped"] == 2  # no relevant ids: skipped
    assert whole.loc["mrr", "mean"] == round(metrics["mrr/mean"], 4)  # rounded: a table to read
    assert {"median", "p10", "worst10_mean", "n_error"} <= set(table.columns)


@pytest.mark.parametrize("route", [_plugin, _extra, _genai], ids=["evaluator", "extra_metrics", "genai_scorers"])
def test_run_metrics_all_logs_every_statistic_as_before_on_every_route(tracking_uri, golden, route):
    data = _static(golden)
    means = mlflow.MlflowClient().get_run(route(data)).data.metrics
    assert {split_aggregate_key(k)[1] for k in means} <= set(RUN_STATS) and "mrr/mean" in means
    every = mlflow.MlflowClient().get_run(route(data, run_metrics="all")).data.metrics
    old = _old_keys(data, RETRIEVAL)
    if route is _extra:  # MLflow's default evaluator: no slices, and it adds metrics of its own
        old = {k for k in old if "/slice/" not in k}
        every = {k: v for k, v in every.items() if k.split("/")[0] in {"hit_at_5", "mrr", "ndcg_at_10"}}
    assert set(every) == old


def test_the_option_is_checked(tracking_uri, golden):
    with pytest.raises(ValueError, match="run_metrics.* must be one of 'means', 'all', got 'every'"):
        _plugin(_static(golden), run_metrics="every")
    with pytest.raises(ValueError, match="run_metrics must be one of"):
        rag_scorers(RETRIEVAL, run_metrics="slices")


def test_a_logged_model_gets_each_metric_once_and_one_model_input(tracking_uri, golden, local_judge):
    """mlflow.evaluate logs the metrics an evaluator returns for a logged model (linked to it and
    to the dataset): the evaluator logging them too gave every key two history entries, and the
    model's metrics two sets (one without the dataset)."""
    from pipeline import log_pipeline

    info = log_pipeline(k=3)  # outside the run, as the demo does
    data = mlflow.data.from_pandas(golden, name="golden-13", digest="d1gest")
    with mlflow.start_run() as run:
        result = mlflow.models.evaluate(model=info.model_uri, data=data, model_type="rag", evaluators="rag",
                                        evaluator_config={"judge": local_judge,
                                                          "metrics": ["faithfulness", "mrr", "hit@5"]})
    client = mlflow.MlflowClient()
    logged = client.get_run(run.info.run_id)
    assert set(logged.data.metrics) == set(result.metrics) and "faithfulness/mean" in result.metrics
    for key in logged.data.metrics:
        assert len(client.get_metric_history(run.info.run_id, key)) == 1, key
    assert [m.model_id for m in logged.inputs.model_inputs] == [info.model_id]
    model_metrics = client.get_logged_model(info.model_id).metrics
    assert sorted(m.key for m in model_metrics) == sorted(result.metrics)  # each key once
    assert {(m.dataset_name, m.dataset_digest) for m in model_metrics} == {("golden-13", "d1gest")}
    # the dataset input is the golden set, by name and digest
    assert [(d.dataset.name, d.dataset.digest) for d in logged.inputs.dataset_inputs] == [("golden-13", "d1gest")]


def test_the_run_names_its_judge_and_golden_set_and_links_its_report(tracking_uri, golden, local_judge):
    from pipeline import DATA_DIR

    from mlflow_rag_eval.golden import golden_dataset
    from mlflow_rag_eval.golden.generate import generate_golden_set, load_passages

    gold = generate_golden_set(load_passages(DATA_DIR / "corpus.jsonl"), "scripted", n=8, seed=0)
    frame = gold.to_frame()
    frame["answer"] = frame["reference"].fillna("I cannot tell from the documents.")
    frame["contexts"] = [[{"id": g["id"], "text": "A bike ticket costs 5 euros."} for g in grades]
                         or [{"id": "x", "text": "The station opens at six."}] for grades in frame["relevant_ids"]]
    data = golden_dataset(gold, "northwind-8")
    data = mlflow.data.from_pandas(frame, name=data.name, digest=data.digest, predictions="answer")
    with mlflow.start_run() as run:
        mlflow.models.evaluate(data=data, model_type="rag", evaluators="rag",
                               evaluator_config={"judge": local_judge, "metrics": ["faithfulness", "mrr"]})
    got = mlflow.MlflowClient().get_run(run.info.run_id)
    assert [(d.dataset.name, d.dataset.digest) for d in got.inputs.dataset_inputs] == [("northwind-8", gold.digest)]
    assert got.data.params["rag_eval.dataset_digest"] == gold.digest  # the golden set's digest on both
    assert got.data.tags["rag_eval.judge"] == "local:minilm-l6"
    note = got.data.tags["mlflow.note.content"]
    assert "judged by **local:minilm-l6**" in note and "**northwind-8**" in note
    report = f"(#/experiments/{got.info.experiment_id}/runs/{run.info.run_id}/artifacts/rag_eval/report.html)"
    assert f"[Open the report]{report}" in note
    faithfulness = got.data.metrics["faithfulness/mean"]
    assert f"| faithfulness ↑ | {faithfulness:.3f} |" in note  # rounded for reading; the metric is not


def test_the_report_prints_no_absolute_path_of_the_model_files(tracking_uri, local_judge):
    from mlflow_rag_eval.report import render_report

    data = pd.DataFrame({"question": ["q"], "answer": ["A bike ticket costs 5 euros."],
                         "contexts": [["A bike ticket costs 5 euros."]]})
    result = evaluate_records(records_from_frame(data), ["faithfulness"], local_judge, progress=False)
    from mlflow_rag_eval.tracking.run_logging import lineage

    path = local_judge.info().model
    assert path.startswith("/")  # what the lineage records: where this machine keeps the files
    page = render_report(result, lineage(result))
    assert path not in page
    assert "/".join(path.rstrip("/").split("/")[-2:]) in page  # the folder's name, and its parent's


def test_assert_metrics_meet_reads_the_counts_of_a_run_that_logs_means(tracking_uri, golden):
    from mlflow_rag_eval.pytest_plugin import assert_metrics_meet

    data = _static(golden)
    run_id = _plugin(data)
    assert "mrr/n_scored" not in mlflow.MlflowClient().get_run(run_id).data.metrics
    policy = {"require_metrics": ["mrr"], "min_scored_rows": 8, "max_error_rate": 0.0}
    assert_metrics_meet(run_id, policy)  # 8 scored rows, none failed: from its rows table
    with pytest.raises(AssertionError, match="mrr: 8 scored rows < 9"):
        assert_metrics_meet(run_id, {**policy, "min_scored_rows": 9})
