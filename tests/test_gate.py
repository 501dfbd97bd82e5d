"""The promotion gate against a real sqlite registry: promotion, refusals, calibration, CLI,
policy validation, history and the pytest helpers."""

from __future__ import annotations

import json
import shutil

import mlflow
import pandas as pd
import pytest
from click.testing import CliRunner

from mlflow_rag_eval.cli import main
from mlflow_rag_eval.gate import GateDecision, PolicyError, calibrate, gate, gate_history, load_policy
from mlflow_rag_eval.gate.checks import Check
from mlflow_rag_eval.judges.local import LocalJudge
from mlflow_rag_eval.pytest_plugin import assert_gate_passes, assert_metrics_meet

pytest_plugins = ["pytester"]

N = 15
PASSAGES = [f"Route {i} trains leave platform {i + 2} every {10 + i} minutes." for i in range(N)]
DISTRACTORS = [{"id": "d1", "text": "The station cafe opens at seven in the morning."},
               {"id": "d2", "text": "Lost property is kept at the ticket office."}]
POLICY = {
    "require_metrics": ["faithfulness", "mrr"],
    "min_scored_rows": 10,
    "max_error_rate": 0.05,
    "floors": {"faithfulness/mean": 0.6, "mrr/mean": 0.3},
    "max_regression": {"faithfulness": 0.03, "mrr": 0.05, "ndcg@10": 0.05},
    "calibration": {"required": False},
}


def _wrong(i: int) -> str:
    """An answer whose numbers no context holds: unsupported for the local judge."""
    return f"Route {i} trains leave platform {i + 40} every {90 + i} minutes."


def _predictions(n_bad: int = 0, question_suffix: str = "") -> pd.DataFrame:
    """Static predictions on the golden rows; the first ``n_bad`` rows answer wrongly and rank
    the relevant passage last."""
    rows = []
    for i in range(N):
        relevant = {"id": f"p{i}", "text": PASSAGES[i]}
        bad = i < n_bad
        rows.append({
            "question": f"How often do route {i} trains leave, and from which platform?{question_suffix}",
            "answer": _wrong(i) if bad else PASSAGES[i],
            "contexts": [*DISTRACTORS, relevant] if bad else [relevant, *DISTRACTORS],
            "reference": f"Every {10 + i} minutes, from platform {i + 2}.",
            "relevant_ids": [f"p{i}"],
        })
    return pd.DataFrame(rows)


def _labelled(flip: bool = False) -> pd.DataFrame:
    """Faithful (label 1) and unfaithful (label 0) answers on the same contexts."""
    rows = []
    for i in range(12):
        rows.append({"answer": PASSAGES[i], "contexts": [PASSAGES[i]], "label": 0 if flip else 1})
        rows.append({"answer": _wrong(i), "contexts": [PASSAGES[i]], "label": 1 if flip else 0})
    return pd.DataFrame(rows)


@pytest.fixture(scope="session")
def _template_db(tmp_path_factory):
    """An initialised empty store, copied per test: creating the schema costs seconds."""
    path = tmp_path_factory.mktemp("gate_store") / "mlflow.db"
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{path}", registry_uri=f"sqlite:///{path}")
    client.search_experiments()
    client.search_registered_models()
    return path


@pytest.fixture
def registry(tmp_path, monkeypatch, _template_db):
    """A fresh sqlite tracking store + model registry (a copy of the template) for each test."""
    shutil.copy(_template_db, tmp_path / "mlflow.db")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_ID", "")
    monkeypatch.delenv("MLFLOW_EXPERIMENT_ID")
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment("tests")
    yield mlflow.MlflowClient()
    if mlflow.active_run():
        mlflow.end_run()
    mlflow.clear_active_model()
    mlflow.set_tracking_uri(None)


def _register(name: str) -> tuple[str, str]:
    """A registered version of a (trivially) logged model: (version, model id)."""
    model = mlflow.create_external_model(name="rag")
    return str(mlflow.register_model(f"models:/{model.model_id}", name).version), model.model_id


