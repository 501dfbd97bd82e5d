"""Loud, not silent: bad configuration and bad input refused up front, the default suite made of
what the data can feed (and what it left out said), a summary at the end of every evaluation,
``max_error_rate`` failing an evaluation, and the genai route's lost and context-less rows."""

from __future__ import annotations

import json
import logging

import mlflow
import pandas as pd
import pytest
from conftest import figures_of, refusing_judge
from mlflow import MlflowClient

from mlflow_rag_eval.evaluation.engine import evaluate_records
from mlflow_rag_eval.records import RecordError, records_from_frame
from mlflow_rag_eval.results import ErrorRateExceeded

BIKE = {"id": "p1", "text": "Bikes travel for a flat fare of 5 euros per journey."}
DOGS = {"id": "p2", "text": "Dogs travel free on all trains."}


def frame(**extra) -> pd.DataFrame:
    df = pd.DataFrame({
        "question": ["How much does a bike ticket cost?", "Do dogs pay?", "Can I bring my cat?"],
        "answer": ["Bikes travel for a flat fare of 5 euros.", "Dogs travel free on all trains.", "I don't know."],
        "contexts": [[BIKE, DOGS], [DOGS], [DOGS]],
        "reference": ["A bike ticket costs 5 euros.", "Dogs travel free.", "Cats travel free in a carrier."],
        "relevant_ids": [["p1"], ["p2"], ["p9"]],
    })
    for name, values in extra.items():
        df[name] = values
    return df


def _evaluate(data, config, **kwargs):
    return mlflow.models.evaluate(data=data, model_type="rag", evaluators="rag", evaluator_config=config, **kwargs)


def _assert_nothing_logged(run_id: str) -> None:
    run = MlflowClient().get_run(run_id)
    assert run.data.metrics == {} and "mlflow.runType" not in run.data.tags
    assert mlflow.search_traces(locations=[run.info.experiment_id], return_type="list") == []


# -- refused up front ---------------------------------------------------------------------------

@pytest.mark.parametrize("config, error, message", [
    ({"metrics": ["hit@0"]}, ValueError, "hit@0: the cut-off k must be an integer of at least 1"),
    ({"metrics": ["ndcg@0", "mrr"]}, ValueError, "ndcg@0"),
    ({"metrics": "faithfulness"}, ValueError, r"a list of metric names, got the single metric 'faithfulness'"),
    ({"metrics": ["faithfulness", "faithfulness"]}, ValueError, "named twice"),
    ({"metrics": ["abstention"]}, RecordError, "column 'answerable'"),
    ({"metrics": ["hit@5"], "max_error_rate": 2}, ValueError, r"max_error_rate'\] must be a number in \[0, 1\]"),
])
def test_a_wrong_configuration_is_refused_before_anything_runs(tracking_uri, local_judge, config, error, message):
    with mlflow.start_run() as run, pytest.raises(error, match=message):
        _evaluate(frame(), {"judge": local_judge, **config})
    _assert_nothing_logged(run.info.run_id)


def test_a_duplicate_column_is_refused_naming_it(tracking_uri, local_judge):
    df = frame()
    twice = pd.concat([df, pd.DataFrame({"answer": ["x", "y", "z"]})], axis=1)
    with mlflow.start_run() as run, pytest.raises(RecordError, match="column 'answer': the data has 2 columns"):
        _evaluate(twice, {"judge": local_judge, "metrics": ["faithfulness"]})
    _assert_nothing_logged(run.info.run_id)
    with pytest.raises(RecordError, match="column 'answer'"):
        records_from_frame(twice)


