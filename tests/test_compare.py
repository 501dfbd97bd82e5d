"""Comparing two evaluated runs: paired deltas, refusals on judge or dataset change, CLI."""

from __future__ import annotations

import json

import mlflow
import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from mlflow_rag_eval.cli import main
from mlflow_rag_eval.compare import EvaluatedRun, NotComparable, compare_evaluations, compare_runs
from mlflow_rag_eval.judges.providers.local import LocalJudge

CONTEXTS = [
    [{"id": "p1", "text": "Bikes travel for a flat fare of 5 euros per journey."}, {"id": "p2", "text": "Dogs travel free."}],
    [{"id": "p2", "text": "Dogs travel free."}, {"id": "p1", "text": "Bikes travel for a flat fare of 5 euros per journey."}],
]


def _data(good: bool) -> pd.DataFrame:
    rows = []
    for i in range(12):
        rows.append({
            "question": f"Question {i}: how much does a bike cost?",
            "answer": "Bikes travel for a flat fare of 5 euros per journey.",
            # the better pipeline ranks the relevant passage first
            "contexts": CONTEXTS[0] if good or i % 3 == 0 else CONTEXTS[1],
            "reference": "A bike costs 5 euros.",
            "relevant_ids": ["p1"],
        })
    return pd.DataFrame(rows)


def _evaluate(data, judge) -> str:
    with mlflow.start_run() as run:
        mlflow.models.evaluate(data=data, model_type="rag", evaluators="rag",
                               evaluator_config={"judge": judge, "metrics": ["mrr", "ndcg@10", "faithfulness"]})
    return run.info.run_id


def _run(run_id: str, questions: list[str], scores: dict[str, list], references=None) -> EvaluatedRun:
    """An evaluated run built by hand: the table as load_evaluation reads it."""
    table = pd.DataFrame({"question": questions, "reference": references or ["ref"] * len(questions),
                          **{f"{m}/score": v for m, v in scores.items()}})
    return EvaluatedRun(run_id, {}, table, {"abstention_error": False})


def test_rows_pair_by_question_and_reference_never_by_position():
    questions = ["q1", "q2", "q2", "q3"]  # q2 asked twice: first pairs with first
    a = _run("A", questions, {"faithfulness": [0.0, 0.2, 0.4, 0.6]})
    order = [3, 1, 0, 2]  # B lists the same rows in another order (repeats keep their order)
    b = _run("B", [questions[i] for i in order], {"faithfulness": [[0.1, 0.3, 0.5, 0.7][i] for i in order]})
    (delta,) = compare_evaluations(a, b).deltas
    assert delta.n_pairs == 4 and delta.delta == pytest.approx(0.1)
    assert delta.ci_low is None and "all 4 paired differences equal 0.1" in delta.ci_missing  # no spread
    # a different reference is a different row
    c = _run("C", questions, {"faithfulness": [0.1, 0.3, 0.5, 0.7]}, references=["ref", "ref", "ref", "other"])
    comparison = compare_evaluations(a, c)
    assert comparison.n_shared_rows == 3 and comparison.deltas[0].n_pairs == 3
    assert comparison.warnings == ["only 3 rows are in both runs (A 4, C 4)".replace("C 4", "B 4")]


def test_one_paired_row_is_no_evidence_of_a_change():
    """Today's bug: one pair gave the zero-width CI [d, d], so one improved row read "better"."""
    a, b = _run("A", ["q"], {"faithfulness": [0.0]}), _run("B", ["q"], {"faithfulness": [1.0]})
    (delta,) = compare_evaluations(a, b).deltas
    assert delta.delta == 1.0 and delta.ci_low is None and delta.ci_high is None
    assert delta.ci_missing == "a CI needs at least 2 paired differences, got 1"
    assert delta.verdict == "no clear change"


def test_equal_differences_on_every_row_decide_by_the_wilcoxon_test():
    n = 12
    a = _run("A", [f"q{i}" for i in range(n)], {"faithfulness": [0.5] * n, "abstention_error": [0.5] * n})
    b = _run("B", [f"q{i}" for i in range(n)], {"faithfulness": [1.0] * n, "abstention_error": [1.0] * n})
    by = {d.metric: d for d in compare_evaluations(a, b).deltas}
    assert by["faithfulness"].ci_low is None and by["faithfulness"].p_value < 0.001
    assert by["faithfulness"].verdict == "better" and by["abstention_error"].verdict == "worse"