def _evaluate(model_id: str, data: pd.DataFrame, judge) -> str:
    with mlflow.start_run() as run:
        mlflow.models.evaluate(data=data, model_type="rag", evaluators="rag", model_id=model_id,
                               evaluator_config={"judge": judge, "metrics": ["faithfulness", "mrr", "ndcg@10", "hit@5"]})
    return run.info.run_id


def _candidate(name: str, data: pd.DataFrame, judge) -> tuple[str, str]:
    version, model_id = _register(name)
    return version, _evaluate(model_id, data, judge)


def _decision_json(client, run_id: str) -> dict:
    return json.loads(mlflow.artifacts.load_text(f"runs:/{run_id}/rag_eval/gate_decision.json"))


# -- policy ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("policy, key", [
    ({"require_metric": ["faithfulness"]}, "require_metric"),
    ({"calibration": {"required": True, "min_lables": 50}}, "calibration.min_lables"),
    ({"regression_test": {"confidence": 0.95, "alpha": 0.1}}, "regression_test.alpha"),
    ({"max_regression": {"faithfulness": -0.03}}, "max_regression.faithfulness"),
    ({"floors": {"faithfulness/mean": 1.2}}, "floors.faithfulness/mean"),
    ({"floors": {"faithfulness/mean": "high"}}, "floors.faithfulness/mean"),
    ({"floors": {"faithfulness/average": 0.8}}, "floors.faithfulness/average"),
    ({"floors": {"false_abstention/mean": 0.1}}, "floors.false_abstention/mean"),
    ({"min_scored_rows": "30"}, "min_scored_rows"),
    ({"min_scored_rows": True}, "min_scored_rows"),
    ({"require_metrics": "faithfulness"}, "require_metrics"),
    ({"max_error_rate": 1.5}, "max_error_rate"),
    ({"calibration": {"min_labels": 0}}, "calibration.min_labels"),
    ({"regression_test": {"confidence": 1.0}}, "regression_test.confidence"),
    ({"regression_test": {"decide_on": "mean"}}, "regression_test.decide_on"),
])
def test_a_bad_policy_names_the_key(policy, key):
    with pytest.raises(PolicyError) as info:
        load_policy(policy)
    assert info.value.key == key and key in str(info.value)


def test_policy_hash_is_canonical(tmp_path):
    path = tmp_path / "gate.yaml"
    path.write_text("max_regression: {ndcg@10: 0.02}\nrequire_metrics: [faithfulness]\n")
    a = load_policy(path)
    b = load_policy({"require_metrics": ["faithfulness"], "max_regression": {"ndcg_at_10": 0.02},
                     "calibration": {"required": True, "min_labels": 50}})
    assert a == b and a.policy_hash == b.policy_hash and len(a.policy_hash) == 64
    assert a.policy_hash != load_policy({"require_metrics": ["faithfulness"]}).policy_hash
    assert a.gated_metrics == ["faithfulness", "ndcg_at_10"]
    (tmp_path / "bad.yaml").write_text("floors: [1, 2\n")
    with pytest.raises(PolicyError, match="not valid YAML"):
        load_policy(tmp_path / "bad.yaml")