def test_an_empty_optional_cell_is_an_absent_expectation_and_the_summary_says_so(local_judge):
    """An empty reference (None, or the NaN pandas makes of it) means "no reference for this
    row": metrics needing one skip the row, and the end-of-run summary counts it with why."""
    df = frame()
    df.loc[1, "reference"] = None
    records = records_from_frame(df)
    assert records[1].reference is None
    result = evaluate_records(records, ["context_recall"], local_judge)
    assert result.metrics[0].skip_reasons() == [("no reference answer", 1)]
    assert "not applicable 1x: no reference answer" in result.summary_text()
    for bad, column in (({"question": None}, "question"), ({"answer": float("nan")}, "answer"),
                        ({"contexts": None}, "contexts")):
        broken = frame()
        broken.loc[0, list(bad)] = list(bad.values())
        with pytest.raises(RecordError, match=f"row 0, column '{column}'"):
            records_from_frame(broken)


# -- the default suite ----------------------------------------------------------------------------

def test_the_default_suite_is_what_the_data_can_feed_and_says_what_it_left_out(tracking_uri, local_judge):
    with mlflow.start_run() as plain:
        _evaluate(frame(), {"judge": local_judge})
    params = MlflowClient().get_run(plain.info.run_id).data.params
    names = params["rag_eval.metrics"].split(",")
    assert names == ["faithfulness", "answer_relevancy", "context_relevance", "context_precision", "context_recall",
                     "answer_correctness", "false_abstention", "hit@5", "precision@5", "recall@5", "mrr", "map",
                     "ndcg@10"]
    lineage = json.loads(mlflow.artifacts.load_text(f"runs:/{plain.info.run_id}/rag_eval/judge_lineage.json"))
    assert lineage["suite"] == {"default": True, "left_out": {
        "abstention": "the data has no 'answerable' column",
        "citation_validity": "applies to no row (the answer cites nothing)",
        "citation_support": "applies to no row (the answer cites nothing)",
    }}

    # An answerable column brings abstention in; an answer that cites brings the citation metrics.
    cited = frame(answerable=[True, True, False])
    cited.loc[0, "answer"] = "Bikes travel for a flat fare of 5 euros [1]."
    with mlflow.start_run() as rich:
        result = _evaluate(cited, {"judge": local_judge})
    for name in ("abstention", "citation_validity", "citation_support"):
        assert f"{name}/n_scored" in figures_of(result)
    lineage = json.loads(mlflow.artifacts.load_text(f"runs:/{rich.info.run_id}/rag_eval/judge_lineage.json"))
    assert lineage["suite"]["left_out"] == {}


def test_the_default_suite_leaves_out_what_the_judge_cannot_do_but_a_named_metric_is_refused(local_judge):
    from mlflow_rag_eval.evaluation.suite import prepare_suite
    from mlflow_rag_eval.judges.base import JudgeCapabilityError

    fields = {"answer", "contexts", "reference"}
    suite = prepare_suite(None, local_judge, fields)
    assert "faithfulness" in [m.display_name for m in suite.metrics]
    from mlflow_rag_eval.metrics.rubric import rubric

    concise = rubric("concise", criteria="The answer is short.", steps=["Count the sentences."])
    with pytest.raises(JudgeCapabilityError, match="'concise' needs"):
        prepare_suite([concise], local_judge, fields)


# -- the summary, warnings and max_error_rate -------------------------------------------------------

def test_every_evaluation_ends_with_a_summary_and_a_warning_when_rows_failed(tracking_uri, capsys, caplog):
    with mlflow.start_run(), caplog.at_level(logging.WARNING, logger="mlflow_rag_eval"):
        _evaluate(frame(), {"judge": refusing_judge("free"), "metrics": ["faithfulness", "mrr"]})
    err = capsys.readouterr().err
    assert "rag eval summary: 3 rows, judge scripted:/scripted-rules-v1" in err
    line = next(line for line in err.splitlines() if line.strip().startswith("faithfulness"))
    assert line.split()[1:7] == ["2", "scored", "1", "failed", "0", "not"]
    assert "failed 1x Refusal, e.g. Refusal: the model declined to judge this text" in err
    assert any("rows failed for faithfulness (1 of 3)" in r.message for r in caplog.records)


