"""The metric runner owns failures: a metric that raises fails its rows with the traceback kept,
a NaN is an error and never "not applicable", nothing is cached across calls, and every route
checks metrics (names, extras, the judge's capabilities) when they are named."""

from __future__ import annotations

import dataclasses
import sys

import numpy as np
import pytest

from mlflow_rag_eval.evaluation.engine import evaluate_records, run_metric
from mlflow_rag_eval.judges.base import JudgeCapabilityError, JudgeUnreachable
from mlflow_rag_eval.metrics import register_metric, resolve_metric
from mlflow_rag_eval.metrics.base import Metric
from mlflow_rag_eval.metrics.rubric import rubric
from mlflow_rag_eval.records import Context, RagRecord


def record(question: str, retrieved: list[str], relevant: dict[str, float] | None) -> RagRecord:
    return RagRecord(question=question, answer="a", contexts=tuple(Context(text=i, id=i) for i in retrieved),
                     relevant_ids=relevant)


def test_retrieval_values_are_never_reused_from_an_earlier_call():
    """hit@1 on the same list object, after one of its records changed, is the new value (a
    module-level cache keyed on the list's identity once gave the stale one)."""
    metric = resolve_metric("hit@1")
    records = [record("q0", ["d1", "d2"], {"d1": 1}), record("q1", ["d3"], {"d3": 1})]
    assert [r.value for r in metric.compute(records, None)] == [1.0, 1.0]
    records[0] = record("q0", ["d2", "d1"], {"d1": 1})
    assert [r.value for r in metric.compute(records, None)] == [0.0, 1.0]
    # Inside one evaluation the suite's retrieval metrics still share one build per batch.
    result = evaluate_records(records, ["hit@1", "mrr", "ndcg@10"], progress=False)
    assert [r.value for r in result.metrics[0].rows] == [0.0, 1.0]


def test_a_nan_from_a_retrieval_kernel_is_an_error_not_a_skipped_row(monkeypatch):
    metric = resolve_metric("mrr")
    monkeypatch.setattr(type(metric), "kernel", lambda self, rr: np.full(rr.gains.shape[0], np.nan))
    rows = metric.compute([record("q", ["d1"], {"d1": 1}), record("q2", ["d1"], None)], None)
    assert rows[0].status == "error" and rows[0].error_kind == "NonFiniteScore"
    assert rows[1].status == "skipped"  # no relevant ids: not applicable, as before


@register_metric
@dataclasses.dataclass(frozen=True)
class _Exploding(Metric):
    """A metric with a bug."""

    name = "exploding_for_tests"

    def compute(self, records, judge=None):
        return [{"not": "a row"}[row.question] for row in records]  # KeyError


def test_a_metric_that_raises_fails_its_rows_with_kind_message_and_traceback():
    records = [record("q0", ["d1"], {"d1": 1}), record("q1", ["d1"], {"d1": 1})]
    result = evaluate_records(records, ["exploding_for_tests", "hit@1"], progress=False)
    failed, fine = result.metrics
    assert [r.error_kind for r in failed.rows] == ["MetricError", "MetricError"]
    assert failed.rows[0].error_message == "KeyError: 'q0'"
    assert "in compute" in failed.rows[0].traceback and "KeyError" in failed.rows[0].traceback
    assert [r.value for r in fine.rows] == [1.0, 1.0]  # the other metric is untouched
    table = result.table()
    assert table["exploding_for_tests/error"].tolist() == ["MetricError: KeyError: 'q0'"] * 2
    assert "KeyError" in table["exploding_for_tests/traceback"][0]
    assert "hit_at_1/traceback" not in table  # only where a metric raised


def test_every_route_refuses_a_metric_the_judge_cannot_perform_when_it_is_named(local_judge):
    from mlflow_rag_eval import rag_metrics, rag_scorers
    from mlflow_rag_eval.routes.scorers import rag_scorer

    concise = rubric("concise", criteria="The answer is short.", steps=["Count the sentences."])
    for make in (lambda: rag_scorers([concise], local_judge), lambda: rag_scorer(concise, local_judge),
                 lambda: rag_metrics([concise], local_judge)):
        with pytest.raises(JudgeCapabilityError, match="'concise' needs"):
            make()
    with pytest.raises(ValueError, match="a list of metric names"):
        rag_scorers("faithfulness", local_judge)
    assert [s.name for s in rag_scorers(["faithfulness", "ndcg@10"], local_judge)] == ["faithfulness", "ndcg_at_10"]


