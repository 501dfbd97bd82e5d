"""Uncalibrated numbers are flagged: run tags, report.html, the end-of-run summary and compare;
a judge with a calibration record cites it instead."""

from __future__ import annotations

import mlflow
import pandas as pd
from click.testing import CliRunner

from mlflow_rag_eval.cli import main
from mlflow_rag_eval.compare import compare_runs
from mlflow_rag_eval.gate import calibrate

PASSAGE = "Bikes travel for a flat fare of 5 euros per journey. Dogs travel free."


def _data(n: int = 6) -> pd.DataFrame:
    return pd.DataFrame([{
        "question": f"Question {i}: how much does a bike cost?",
        "answer": "Bikes travel for a flat fare of 5 euros per journey." if i % 2 else "Bikes cost 9 euros.",
        "contexts": [{"id": "p1", "text": PASSAGE}],
        "relevant_ids": ["p1"],
    } for i in range(n)])


def _evaluate(judge, metrics) -> str:
    with mlflow.start_run() as run:
        mlflow.models.evaluate(data=_data(), model_type="rag", evaluators="rag",
                               evaluator_config={"judge": judge, "metrics": metrics})
    return run.info.run_id


def _report(run_id: str) -> str:
    return mlflow.artifacts.load_text(f"runs:/{run_id}/rag_eval/report.html")


def _labels() -> pd.DataFrame:
    return pd.DataFrame({
        "answer": ["Bikes travel for a flat fare of 5 euros per journey.", "Bikes cost 9 euros."] * 5,
        "contexts": [[PASSAGE]] * 10,
        "label": [1, 0] * 5,
    })


def test_an_uncalibrated_judge_is_flagged_everywhere_and_a_calibrated_one_cites_its_run(
        tracking_uri, local_judge, capsys):
    before = _evaluate(local_judge, ["faithfulness", "mrr"])
    tags = mlflow.get_run(before).data.tags
    assert tags["rag_eval.calibrated"] == "false"
    assert tags["rag_eval.uncalibrated_metrics"] == "faithfulness"  # mrr compares ids: no judge
    assert not any(k.startswith("rag_eval.calibration_run.") for k in tags)
    assert "Uncalibrated judge." in _report(before)
    err = capsys.readouterr().err
    assert "WARNING: uncalibrated judge: local:minilm-l6 has no calibration record for faithfulness" in err
    uncalibrated = CliRunner().invoke(main, ["compare", before, before, "--no-log"])
    assert uncalibrated.exit_code == 0, uncalibrated.output
    assert "WARNING: uncalibrated judge: local:minilm-l6" in uncalibrated.output

    record = calibrate(_labels(), "faithfulness", local_judge, n_boot=50)
    after = _evaluate(local_judge, ["faithfulness", "mrr"])
    tags = mlflow.get_run(after).data.tags
    assert tags["rag_eval.calibrated"] == "true" and "rag_eval.uncalibrated_metrics" not in tags
    assert tags["rag_eval.calibration_run.faithfulness"] == record.run_id
    report = _report(after)
    assert "Uncalibrated judge." not in report and record.run_id in report
    err = capsys.readouterr().err
    assert "uncalibrated judge" not in err and f"calibrated: faithfulness by run {record.run_id}" in err
    # compare looks calibrations up now: the earlier run's judge is calibrated too by now
    assert not compare_runs(before, after).warnings
    calibrated = CliRunner().invoke(main, ["compare", before, after, "--no-log"])
    assert calibrated.exit_code == 0 and "uncalibrated" not in calibrated.output


def test_a_calibration_of_another_metric_or_judge_does_not_count(tracking_uri, local_judge):
    from mlflow_rag_eval.judges.providers.local import LocalJudge

    calibrate(_labels(), "faithfulness", LocalJudge(support_threshold=0.9), n_boot=50)  # another fingerprint
    run_id = _evaluate(local_judge, ["faithfulness", "context_relevance"])
    tags = mlflow.get_run(run_id).data.tags
    assert tags["rag_eval.calibrated"] == "false"
    assert tags["rag_eval.uncalibrated_metrics"] == "faithfulness,context_relevance"


def test_retrieval_only_evaluations_need_no_calibration(tracking_uri, local_judge):
    run_id = _evaluate(local_judge, ["mrr", "hit@1"])
    tags = mlflow.get_run(run_id).data.tags
    assert "rag_eval.calibrated" not in tags
    assert "Uncalibrated judge." not in _report(run_id)