def test_max_error_rate_fails_the_evaluation_after_logging_the_evidence(tracking_uri):
    with pytest.raises(ErrorRateExceeded, match=r"faithfulness 33\.3% \(Refusal first\)"):
        with mlflow.start_run() as run:
            _evaluate(frame(), {"judge": refusing_judge("free"), "metrics": ["faithfulness", "mrr"], "max_error_rate": 0.2})
    logged = MlflowClient().get_run(run.info.run_id)
    assert logged.info.status == "FAILED"  # the run's context manager saw the error
    assert "faithfulness/mean" in logged.data.metrics  # the evidence is on the run
    assert figures_of(run.info.run_id)["faithfulness/n_error"] == 1
    with mlflow.start_run():  # at the limit is not above it
        _evaluate(frame(), {"judge": refusing_judge("free"), "metrics": ["faithfulness"], "max_error_rate": 0.34})


# -- the genai route -------------------------------------------------------------------------------

def test_genai_rows_without_contexts_fail_and_errors_name_no_row_number(tracking_uri, monkeypatch, local_judge):
    from mlflow_rag_eval import rag_scorers

    monkeypatch.setenv("MLFLOW_GENAI_EVAL_MAX_WORKERS", "2")
    rows = [
        {"inputs": {"question": "Do dogs pay?"}, "outputs": "Dogs travel free on all trains."},  # no contexts
        {"inputs": {"question": ""}, "outputs": {"answer": "x", "contexts": []}},  # an empty question
        {"inputs": {"question": "Do dogs pay?"}, "outputs": {"answer": "Dogs travel free.", "contexts": [DOGS]}},
    ]
    with mlflow.start_run() as run:
        mlflow.genai.evaluate(data=rows, scorers=rag_scorers(["faithfulness", "answer_relevancy"], local_judge))
    path = mlflow.artifacts.download_artifacts(run_id=run.info.run_id, artifact_path="eval_results_table.json")
    with open(path) as f:
        table = json.load(f)
    errors = [r[table["columns"].index("faithfulness/error")] for r in table["data"]]
    assert sorted(e for e in errors if e) == [
        "NoContexts: the outputs have no 'contexts' and the trace no RETRIEVER span",
        "RecordError: column 'question': must not be empty",
    ]
    data = MlflowClient().get_run(run.info.run_id).data
    figures = figures_of(run.info.run_id)
    assert figures["faithfulness/n_error"] == 2 and figures["faithfulness/n_scored"] == 1
    assert "rag_eval.rows_lost" not in data.tags


def test_genai_rows_whose_assessments_were_not_stored_are_counted_and_tagged(tracking_uri, monkeypatch, caplog,
                                                                            local_judge):
    """MLflow's harness logs each row's Feedback itself; when that fails (its sqlite pool ran
    dry: "QueuePool limit reached") the aggregates silently cover fewer rows. The scorers check
    the store and say so."""
    from mlflow.genai.evaluation import harness

    from mlflow_rag_eval import rag_scorers

    monkeypatch.setenv("MLFLOW_GENAI_EVAL_MAX_WORKERS", "1")
    original = harness._log_assessments

    def losing(run_id, trace, assessments):
        if trace.info.request_preview and "dogs" in trace.info.request_preview:
            raise RuntimeError("QueuePool limit of size 5 overflow 10 reached")
        return original(run_id=run_id, trace=trace, assessments=assessments)

    monkeypatch.setattr(harness, "_log_assessments", losing)
    rows = [{"inputs": {"question": q}, "outputs": {"answer": a, "contexts": c}}
            for q, a, c in zip(frame().question, frame().answer, frame().contexts)]
    with mlflow.start_run() as run, caplog.at_level(logging.ERROR, logger="mlflow_rag_eval"):
        mlflow.genai.evaluate(data=rows, scorers=rag_scorers(["faithfulness"], local_judge))
    assert MlflowClient().get_run(run.info.run_id).data.tags["rag_eval.rows_lost"] == "1"
    assert any("1 evaluated row(s) are not in the tracking store" in r.message for r in caplog.records)


# -- issue 37: what a user reads -------------------------------------------------------------------