def test_the_comparison_text_is_one_aligned_table_with_the_reasons_for_missing_cis():
    n = 8
    a = _run("A", [f"q{i}" for i in range(n)], {"mrr": [0.5] * n, "ndcg_at_10": [0.2, 0.4] * 4})
    b = _run("B", [f"q{i}" for i in range(n)], {"mrr": [0.5] * n, "ndcg_at_10": [0.6, 0.9] * 4})
    lines = compare_evaluations(a, b).to_text().splitlines()
    head, rule, *rows = lines[1:]
    assert head.split() == ["metric", "n", "A", "B", "B-A", "95%", "CI", "of", "B-A", "Wilcoxon", "p", "Holm", "p",
                            "verdict"]
    assert set(rule) == {"-"} and len(rule) == len(head)
    mrr, ndcg, note = rows
    assert mrr.split()[:5] == ["mrr", "8", "0.500", "0.500", "+0.000"] and mrr.endswith("no clear change")
    assert ndcg.startswith("ndcg_at_10") and "better" in ndcg
    assert head.index("verdict") == mrr.index("no clear change") == ndcg.index("better")  # aligned
    assert note == "mrr: no CI (all 8 paired differences equal 0: nothing to resample)"


def test_better_run_shows_positive_paired_deltas_and_logs_html(tracking_uri, local_judge):
    a = _evaluate(_data(good=False), local_judge)
    b = _evaluate(_data(good=True), local_judge)
    comparison = compare_runs(a, b, log_to=b)
    by = {d.metric: d for d in comparison.deltas}
    assert comparison.n_shared_rows == 12
    assert [w.split(":")[0] for w in comparison.warnings] == ["uncalibrated judge"]  # faithfulness's judge
    assert by["mrr"].mean_a == pytest.approx((4 * 1 + 8 * 0.5) / 12)
    assert by["mrr"].delta == pytest.approx(1 - (4 + 4) / 12) and by["mrr"].verdict == "better"
    assert by["faithfulness"].delta == 0 and by["faithfulness"].verdict == "no clear change"
    paths = {f.path for f in mlflow.MlflowClient().list_artifacts(b, "rag_eval")}
    assert f"rag_eval/comparison_{a[:8]}_{b[:8]}.html" in paths

    result = CliRunner().invoke(main, ["compare", a, b, "--no-log"])
    assert result.exit_code == 0, result.output
    assert "mrr" in result.output and "better" in result.output


def test_a_judge_change_is_refused_unless_allowed(tracking_uri, local_judge):
    a = _evaluate(_data(good=False), local_judge)
    b = _evaluate(_data(good=True), LocalJudge(support_threshold=0.7))
    with pytest.raises(NotComparable, match="judge fingerprint"):
        compare_runs(a, b)
    result = CliRunner().invoke(main, ["compare", a, b, "--no-log"])
    assert result.exit_code == 2 and "not comparable" in result.output
    allowed = compare_runs(a, b, allow_judge_change=True)
    assert any("judge fingerprint" in w for w in allowed.warnings)


def test_a_dataset_change_is_refused(tracking_uri, local_judge):
    a = _evaluate(_data(good=False), local_judge)
    other = _data(good=True).assign(reference="Five euros.")
    b = _evaluate(other, local_judge)
    with pytest.raises(NotComparable, match="dataset digest"):
        compare_runs(a, b)
    allowed = compare_runs(a, b, allow_dataset_change=True)
    assert allowed.n_shared_rows == 0  # rows pair by question and reference
    assert any("only 0 rows" in w for w in allowed.warnings)
    assert json.loads(json.dumps(allowed.as_dict()))["n_shared_rows"] == 0


def test_the_comparison_page_is_self_contained_and_escapes_what_it_shows():
    a = _run("run<A>", ["q0", "q1", "q2"], {"x<script>": [0.0, 0.5, 1.0]})
    b = _run("run<B>", ["q0", "q1", "q2"], {"x<script>": [0.5, 1.0, 1.0]})
    html = compare_evaluations(a, b).to_html()
    assert "<script" not in html and "x&lt;script&gt;" in html and "A = run&lt;A&gt;" in html
    assert "content=\"default-src 'none'; style-src 'unsafe-inline'\"" in html
    assert "95% CI of B-A (BCa)" in html and "<td class=\"no-clear-change\">no clear change</td>" in html


