"""Comparing two evaluated runs: paired deltas, refusals on judge or dataset change, CLI."""

from __future__ import annotations

import json

import mlflow
import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from mlflow_rag_eval.cli import main
from mlflow_rag_eval.comparison import NotComparable, compare_runs, paired_delta
from mlflow_rag_eval.judges.local import LocalJudge

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


def test_paired_delta_is_the_mean_difference_with_a_bootstrap_ci():
    a = np.array([0.5, 0.5, 0.5, 0.5, 0.5, 0.5])
    b = np.array([1.0, 1.0, 0.5, 1.0, 1.0, 1.0])
    delta, low, high, p = paired_delta(a, b, seed=0)
    assert delta == pytest.approx((0.5 * 5) / 6)
    assert 0 < low <= delta <= high <= 0.5
    assert 0 < p < 0.1
    assert paired_delta(a, a)[3] == 1.0


def test_better_run_shows_positive_paired_deltas_and_logs_html(tracking_uri, local_judge):
    a = _evaluate(_data(good=False), local_judge)
    b = _evaluate(_data(good=True), local_judge)
    comparison = compare_runs(a, b, log_to=b)
    by = {d.metric: d for d in comparison.deltas}
    assert comparison.n_shared_rows == 12 and not comparison.warnings
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