# -- decisions -------------------------------------------------------------------------------------
def test_a_better_pipeline_is_promoted_and_the_history_records_it(registry, local_judge):
    from pipeline import load_golden, log_pipeline

    golden = load_golden().head(15)
    versions, runs = [], []
    for k in (1, 5):  # k=1 retrieves one passage: worse recall and ranking than k=5
        with mlflow.start_run():
            info = log_pipeline(k=k)
        versions.append(str(mlflow.register_model(info.model_uri, "northwind").version))
        with mlflow.start_run() as run:
            mlflow.models.evaluate(model=info.model_uri, data=golden, model_type="rag", evaluators="rag",
                                   evaluator_config={"judge": local_judge,
                                                     "metrics": ["faithfulness", "mrr", "ndcg@10", "hit@5"]})
        runs.append(run.info.run_id)
    policy = {"require_metrics": ["faithfulness", "hit@5"], "min_scored_rows": 10,
              "floors": {"faithfulness/mean": 0.5, "hit_at_5/mean": 0.3},
              "max_regression": {"faithfulness": 0.03, "ndcg@10": 0.02}, "calibration": {"required": False}}

    first = gate("northwind", versions[0], policy)  # first version: no champion, floors only
    assert first.exit_code == 0 and first.champion_version is None and first.comparison is None
    assert {c.kind for c in first.checks} == {"min_scored_rows", "floor mean"}
    assert any("no champion" in n for n in first.notes)

    decision = gate("northwind", versions[1], policy)
    assert decision.exit_code == 0 and decision.passed, decision.to_text()
    assert decision.champion_version == versions[0] and decision.champion_run_id == runs[0]
    assert decision.candidate_run_id == runs[1]
    by = {(c.metric, c.kind): c for c in decision.checks}
    assert by[("ndcg_at_10", "regression")].delta > 0  # graded relevance: the second passage counts
    assert by[("hit_at_5", "floor mean")].delta == 0  # the first relevant passage is ranked first by both
    assert str(registry.get_model_version_by_alias("northwind", "champion").version) == versions[1]
    assert str(registry.get_model_version_by_alias("northwind", "previous_champion").version) == versions[0]
    tags = registry.get_model_version("northwind", versions[1]).tags
    assert tags["rag_eval.gate"] == "passed" and tags["rag_eval.gate_run_id"] == runs[1]
    assert tags["rag_eval.gate_policy_sha256"] == load_policy(policy).policy_hash
    assert tags["rag_eval.gate_decided_at"] == decision.decided_at
    logged = _decision_json(registry, runs[1])
    assert logged["verdict"] == "passed" and logged["champion_version"] == versions[0]
    assert {m["metric"] for m in logged["comparison"]["metrics"]} >= {"faithfulness", "ndcg_at_10"}
    assert "GATE PASSED" in decision.to_text() and "ndcg_at_10" in decision.to_text()

    history = gate_history("northwind")
    assert list(history["version"]) == versions and list(history["verdict"]) == ["passed", "passed"]
    assert history["decided_at"].is_monotonic_increasing
    assert history["champion_version"].isna().tolist() == [True, False]  # first version: no champion
    assert history["champion_version"][1] == versions[0] and history["n_failed"].tolist() == [0, 0]


def test_a_regressed_candidate_is_refused_and_the_alias_stays(registry, local_judge):
    champion, champion_run = _candidate("rag", _predictions(), local_judge)
    assert gate("rag", champion, POLICY).passed
    candidate, run = _candidate("rag", _predictions(n_bad=3), local_judge)
    decision = gate("rag", candidate, POLICY)
    assert decision.exit_code == 1 and not decision.passed
    failed = {(c.metric, c.kind) for c in decision.failed_checks}
    assert failed == {("faithfulness", "regression"), ("mrr", "regression"), ("ndcg_at_10", "regression")}
    reason = next(r for r in decision.reasons if r.startswith("faithfulness regressed"))
    assert "paired delta -0.200 < -0.03" in reason and "Wilcoxon p=" in reason
    compared = {m["metric"]: m for m in decision.comparison["metrics"]}["faithfulness"]
    assert f"95% CI [{compared['ci_low']:+.3f}, {compared['ci_high']:+.3f}]" in reason  # the comparison's CI
    assert str(registry.get_model_version_by_alias("rag", "champion").version) == champion
    assert registry.get_model_version("rag", candidate).tags["rag_eval.gate"] == "failed"
    logged = _decision_json(registry, run)
    assert logged["verdict"] == "failed" and logged["exit_code"] == 1 and logged["reasons"] == decision.reasons
    assert logged["champion_run_id"] == champion_run
    with pytest.raises(Exception):
        registry.get_model_version_by_alias("rag", "previous_champion")

    # decide_on: ci_low is stricter: a drop of one row in 15 is within the 0.1 tolerance on the
    # point estimate (-0.067), not on the lower bound of its 90% CI.
    strict = {**POLICY, "max_regression": {"faithfulness": 0.1}, "floors": {},
              "regression_test": {"decide_on": "ci_low", "confidence": 0.9}}
    lenient = {**strict, "regression_test": {"decide_on": "point"}}
    small, _ = _candidate("rag", _predictions(n_bad=1), local_judge)
    assert gate("rag", small, lenient, record=False).passed  # drop 1/15 = 0.067 <= 0.1
    refused = gate("rag", small, strict, record=False)
    assert not refused.passed and "90% CI lower bound" in refused.reasons[0]