def test_holm_adjusts_the_p_values_of_the_metrics_compared_together():
    n = 12
    questions = [f"q{i}" for i in range(n)]
    rng = np.random.default_rng(3)
    base = {m: rng.uniform(0, 1, n).round(3).tolist() for m in ("mrr", "ndcg_at_10", "hit_at_5")}
    moved = {"mrr": [v + 0.3 for v in base["mrr"]],                       # a clear change
             "ndcg_at_10": [v + (0.05 if i % 3 else -0.04) for i, v in enumerate(base["ndcg_at_10"])],
             "hit_at_5": base["hit_at_5"]}                                # none at all
    deltas = {d.metric: d for d in compare_evaluations(_run("A", questions, base), _run("B", questions, moved)).deltas}
    raw = [deltas[m].p_value for m in ("mrr", "ndcg_at_10", "hit_at_5")]
    # Holm by hand: sort, multiply the k-th smallest by (m - k), keep the running maximum, cap at 1
    order = sorted(range(3), key=lambda i: raw[i])
    expected, running = [0.0] * 3, 0.0
    for k, i in enumerate(order):
        running = max(running, min(1.0, (3 - k) * raw[i]))
        expected[i] = running
    assert [deltas[m].p_holm for m in ("mrr", "ndcg_at_10", "hit_at_5")] == pytest.approx(expected)
    assert deltas["hit_at_5"].p_value == deltas["hit_at_5"].p_holm == 1.0
    assert deltas["mrr"].p_holm == pytest.approx(3 * deltas["mrr"].p_value)  # the smallest: times m


def test_an_extra_metrics_run_is_refused_saying_why_it_cannot_be_compared(tracking_uri, local_judge):
    """MLflow's default evaluator logs extra_metrics one metric at a time: no rows table, digest
    or lineage of ours. compare says so and names the routes that can, instead of "holds no rag
    evaluation"."""
    from mlflow_rag_eval import rag_metrics

    data = _data(True)
    with mlflow.start_run() as extra:
        mlflow.models.evaluate(data=data, model_type=None, predictions="answer",
                               extra_metrics=rag_metrics(["faithfulness", "mrr"], local_judge))
    plugin = _evaluate(data, local_judge)
    assert mlflow.get_run(extra.info.run_id).data.tags["rag_eval.route"] == "extra_metrics"
    with pytest.raises(NotComparable, match=f"run {extra.info.run_id} was evaluated through extra_metrics, .* "
                                            "evaluate with model_type='rag' or rag_scorers"):
        compare_runs(plugin, extra.info.run_id)


def test_reading_two_runs_shows_no_download_progress_bar(tracking_uri, capfd, monkeypatch):
    """The package's own reads of a run's artifacts (a comparison, the gate's evidence and
    history, a calibration's rows) print no MLflow "Downloading artifacts" bar: the user asked
    for a comparison, not a download, and the bar's switch is the caller's environment."""
    monkeypatch.delenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", raising=False)  # MLflow's default: bars on
    retrieval = {"metrics": ["mrr", "ndcg@10"], "log_traces": False, "progress": False}
    runs = []
    for good in (False, True):
        with mlflow.start_run() as run:
            mlflow.models.evaluate(data=_data(good), model_type="rag", evaluators="rag", evaluator_config=retrieval)
        runs.append(run.info.run_id)
    capfd.readouterr()
    mlflow.artifacts.download_artifacts(run_id=runs[0], artifact_path="eval_results_table.json")
    assert "Downloading artifacts" in capfd.readouterr().err  # what MLflow's own read shows, here
    comparison = compare_runs(*runs)
    assert comparison.deltas
    assert "Downloading artifacts" not in capfd.readouterr().err


def test_a_missing_artifact_fails_as_mlflows_own_read_does(tracking_uri):
    from mlflow_rag_eval._util.mlflow_compat import read_run_artifact

    with mlflow.start_run() as run:
        mlflow.log_text("{}", "present.json")
    client = mlflow.MlflowClient()
    assert read_run_artifact(client, run.info.run_id, "present.json") == b"{}"
    with pytest.raises(Exception) as ours:
        read_run_artifact(client, run.info.run_id, "missing.json")
    with pytest.raises(Exception) as theirs:
        client.download_artifacts(run.info.run_id, "missing.json")
    assert type(ours.value) is type(theirs.value)