def test_a_missing_extra_is_refused_when_the_metric_is_named(monkeypatch):
    monkeypatch.setitem(sys.modules, "ragas", None)  # what an uninstalled package looks like to import
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'mlflow-rag-eval\[ragas\]'"):
        resolve_metric("ragas:faithfulness")


# -- one owner of metric failures on every route: the engine's run_metric -------------------------
@register_metric
@dataclasses.dataclass(frozen=True)
class _Unreachable(Metric):
    """A metric whose judge cannot be reached at all."""

    name = "unreachable_for_tests"

    def compute(self, records, judge=None):
        raise JudgeUnreachable("judge 'x' is unreachable: 8 consecutive connection failures")


ROWS = [record("q0", ["d1"], {"d1": 1}), record("q1", ["d1"], {"d1": 1})]


def _extra_metric_values(name: str):
    """What the extra_metrics route's eval_fn gives MLflow's default evaluator for ROWS."""
    import pandas as pd

    from mlflow_rag_eval.routes.extra_metrics import rag_metric

    return rag_metric(name).eval_fn(pd.Series(["a", "a"]), question=pd.Series(["q0", "q1"]),
                                    contexts=pd.Series([["d1"], ["d1"]]))


def _scorer_feedback(name: str, question: str = "q0"):
    from mlflow_rag_eval.routes.scorers import rag_scorers

    (scorer,) = rag_scorers([name], None)
    return scorer(inputs={"question": question}, outputs={"answer": "a", "contexts": ["d1"]})


def test_run_metric_is_the_one_place_a_metric_failure_becomes_rows():
    rows = run_metric(resolve_metric("exploding_for_tests"), ROWS, None)
    assert [r.error for r in rows] == ["MetricError: KeyError: 'q0'"] * 2 and "KeyError" in rows[0].traceback
    with pytest.raises(JudgeUnreachable):
        run_metric(resolve_metric("unreachable_for_tests"), ROWS, None)


def test_a_metric_that_raises_fails_its_rows_alike_on_every_route():
    """The engine (evaluator plugin, Spark, CLI), extra_metrics and the genai scorers: the same
    error kind and message for the same bug."""
    engine = evaluate_records(ROWS[:1], ["exploding_for_tests"], progress=False).metrics[0].rows[0]
    extra = _extra_metric_values("exploding_for_tests")
    feedback = _scorer_feedback("exploding_for_tests")
    assert engine.error == "MetricError: KeyError: 'q0'"
    assert extra.scores == [None, None] and extra.justifications[0] == engine.error
    assert feedback.value is None and feedback.error.error_code == "MetricError"
    assert feedback.error.error_message == engine.error


def test_an_unreachable_judge_stops_the_engine_and_names_itself_on_every_route():
    """The engine and extra_metrics (one call per metric) stop with JudgeUnreachable before
    anything is logged; a genai scorer cannot stop MLflow's harness, so its row names it."""
    with pytest.raises(JudgeUnreachable, match="unreachable"):
        evaluate_records(ROWS, ["unreachable_for_tests"], progress=False)
    with pytest.raises(JudgeUnreachable, match="unreachable"):
        _extra_metric_values("unreachable_for_tests")
    feedback = _scorer_feedback("unreachable_for_tests")
    assert feedback.value is None and feedback.error.error_code == "JudgeUnreachable"
    assert "8 consecutive connection failures" in feedback.error.error_message