def test_the_default_suite_leaves_out_a_retrieval_metric_when_contexts_carry_no_ids(tracking_uri, local_judge):
    """String contexts with relevant ids: the default suite ran hit@5 and refused the whole run
    (RecordError: hit@5 needs an id for every retrieved context). Now it leaves the ranking
    metrics out, saying why (summary and lineage); a named one still refuses."""
    data = frame()
    data["contexts"] = [[c["text"] for c in row] for row in data["contexts"]]
    with mlflow.start_run() as run:
        result = _evaluate(data, {"judge": local_judge})
    assert "faithfulness/mean" in result.metrics and "hit_at_5/mean" not in result.metrics
    lineage = json.loads(mlflow.artifacts.load_text(f"runs:/{run.info.run_id}/rag_eval/judge_lineage.json"))
    left_out = lineage["suite"]["left_out"]
    for name in ("hit@5", "precision@5", "recall@5", "mrr", "map", "ndcg@10"):
        assert left_out[name].startswith("the data cannot feed it (row 0, column 'contexts': "), left_out[name]
        assert "needs an id for every retrieved context" in left_out[name]
    with mlflow.start_run(), pytest.raises(RecordError, match="hit@5 needs an id for every retrieved context"):
        _evaluate(data, {"judge": local_judge, "metrics": ["faithfulness", "hit@5"]})


def test_a_mistyped_metric_or_judge_name_gets_a_did_you_mean(tracking_uri):
    from mlflow_rag_eval.judges import get_judge
    from mlflow_rag_eval.metrics import resolve_metric

    with pytest.raises(ValueError, match=r"unknown metric 'faithfulnes' \(did you mean 'faithfulness'\?\); known"):
        resolve_metric("faithfulnes")
    with pytest.raises(ValueError, match=r"unknown metric 'ndgc@10' \(did you mean 'ndcg@10'\?\)"):
        resolve_metric("ndgc@10")
    with pytest.raises(ValueError, match=r"unknown metric 'zzz'; known"):  # nothing close: no guess
        resolve_metric("zzz")
    with pytest.raises(ValueError, match=r"unknown judge scheme 'loacl' \(did you mean 'local'\?\)"):
        get_judge("loacl:minilm-l6")
    with mlflow.start_run(), pytest.raises(ValueError, match=r"did you mean 'faithfulness'\?"):
        _evaluate(frame(), {"judge": "scripted", "metrics": ["faithfulnes"]})


def test_the_summaries_go_through_a_logger_of_their_own_that_an_app_can_silence(tracking_uri, capsys):
    """The summary and the budget line were print()s to stderr: an app could neither route nor
    silence them. They go through logging.getLogger('mlflow_rag_eval.summary'), which prints
    them by default (a handler of its own, as MLflow's logger has) and nothing else."""
    import logging

    root = logging.getLogger()
    root_state = (root.level, list(root.handlers))
    with mlflow.start_run():
        _evaluate(frame(), {"judge": "scripted", "metrics": ["mrr"]})
    err = capsys.readouterr().err
    assert "rag eval summary: 3 rows" in err  # printed by default
    assert (root.level, list(root.handlers)) == root_state  # the caller's root logger untouched

    summary = logging.getLogger("mlflow_rag_eval.summary")
    saved = (summary.level, list(summary.handlers), summary.propagate)
    seen: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    try:
        summary.handlers, summary.propagate = [Collect()], False  # the app routes them
        with mlflow.start_run():
            _evaluate(frame(), {"judge": "scripted", "metrics": ["mrr"]})
        assert "rag eval summary" not in capsys.readouterr().err
        assert any(m.startswith("rag eval summary: 3 rows") for m in seen)
        summary.handlers = []
        summary.setLevel(logging.WARNING)  # the app silences them
        with mlflow.start_run():
            _evaluate(frame(), {"judge": "scripted", "metrics": ["mrr"]})
        assert "rag eval summary" not in capsys.readouterr().err
    finally:
        summary.setLevel(saved[0])
        summary.handlers, summary.propagate = saved[1], saved[2]