def test_a_first_version_is_judged_on_floors_alone(registry, local_judge):
    version, _ = _candidate("solo", _predictions(n_bad=8), local_judge)
    decision = gate("solo", version, POLICY)
    assert decision.exit_code == 1 and decision.champion_version is None
    assert [c.kind for c in decision.failed_checks] == ["floor mean"]
    assert decision.reasons == [f"faithfulness/mean = {7 / 15:.3f} < floor 0.6"]
    assert not any(c.kind == "regression" for c in decision.checks)
    with pytest.raises(Exception):
        registry.get_model_version_by_alias("solo", "champion")


def test_a_judge_change_is_refused_unless_allowed(registry, local_judge):
    champion, _ = _candidate("judged", _predictions(), local_judge)
    gate("judged", champion, POLICY)
    candidate, run = _candidate("judged", _predictions(), LocalJudge(support_threshold=0.7))
    refused = gate("judged", candidate, POLICY)
    assert refused.exit_code == 1 and refused.reasons[0].startswith("judge changed")
    assert refused.judge_fingerprints["candidate"] != refused.judge_fingerprints["champion"]
    assert str(registry.get_model_version_by_alias("judged", "champion").version) == champion

    allowed = gate("judged", candidate, POLICY, allow_judge_change=True)
    assert allowed.exit_code == 0 and allowed.allow_judge_change
    assert any("judge changed" in n for n in allowed.notes)
    assert _decision_json(registry, run)["allow_judge_change"] is True
    assert str(registry.get_model_version_by_alias("judged", "champion").version) == candidate


def test_calibration_is_required_and_its_figure_is_checked(registry, local_judge):
    policy = {**POLICY, "calibration": {"required": True, "min_labels": 20, "min_spearman": 0.7}}
    version, _ = _candidate("calibrated", _predictions(), local_judge)
    fingerprint = local_judge.info().fingerprint

    missing = gate("calibrated", version, policy, record=False)
    assert missing.exit_code == 1
    # faithfulness is judge-graded; mrr and ndcg@10 compare ids and need no calibration
    assert missing.reasons == [f"no calibration record for judge {fingerprint} on faithfulness"]

    good = calibrate(_labelled(), "faithfulness", local_judge, n_boot=200)
    assert good.spearman > 0.9
    passed = gate("calibrated", version, policy, record=False)
    assert passed.exit_code == 0, passed.to_text()
    assert good.run_id in next(c.detail for c in passed.checks if c.kind == "calibration")

    flipped = calibrate(_labelled(flip=True), "faithfulness", local_judge, n_boot=200)  # the newest wins
    refused = gate("calibrated", version, policy, record=False)
    assert refused.exit_code == 1
    assert refused.reasons == [f"faithfulness: calibration rho {flipped.spearman:.2f} < 0.7 on 24 labels"]
    few = gate("calibrated", version, {**policy, "calibration": {"min_labels": 30, "min_spearman": -1}},
               record=False)
    assert few.reasons == [f"faithfulness: calibration on 24 labels < min_labels 30 (rho {flipped.spearman:.2f})"]