def test_an_llm_judges_next_batch_starts_while_this_ones_slowest_call_is_out(monkeypatch):
    """No batch barrier (issue 46): batch 2's calls go out while one call of batch 1 is held;
    batch 3 waits for batch 1 to end (two batches in flight at most); rows and scores come back
    in row order, equal to a run where no call was held."""
    import re
    import threading
    import time

    import pandas as pd

    from mlflow_rag_eval.evaluation import engine
    from mlflow_rag_eval.judges.llm.judge import LLMJudge
    from mlflow_rag_eval.judges.providers.openai import OpenAICompatBackend
    from mlflow_rag_eval.records import records_from_frame
    from mlflow_rag_eval.testing.faults import FaultyServer, judge_answer

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setattr(engine, "BATCH_SIZE", 8)
    frame = pd.DataFrame({"question": [f"Question {i}: what does a bike cost?" for i in range(24)],
                          "answer": [f"Row {i}: bikes cost {i % 7} euros." for i in range(24)],
                          "contexts": [[f"Passage {i}: bikes cost {i % 5} euros."] for i in range(24)]})
    arrived: dict[int, float] = {}
    held = {"row": None, "released": None}

    def respond(request):
        row = int(re.search(r"Row (\d+):", request.prompt).group(1))
        arrived.setdefault(row, time.monotonic())
        if row == held["row"] and "claims" in request.prompt.lower():
            time.sleep(1.0)
            held["released"] = time.monotonic()
        return judge_answer(request)

    def run():
        with FaultyServer(respond) as server:
            judge = LLMJudge(OpenAICompatBackend("faulty-judge", base_url=server.base_url), cache=False,
                             concurrency=4)
            return evaluate_records(records_from_frame(frame), ["faithfulness", "context_precision"], judge,
                                    progress=False)

    reference = run()
    arrived.clear()
    held["row"] = 0
    result = run()
    assert min(arrived[r] for r in range(8, 16)) < held["released"]  # batch 2 did not wait for row 0
    assert min(arrived[r] for r in range(16, 24)) >= held["released"]  # batch 3 did
    for got, want in zip(result.metrics, reference.metrics):
        assert [(r.value, r.error, r.justification) for r in got.rows] == \
            [(r.value, r.error, r.justification) for r in want.rows]
    assert threading.active_count() < 50


def test_rows_spooled_to_the_temporary_file_read_back_as_scored(monkeypatch):
    """An evaluation whose rows went mostly to the temporary file (issue 47: memory bounded in
    the rows) gives the rows, summaries, failures and table of one that held them all."""
    import re

    import pandas as pd

    from mlflow_rag_eval._util import spooled
    from mlflow_rag_eval.evaluation import engine
    from mlflow_rag_eval.judges.llm.judge import LLMJudge
    from mlflow_rag_eval.judges.providers.openai import OpenAICompatBackend
    from mlflow_rag_eval.records import records_from_frame
    from mlflow_rag_eval.testing.faults import Answer, FaultyServer, completion, judge_answer

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setattr(engine, "BATCH_SIZE", 40)
    n = 160
    frame = pd.DataFrame({"question": [f"Question {i}: what does a bike cost?" for i in range(n)],
                          "answer": [f"Row {i}: bikes cost {i % 7} euros. Dogs ride free." for i in range(n)],
                          "contexts": [[f"Passage {i}: bikes cost {i % 5} euros.", "Dogs ride free."]
                                       for i in range(n)],
                          "context_ids": [[f"p{i}", "dogs"] for i in range(n)],
                          "relevant_ids": [{f"p{i}": 1.0} for i in range(n)]})

    def respond(request):
        row = int(re.search(r"Row (\d+):", request.prompt).group(1)) if "Row " in request.prompt else 0
        return Answer(body=completion("no json here")) if row % 11 == 3 else judge_answer(request)

    def run():
        with FaultyServer(respond) as server:
            judge = LLMJudge(OpenAICompatBackend("faulty-judge", base_url=server.base_url), cache=False,
                             concurrency=4)
            return evaluate_records(records_from_frame(frame), ["faithfulness", "context_precision", "mrr"],
                                    judge, progress=False)

    reference = run()
    monkeypatch.setattr(spooled, "IN_MEMORY", 24)
    monkeypatch.setattr(spooled, "CHUNK", 16)
    result = run()
    assert any(m.failures() for m in reference.metrics)  # the failed rows are spooled too
    for got, want in zip(result.metrics, reference.metrics):
        assert got.rows.spilled == 128 and not want.rows.spilled
        assert list(got.rows) == list(want.rows)
        assert (got.summary, got.failures(), got.skip_reasons()) == (want.summary, want.failures(), want.skip_reasons())
    pd.testing.assert_frame_equal(result.table(), reference.table())
