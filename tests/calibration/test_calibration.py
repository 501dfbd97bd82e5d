"""Judge calibration against human labels: figures, bootstrap CIs, logging, the gate's lookup."""

from __future__ import annotations

import json

import mlflow
import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from conftest import figures_of
from scipy.stats import kendalltau, spearmanr
from sklearn.metrics import accuracy_score, balanced_accuracy_score, cohen_kappa_score, roc_auc_score

from mlflow_rag_eval.calibration.calibrate import FIGURES, agreement
from mlflow_rag_eval.cli import main
from mlflow_rag_eval.gate import calibrate, load_labels
from mlflow_rag_eval.tracking.search import find_calibration

FACTS = [f"The museum on Elm Street {i} opens at {8 + i % 4} am and closes at {16 + i % 5} pm." for i in range(10)]


def _synthetic(seed: int = 3, n: int = 80) -> tuple[np.ndarray, np.ndarray]:
    """Binary labels and scores that agree with them, noisily, with ties."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, n).astype(float)
    scores = np.clip(np.round(0.3 + 0.4 * labels + rng.normal(0, 0.25, n), 1), 0, 1)
    return scores, labels


def test_figures_match_scipy_and_sklearn():
    scores, labels = _synthetic()
    figures = agreement(scores, labels, threshold=0.5, n_boot=300, seed=1)
    s_bin, y_bin = (scores >= 0.5).astype(int), labels.astype(int)
    expected = {
        "spearman": spearmanr(scores, labels).statistic,
        "kendall_tau": kendalltau(scores, labels).statistic,
        "cohen_kappa": cohen_kappa_score(y_bin, s_bin),
        "accuracy": accuracy_score(y_bin, s_bin),
        "balanced_accuracy": balanced_accuracy_score(y_bin, s_bin),
        "auroc": roc_auc_score(y_bin, scores),
    }
    assert list(figures) == list(FIGURES)
    for name, value in expected.items():
        figure = figures[name]
        assert figure["value"] == pytest.approx(value, abs=1e-12), name
        assert figure["ci_low"] <= figure["value"] <= figure["ci_high"], name
        assert figure["ci_high"] - figure["ci_low"] < 0.5, name
    assert agreement(scores, labels, n_boot=300, seed=1) == figures  # seeded

    # graded labels: rank figures against the labels, decisions binarised at label_threshold,
    # no AUROC (it needs 0/1 labels)
    graded = np.clip(labels * 0.8 + 0.1 + scores * 0.1, 0, 1)
    figures = agreement(scores, graded, threshold=0.6, label_threshold=0.7, n_boot=100)
    assert figures["spearman"]["value"] == pytest.approx(spearmanr(scores, graded).statistic)
    assert figures["cohen_kappa"]["value"] == pytest.approx(cohen_kappa_score(graded >= 0.7, scores >= 0.6))
    assert figures["auroc"] == {"value": None, "ci_low": None, "ci_high": None}
    # constant scores: rank figures are undefined, not NaN
    flat = agreement(np.full(20, 0.5), labels[:20], n_boot=50)
    assert flat["spearman"]["value"] is None and flat["auroc"]["value"] == 0.5


def test_a_figure_every_resample_agrees_on_has_no_ci():
    """Today's bug: a judge that agrees on every row got [1, 1] (and one row [v, v]): a
    zero-width interval, as if the figure were known exactly."""
    labels = np.array([0.0, 1.0] * 10)
    perfect = agreement(labels, labels, n_boot=100)
    for name in FIGURES:
        assert perfect[name] == {"value": pytest.approx(1.0), "ci_low": None, "ci_high": None}, name
    flat = agreement(np.full(20, 0.5), labels, n_boot=50)  # AUROC 0.5 in every resample
    assert flat["auroc"] == {"value": 0.5, "ci_low": None, "ci_high": None}
    one = agreement([1.0], [1.0], n_boot=20)
    assert one["accuracy"] == {"value": 1.0, "ci_low": None, "ci_high": None}


def test_calibration_resamples_rows_as_every_bootstrap_of_the_package_does():
    from mlflow_rag_eval import stats

    scores, labels = _synthetic()
    figures = agreement(scores, labels, n_boot=300, seed=1)
    agree = ((scores >= 0.5) == (labels >= 0.5)).astype(float)  # accuracy is the mean agreement
    idx = stats.resample_indices(len(scores), 300, seed=1)
    assert (figures["accuracy"]["ci_low"], figures["accuracy"]["ci_high"]) == \
        stats.percentile_interval(agree[idx].mean(axis=1))
    # the draws are scipy's: on the sorted sample (mean_ci sorts: a mean's CI ignores order),
    # the same resampling gives mean_ci's interval
    ordered = np.sort(agree)
    assert stats.percentile_interval(ordered[idx].mean(axis=1)) == \
        pytest.approx(stats.mean_ci(agree, n_resamples=300, seed=1), rel=1e-15, abs=0)


def _labels_frame() -> pd.DataFrame:
    rows = []
    for i, fact in enumerate(FACTS):
        rows.append({"id": f"{i}-ok", "answer": fact, "context": fact, "label": 1})
        wrong = fact.replace(f"at {8 + i % 4} am", f"at {50 + i} am")
        rows.append({"id": f"{i}-bad", "answer": wrong, "context": fact, "label": 0})
    return pd.DataFrame(rows)


def test_calibrate_logs_a_run_the_gate_finds(tracking_uri, local_judge, tmp_path):
    path = tmp_path / "human.jsonl"
    _labels_frame().to_json(path, orient="records", lines=True)
    result = calibrate(path, "faithfulness", local_judge, n_boot=200, experiment="calib")
    assert (result.n_labels, result.n_scored, result.n_error, result.n_skipped) == (20, 20, 0, 0)
    assert result.metric == "faithfulness" and result.binary_labels
    rows = result.rows
    assert rows["score"].between(0, 1).all()
    # rank figures rank by the rows' support confidence, the binarised ones use the score
    assert (rows["support"] != rows["score"]).any()
    expected = agreement(rows["score"].to_numpy(float), rows["label"].to_numpy(float), n_boot=200,
                         rank_scores=rows["support"].to_numpy(float))
    assert result.figures == expected
    assert result.spearman > 0.8 and result.figures["auroc"]["value"] > 0.9

    client = mlflow.MlflowClient()
    run = client.get_run(result.run_id)
    assert run.data.tags["rag_eval.calibration"] == "true"
    assert run.data.tags["rag_eval.calibration.metric"] == "faithfulness"
    judge = local_judge.info()
    assert run.data.tags["rag_eval.judge_fingerprint"] == judge.fingerprint
    assert run.data.tags["rag_eval.prompts_version"] == judge.prompts_version
    assert run.data.metrics["calibration/spearman"] == pytest.approx(result.spearman)
    assert run.data.metrics["calibration/n_labels"] == 20
    for name, figure in result.figures.items():  # a CI that is not computable is left out, never NaN
        for stat in ("ci_low", "ci_high"):
            logged_ci = run.data.metrics.get(f"calibration/{name}_{stat}")
            assert logged_ci == (None if figure[stat] is None else pytest.approx(figure[stat])), (name, stat)
    assert client.get_experiment(run.info.experiment_id).name == "calib"
    logged = json.loads(mlflow.artifacts.load_text(f"runs:/{result.run_id}/rag_eval/calibration.json"))
    assert logged["figures"]["kendall_tau"] == result.figures["kendall_tau"]
    per_row = json.loads(mlflow.artifacts.load_text(f"runs:/{result.run_id}/rag_eval/calibration_rows.json"))
    assert [r["id"] for r in per_row[:2]] == ["0-ok", "0-bad"]

    assert find_calibration(client, "faithfulness", judge.fingerprint, judge.prompts_version).info.run_id == result.run_id
    assert find_calibration(client, "faithfulness", "0000000000000000", judge.prompts_version) is None
    assert find_calibration(client, "context_recall", judge.fingerprint, judge.prompts_version) is None

    # CSV with a JSON list of contexts; the CLI prints the figures with CIs and logs a newer run
    csv = tmp_path / "human.csv"
    frame = _labels_frame().rename(columns={"context": "contexts"})
    frame["contexts"] = [json.dumps([c]) for c in frame["contexts"]]
    frame.to_csv(csv, index=False)
    assert load_labels(csv)["contexts"][0] == [FACTS[0]]
    out = CliRunner().invoke(main, ["calibrate", "--labels", str(csv), "--limit", "12", "--n-boot", "100",
                                    "--tracking-uri", tracking_uri])
    assert out.exit_code == 0, out.output
    assert "labels: 12" in out.output and "spearman" in out.output and "auroc" in out.output
    newest = find_calibration(client, "faithfulness", judge.fingerprint, judge.prompts_version)
    assert newest.info.run_id != result.run_id and newest.data.metrics["calibration/n_labels"] == 12


def test_bad_labels_are_refused_before_any_judging(tmp_path):
    frame = _labels_frame()
    frame["label"] = frame["label"].astype(float)
    frame.loc[3, "label"] = 1.5
    with pytest.raises(ValueError, match="row 3, column 'label'"):
        calibrate(frame, log=False)
    with pytest.raises(ValueError, match="required column 'label'"):
        load_labels(frame.drop(columns=["label"]))
    bad = tmp_path / "bad.jsonl"
    frame.drop(columns=["answer"]).to_json(bad, orient="records", lines=True)
    out = CliRunner().invoke(main, ["calibrate", "--labels", str(bad), "--no-log"])
    assert out.exit_code == 2 and "required column 'answer'" in out.output


# -- labels left on an evaluation run's traces (the MLflow UI, or mlflow.log_feedback) ----------

def _evaluated_run(local_judge) -> str:
    frame = _labels_frame().rename(columns={"context": "contexts"})
    frame["contexts"] = [[c] for c in frame["contexts"]]
    frame["question"] = [f"When does museum {i} open?" for i in range(len(frame))]
    with mlflow.start_run() as run:
        mlflow.models.evaluate(data=frame.drop(columns=["label", "id"]), model_type="rag", evaluators="rag",
                               evaluator_config={"judge": local_judge, "metrics": ["faithfulness"]})
    return run.info.run_id


def _human(name: str):
    from mlflow.entities import AssessmentSource, AssessmentSourceType

    return AssessmentSource(source_type=AssessmentSourceType.HUMAN, source_id=name)


def test_calibrate_from_the_labels_reviewers_left_on_a_run(tracking_uri, local_judge):
    from mlflow.entities import Feedback

    run_id = _evaluated_run(local_judge)
    client = mlflow.MlflowClient()
    experiment_id = client.get_run(run_id).info.experiment_id
    traces = sorted(client.search_traces(locations=[experiment_id], run_id=run_id, include_spans=False),
                    key=lambda t: int(t.info.trace_metadata["rag_eval.row"]))
    truth = _labels_frame()["label"].tolist()  # 1 for the copied fact, 0 for the edited one
    judged = {}
    for trace, label in zip(traces, truth):
        row = int(trace.info.trace_metadata["rag_eval.row"])
        feedback = next(a for a in trace.info.assessments if isinstance(a, Feedback) and a.name == "faithfulness")
        judged[trace.info.trace_id] = feedback.value
        if row % 5 == 4:
            continue  # not every row gets labelled
        if row % 5 == 0:  # a reviewer overrides the judge's value in the UI: a HUMAN Feedback
            mlflow.override_feedback(trace_id=trace.info.trace_id, assessment_id=feedback.assessment_id,
                                     value=bool(label), source=_human("ana"))
            continue
        mlflow.log_feedback(trace_id=trace.info.trace_id, name="faithfulness", value="yes" if label else "no",
                            source=_human("ana"))
        if row % 5 == 1:  # two reviewers disagree: their labels average
            mlflow.log_feedback(trace_id=trace.info.trace_id, name="faithfulness", value=not label,
                                source=_human("ben"))
    # Feedback under other names, or from judges, is not a label.
    mlflow.log_feedback(trace_id=traces[4].info.trace_id, name="helpfulness", value=True, source=_human("ana"))

    out = CliRunner().invoke(main, ["calibrate", "--run", run_id, "--metric", "faithfulness", "--n-boot", "100",
                                    "--tracking-uri", tracking_uri])
    assert out.exit_code == 0, out.output
    assert "labels: 16   scored: 16" in out.output
    judge = local_judge.info()
    found = find_calibration(client, "faithfulness", judge.fingerprint, judge.prompts_version)
    rows = json.loads(mlflow.artifacts.load_text(f"runs:/{found.info.run_id}/rag_eval/calibration_rows.json"))
    assert len(rows) == 16
    labels = {t.info.trace_id: (int(t.info.trace_metadata["rag_eval.row"]), y) for t, y in zip(traces, truth)}
    for r in rows:
        row, label = labels[r["id"]]
        assert r["score"] == judged[r["id"]]  # the judge's own value, even where a reviewer overrode it
        assert r["label"] == (0.5 if row % 5 == 1 else float(label))
        assert r["n_reviewers"] == (2 if row % 5 == 1 else 1)
    assert found.data.params["rag_eval.calibration.labels_source"] == f"run:{run_id}"
    expected = agreement([r["score"] for r in rows], [r["label"] for r in rows], n_boot=100)
    assert found.data.metrics["calibration/spearman"] == pytest.approx(expected["spearman"]["value"])

    # Unusable input: exit 2 with the reason.
    for args, reason in (
        (["--run", run_id, "--label-name", "nobody_used_this"], "no human 'nobody_used_this' feedback"),
        (["--run", run_id, "--labels", __file__], "exactly one of --labels and --run"),
        ([], "exactly one of --labels and --run"),
        (["--run", "0" * 32], "cannot calibrate"),
    ):
        out = CliRunner().invoke(main, ["calibrate", *args, "--no-log", "--tracking-uri", tracking_uri])
        assert out.exit_code == 2 and reason in out.output, (args, out.output)
    mlflow.log_feedback(trace_id=traces[4].info.trace_id, name="faithfulness", value=7, source=_human("ana"))
    out = CliRunner().invoke(main, ["calibrate", "--run", run_id, "--no-log", "--tracking-uri", tracking_uri])
    assert out.exit_code == 2 and f"trace {traces[4].info.trace_id}" in out.output and "outside [0, 1]" in out.output


def test_label_values_the_ui_produces():
    from mlflow_rag_eval.calibration.labels import label_value

    assert [label_value(v) for v in (True, False, 1, 0, 0.25, "Yes", "no", "PASS", "fail", "0.5")] == \
        [1.0, 0.0, 1.0, 0.0, 0.25, 1.0, 0.0, 1.0, 0.0, 0.5]
    for bad in ("maybe", 3, -0.1, None, [1]):
        with pytest.raises(ValueError):
            label_value(bad)


def test_ppi_from_the_labels_on_a_run_is_logged_and_gated(tracking_uri, local_judge):
    """PPI from a run: the judge's scores of every trace, the humans' labels on some; the
    figures equal ppi_mean on the same numbers, land on the run, and a floor can read them."""
    from mlflow.entities import Feedback

    from mlflow_rag_eval.gate.checks import metric_checks
    from mlflow_rag_eval.gate.policy import load_policy
    from mlflow_rag_eval.stats.ppi import ppi_mean

    run_id = _evaluated_run(local_judge)
    client = mlflow.MlflowClient()
    traces = client.search_traces(locations=[client.get_run(run_id).info.experiment_id], run_id=run_id,
                                  include_spans=False)
    truth = _labels_frame()["label"].tolist()
    labelled, unlabelled = ([], []), []
    for trace in traces:
        row = int(trace.info.trace_metadata["rag_eval.row"])
        score = next(a for a in trace.info.assessments if isinstance(a, Feedback) and a.name == "faithfulness").value
        if row % 4 >= 2:  # half the rows labelled, both labels among them
            unlabelled.append(score)
            continue
        mlflow.log_feedback(trace_id=trace.info.trace_id, name="faithfulness", value=bool(truth[row]),
                            source=_human("ana"))
        labelled[0].append(float(truth[row]))
        labelled[1].append(score)
    out = CliRunner().invoke(main, ["ppi", "--run", run_id, "--metric", "faithfulness", "--tracking-uri", tracking_uri])
    assert out.exit_code == 0, out.output
    expected = ppi_mean(*labelled, unlabelled)
    metrics = client.get_run(run_id).data.metrics
    assert metrics["faithfulness/ppi_mean"] == pytest.approx(expected.mean, abs=1e-12)
    assert (metrics["faithfulness/ppi_ci_low"], metrics["faithfulness/ppi_ci_high"]) == pytest.approx(
        (expected.ci_low, expected.ci_high), abs=1e-12)
    assert metrics["faithfulness/n_human"] == len(labelled[0]) == 10
    assert f"PPI++ mean {expected.mean:.3f}" in out.output
    floor = expected.ci_low - 0.01
    for limit, passes in ((floor, True), (expected.ci_low + 0.01, False)):
        policy = load_policy({"floors": {"faithfulness/ppi_ci_low": limit}, "min_scored_rows": 1,
                              "calibration": {"required": False}})
        # the gate's figures: the run's metrics with the counts recomputed from its rows (a run logs means)
        (check,) = [c for c in metric_checks(figures_of(run_id), policy) if c.kind.startswith("floor")]
        assert check.passed is passes and check.value == pytest.approx(expected.ci_low)
    assert metrics["faithfulness/ppi_confidence"] == 0.95  # the gate reads each run's standard error back
    refused = CliRunner().invoke(main, ["ppi", "--run", run_id, "--label-name", "nobody", "--tracking-uri", tracking_uri])
    assert refused.exit_code == 2 and "at least 2 labelled" in refused.output


def test_ppi_from_a_labels_file_matches_rows_by_question(tracking_uri, local_judge, tmp_path):
    """The same labels in a file (yes/no words, keyed by question) give the estimate the
    traces' feedback gives; a label no row of the run has is refused, naming it."""
    from mlflow_rag_eval.calibration.ppi import ppi_from_run
    from mlflow_rag_eval.compare import load_evaluation
    from mlflow_rag_eval.stats.ppi import ppi_mean

    run_id = _evaluated_run(local_judge)
    table = load_evaluation(run_id).table
    truth = _labels_frame()["label"].tolist()
    picked = [i for i in range(len(table)) if i % 3 != 2]
    path = tmp_path / "labels.jsonl"
    pd.DataFrame({"question": table["question"][picked], "label": ["yes" if truth[i] else "no" for i in picked]}
                 ).to_json(path, orient="records", lines=True)
    out = CliRunner().invoke(main, ["ppi", "--run", run_id, "--labels", str(path), "--no-log",
                                    "--tracking-uri", tracking_uri])
    assert out.exit_code == 0, out.output
    scores = pd.to_numeric(table["faithfulness/score"]).tolist()
    expected = ppi_mean([float(truth[i]) for i in picked], [scores[i] for i in picked],
                        [scores[i] for i in range(len(table)) if i not in picked])
    assert f"PPI++ mean {expected.mean:.3f}" in out.output
    assert ppi_from_run(run_id, labels=path, log=False).ci_low == pytest.approx(expected.ci_low, abs=1e-12)
    few = tmp_path / "few.jsonl"
    pd.read_json(path, lines=True).head(4).to_json(few, orient="records", lines=True)
    out = CliRunner().invoke(main, ["ppi", "--run", run_id, "--labels", str(few), "--no-log",
                                    "--tracking-uri", tracking_uri])
    assert out.exit_code == 0, out.output  # an estimate without an interval, and why
    assert "no CI (4 human labels, fewer than 10" in out.output, out.output
    stray = pd.DataFrame({"question": ["When does the zoo open?"], "label": [1]})
    with pytest.raises(ValueError, match=r"labels row 0 \(question='When does the zoo open\?'\): matches 0 rows"):
        ppi_from_run(run_id, labels=stray, log=False)