def test_cli_exit_codes_and_unusable_input(registry, local_judge, tmp_path):
    policy = tmp_path / "gate.yaml"
    policy.write_text(json.dumps(POLICY))  # JSON is YAML
    champion, _ = _candidate("cli", _predictions(), local_judge)
    regressed, _ = _candidate("cli", _predictions(n_bad=3), local_judge)
    other_digest, _ = _candidate("cli", _predictions(question_suffix=" (v2)"), local_judge)
    unevaluated, _ = _register("cli")
    uri = mlflow.get_tracking_uri()
    runner = CliRunner()

    def run(version, *extra, policy_path=policy):
        return runner.invoke(main, ["gate", "--model", "cli", "--candidate", version, "--policy", str(policy_path),
                                    "--tracking-uri", uri, *extra])

    result = run(champion)
    assert result.exit_code == 0, result.output
    assert "GATE PASSED" in result.output and "faithfulness" in result.output
    result = run(regressed)
    assert result.exit_code == 1 and "GATE FAILED" in result.output and "regressed" in result.output
    result = run(other_digest)
    assert result.exit_code == 2 and "dataset digest mismatch" in result.output
    result = run(unevaluated)
    assert result.exit_code == 2 and "no evaluation run" in result.output
    assert "rag_eval.gate" not in registry.get_model_version("cli", unevaluated).tags  # nothing recorded
    assert run("99").exit_code == 2
    wrong_model = tmp_path / "other.yaml"
    wrong_model.write_text("model: another-model\n")
    assert run(champion, policy_path=wrong_model).exit_code == 2
    bad = tmp_path / "bad.yaml"
    bad.write_text("max_regression: {faithfulness: -1}\n")
    result = run(champion, "--json", policy_path=bad)
    assert result.exit_code == 2 and "max_regression.faithfulness" in json.loads(result.output)["reasons"][0]
    assert str(registry.get_model_version_by_alias("cli", "champion").version) == champion


# -- pytest helpers --------------------------------------------------------------------------------
def test_the_assertion_helpers_explain_each_failed_check():
    checks = [
        Check("faithfulness", "floor mean", 0.71, 0.85, False, "faithfulness/mean = 0.710 < floor 0.85", delta=-0.12),
        Check("faithfulness", "regression", -0.12, -0.03, False, "faithfulness regressed: ...", delta=-0.12),
        Check("mrr", "floor mean", 0.9, 0.3, True, delta=0.01),
    ]
    decision = GateDecision("rag", "7", False, 1, reasons=[c.reason for c in checks if c.reason], checks=checks)
    with pytest.raises(AssertionError) as info:
        assert_gate_passes(decision)
    text = str(info.value)
    assert text.splitlines()[0] == "RAG gate failed for rag v7 (exit 1, 2 of 3 checks failed)"
    assert "faithfulness" in text and "0.7100" in text and "0.8500" in text and "-0.1200" in text
    assert "mrr" not in text
    assert_gate_passes(GateDecision("rag", "8", True, 0))

    metrics = {"faithfulness/mean": 0.8, "faithfulness/n_scored": 40, "faithfulness/n_error": 5}
    policy = {"require_metrics": ["faithfulness", "context_recall"], "max_error_rate": 0.05,
              "floors": {"faithfulness/mean": 0.85}}
    with pytest.raises(AssertionError) as info:
        assert_metrics_meet(metrics, policy)
    text = str(info.value)
    assert "3 of 4 checks failed" in text
    assert "context_recall was not logged by the evaluation" in text
    assert "error rate 0.111 (5/45) > 0.05" in text and "faithfulness/mean = 0.800 < floor 0.85" in text
    assert_metrics_meet({**metrics, "faithfulness/n_error": 0, "faithfulness/mean": 0.9},
                        {"require_metrics": ["faithfulness"], "floors": {"faithfulness/mean": 0.85}})


def test_the_pytest_plugin_option_and_fixtures(pytester, monkeypatch):
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")  # load it once, by -p, installed or not
    pytester.makefile(".yaml", gate="require_metrics: [faithfulness]\nfloors: {faithfulness/mean: 0.9}\n")
    pytester.makepyfile("""
        from mlflow_rag_eval.pytest_plugin import assert_metrics_meet

        def test_policy(rag_gate_policy):
            assert rag_gate_policy.require_metrics == ("faithfulness",)
            assert_metrics_meet({"faithfulness/mean": 0.5, "faithfulness/n_scored": 20}, rag_gate_policy)

        def test_gate_fixture(rag_gate):
            assert callable(rag_gate)
    """)
    result = pytester.runpytest_inprocess("-p", "mlflow_rag_eval.pytest_plugin", "--rag-gate-policy", "gate.yaml")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*faithfulness/mean = 0.500 < floor 0.9*"])
    result = pytester.runpytest_inprocess("-p", "mlflow_rag_eval.pytest_plugin", "-k", "policy")
    result.stdout.fnmatch_lines(["*no gate policy: pass --rag-gate-policy*"])
