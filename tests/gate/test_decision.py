"""The promotion gate against a real sqlite registry: promotion, refusals, calibration, CLI,
policy validation, history and the pytest helpers."""

from __future__ import annotations

import json
import shutil

import mlflow
import pandas as pd
import pytest
from click.testing import CliRunner
from conftest import ROOT

from mlflow_rag_eval.cli import main
from mlflow_rag_eval.gate import GateDecision, PolicyError, calibrate, gate, gate_history, load_policy
from mlflow_rag_eval.gate.checks import Check
from mlflow_rag_eval.judges.providers.local import LocalJudge
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
    assert {c.kind for c in first.checks} == {"min_scored_rows", "max_error_rate", "floor mean"}  # default rate
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


# -- defaults, and input the gate must refuse ------------------------------------------------------
def _flaky_judge():
    """A scripted LLM judge that fails (twice-unparsable reply: ParseError) on answers marked
    "(flaky)" and supports every other answer. One script object: champion and candidate
    evaluations get the same judge fingerprint."""
    from mlflow_rag_eval.judges.llm.judge import LLMJudge
    from mlflow_rag_eval.judges.providers.scripted import ScriptedBackend

    def reply(variables):
        if "(flaky)" in variables["text"]:
            return "Sorry, I am not sure."
        return {"claims": [{"claim": variables["text"], "supported": True, "reason": "stated"}]}

    return LLMJudge(ScriptedBackend({"claims_verdicts": reply}), cache=False, backoff_base=0.01, backoff_max=0.05)


def test_a_candidate_whose_judge_failed_on_many_rows_is_refused_by_default(registry):
    judge = _flaky_judge()
    policy = {"require_metrics": ["faithfulness"], "min_scored_rows": 5,
              "max_regression": {"faithfulness": 0.03}, "calibration": {"required": False}}
    champion, _ = _candidate("flaky", _predictions(), judge)
    assert gate("flaky", champion, policy).exit_code == 0
    data = _predictions()
    data.loc[:6, "answer"] = data.loc[:6, "answer"] + " (flaky)"  # 7 of 15 rows: 46.7% fail
    candidate, run = _candidate("flaky", data, judge)
    metrics = registry.get_run(run).data.metrics
    assert (metrics["faithfulness/n_error"], metrics["faithfulness/n_scored"]) == (7, 8)

    decision = gate("flaky", candidate, policy)
    assert decision.exit_code == 1 and decision.policy["max_error_rate"] == 0.05
    # the 8 rows both runs scored show no drop at all: only the error rate refuses it
    by = {(c.metric, c.kind): c for c in decision.checks}
    assert by[("faithfulness", "regression")].passed and by[("faithfulness", "regression")].delta == 0
    assert decision.reasons == ["faithfulness: error rate 0.467 (7/15) > 0.05"]
    assert str(registry.get_model_version_by_alias("flaky", "champion").version) == champion
    # an explicit policy may allow it; the decision then says so
    allowed = gate("flaky", candidate, {**policy, "max_error_rate": 0.5}, record=False)
    assert allowed.exit_code == 0 and allowed.policy["max_error_rate"] == 0.5


def test_policy_defaults_are_applied_and_stated():
    policy = load_policy({"require_metrics": ["faithfulness"]})
    assert (policy.min_scored_rows, policy.max_error_rate) == (30, 0.05)
    assert policy.as_dict()["min_scored_rows"] == 30 and policy.as_dict()["max_error_rate"] == 0.05
    few = {"faithfulness/mean": 0.9, "faithfulness/n_scored": 29, "faithfulness/n_error": 1}
    with pytest.raises(AssertionError, match="faithfulness: 29 scored rows < 30"):
        assert_metrics_meet(few, policy)
    assert_metrics_meet({**few, "faithfulness/n_scored": 30}, policy)  # 1/31 = 0.032 <= 0.05
    with pytest.raises(AssertionError, match=r"error rate 0.062 \(2/32\) > 0.05"):
        assert_metrics_meet({**few, "faithfulness/n_scored": 30, "faithfulness/n_error": 2}, policy)


def test_a_run_without_n_error_fails_max_error_rate_and_says_why():
    from mlflow_rag_eval.gate.checks import metric_checks

    checks = metric_checks({"faithfulness/mean": 0.9, "faithfulness/n_scored": 40},
                           load_policy({"require_metrics": ["faithfulness"]}))
    (rate,) = [c for c in checks if c.kind == "max_error_rate"]
    assert not rate.passed and rate.value is None
    assert rate.reason == ("faithfulness/n_error was not logged: the error rate is unknown, so "
                           "max_error_rate 0.05 cannot be checked")


@pytest.mark.parametrize("text", ["", "# only a comment\n", "---\n"])
def test_an_empty_policy_file_is_refused(tmp_path, text):
    path = tmp_path / "gate.yaml"
    path.write_text(text)
    with pytest.raises(PolicyError, match="the policy file is empty"):
        load_policy(path)


@pytest.mark.parametrize("policy", [{}, {"calibration": {"required": False}}, {"max_error_rate": 0.1}])
def test_a_policy_that_gates_no_metric_is_refused(policy):
    with pytest.raises(PolicyError, match="gates no metric") as info:
        load_policy(policy)
    assert info.value.key == "require_metrics"


def test_a_policy_that_is_not_utf8_is_refused_naming_the_byte(tmp_path):
    path = tmp_path / "gate.yaml"
    path.write_bytes("# métriques\nrequire_metrics: [faithfulness]\n".encode("latin-1"))
    with pytest.raises(PolicyError, match=r"not UTF-8 text \(byte 0xe9 at offset 3\)") as info:
        load_policy(path)
    assert info.value.key == str(path)


@pytest.mark.parametrize("digest", ["ab'c", 'ab"c', "a b", "ab\\c"])
def test_a_dataset_digest_that_cannot_be_searched_for_is_refused(digest):
    with pytest.raises(PolicyError) as info:
        load_policy({"require_metrics": ["faithfulness"], "dataset_digest": digest})
    assert info.value.key == "dataset_digest"


def test_max_error_rate_null_is_refused_not_read_as_no_limit():
    with pytest.raises(PolicyError) as info:
        load_policy({"require_metrics": ["faithfulness"], "max_error_rate": None})
    assert info.value.key == "max_error_rate"


@pytest.fixture
def champion_and_regressed(registry, local_judge, tmp_path):
    """Model "reg": v1 holds @champion; v2 regressed (faithfulness -0.2, mrr and ndcg@10 too)."""
    champion, _ = _candidate("reg", _predictions(), local_judge)
    assert gate("reg", champion, POLICY).exit_code == 0
    regressed, run = _candidate("reg", _predictions(n_bad=3), local_judge)
    assert gate("reg", regressed, POLICY, record=False).exit_code == 1  # the policy sees the drop
    policy = tmp_path / "gate.yaml"
    policy.write_text(json.dumps(POLICY))
    return champion, regressed, run, policy


def _gate_cli(version, policy, *extra, model="reg"):
    result = CliRunner().invoke(main, ["gate", "--model", model, "--candidate", version, "--policy", str(policy),
                                       "--tracking-uri", mlflow.get_tracking_uri(), *extra])
    assert "Traceback" not in result.output, result.output
    return result


def _one_line(result) -> str:
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    return lines[0]


@pytest.mark.parametrize("content", [b"", b"# nothing yet\n", "# métriques\nfloors: {}\n".encode("latin-1")])
def test_cli_refuses_an_empty_or_unreadable_policy_on_a_regressed_version(registry, champion_and_regressed,
                                                                          tmp_path, content):
    champion, regressed, run, _ = champion_and_regressed
    policy = tmp_path / "bad.yaml"
    policy.write_bytes(content)
    result = _gate_cli(regressed, policy)
    assert result.exit_code == 2
    line = _one_line(result)
    assert f"reg v{regressed}: unusable input: gate policy: {policy}:" in line
    assert ("not UTF-8" if content.startswith(b"#") and b"\xe9" in content else "the policy file is empty") in line
    assert str(registry.get_model_version_by_alias("reg", "champion").version) == champion
    assert "rag_eval.gate" not in registry.get_model_version("reg", regressed).tags  # nothing recorded


def test_cli_refuses_a_mistyped_alias_naming_the_aliases_that_exist(registry, champion_and_regressed):
    champion, regressed, run, policy = champion_and_regressed
    result = _gate_cli(regressed, policy, "--champion-alias", "champoin")
    assert result.exit_code == 2
    line = _one_line(result)
    assert "alias 'champoin' is not set on model 'reg', whose aliases are champion:" in line
    assert "--first-version" in line
    assert str(registry.get_model_version_by_alias("reg", "champion").version) == champion
    assert "rag_eval.gate" not in registry.get_model_version("reg", regressed).tags

    # the right alias: refused on the regression, exit 1
    result = _gate_cli(regressed, policy)
    assert result.exit_code == 1 and "faithfulness regressed" in result.output
    # --first-version when a version holds the alias: refused as unusable, not judged on floors
    result = _gate_cli(regressed, policy, "--first-version")
    assert result.exit_code == 2 and f"v{champion} holds alias 'champion'" in _one_line(result)


def test_a_first_version_with_other_aliases_needs_first_version(registry, local_judge, tmp_path):
    version, _ = _candidate("aliased", _predictions(), local_judge)
    registry.set_registered_model_alias("aliased", "staging", version)
    policy = tmp_path / "gate.yaml"
    policy.write_text(json.dumps(POLICY))
    result = _gate_cli(version, policy, model="aliased")
    assert result.exit_code == 2 and "whose aliases are staging" in _one_line(result)
    result = _gate_cli(version, policy, "--first-version", model="aliased")
    assert result.exit_code == 0, result.output
    assert "no champion under alias 'champion'" in result.output
    assert str(registry.get_model_version_by_alias("aliased", "champion").version) == version


def test_a_first_version_of_a_model_without_aliases_is_still_gated(registry, local_judge, tmp_path):
    version, _ = _candidate("fresh", _predictions(), local_judge)
    policy = tmp_path / "gate.yaml"
    policy.write_text(json.dumps(POLICY))
    assert registry.get_registered_model("fresh").aliases == {}
    result = _gate_cli(version, policy, model="fresh")
    assert result.exit_code == 0 and "champion: none (first version)" in result.output


def test_cli_refuses_a_digest_with_a_quote(registry, champion_and_regressed, tmp_path):
    champion, regressed, run, policy = champion_and_regressed
    quoted = tmp_path / "quoted.yaml"
    quoted.write_text(json.dumps({**POLICY, "dataset_digest": "abc'; --"}))
    result = _gate_cli(regressed, quoted)
    assert result.exit_code == 2 and "dataset_digest: must be a dataset digest" in _one_line(result)

    # a digest tag on the candidate's run that cannot go into a search filter
    registry.set_tag(run, "rag_eval.dataset_digest", "it's")
    result = _gate_cli(regressed, policy)
    assert result.exit_code == 2
    assert "cannot read the registry or an evaluation run: refusing to search for \"it's\"" in _one_line(result)
    decision = gate("reg", regressed, POLICY)
    assert decision.exit_code == 2 and decision.candidate_run_id == run
    assert "rag_eval.gate" not in registry.get_model_version("reg", regressed).tags


def test_cli_gate_on_an_unknown_model_or_version_is_one_line(registry, champion_and_regressed):
    _, _, _, policy = champion_and_regressed
    for model, version in (("reg", "99"), ("reg", "not-a-number"), ("no-such-model", "1")):
        result = _gate_cli(version, policy, model=model)
        assert result.exit_code == 2 and "not found" in _one_line(result), result.output


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


def test_the_plugin_loads_by_its_entry_point_and_fails_an_unusable_policy_in_one_line(pytester, monkeypatch):
    """As the README shows it: no -p, fixtures taken as arguments, helpers imported."""
    monkeypatch.delenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    pytester.makefile(".yaml", gate="require_metrics: [faithfulness]\nfloors: {faithfulness/mean: 0.9}\n",
                      empty="# nothing yet\n")
    pytester.makepyfile("""
        from mlflow_rag_eval.pytest_plugin import assert_metrics_meet

        def test_meets(rag_gate_policy):
            assert_metrics_meet({"faithfulness/mean": 0.95, "faithfulness/n_scored": 40,
                                 "faithfulness/n_error": 0}, rag_gate_policy)

        def test_gate_fixture(rag_gate):
            assert callable(rag_gate)
    """)
    result = pytester.runpytest_subprocess("--rag-gate-policy", "gate.yaml", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    result = pytester.runpytest_subprocess("--rag-gate-policy", "empty.yaml", "-p", "no:cacheprovider", "-k", "meets")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*gate policy: empty.yaml: the policy file is empty*"])
    result.stdout.no_fnmatch_line("*Traceback*")


def test_a_candidate_whose_rows_were_lost_by_the_store_is_refused(registry, local_judge):
    """The genai route tags rag_eval.rows_lost when MLflow failed to store rows it evaluated:
    the candidate's aggregates then cover a subset, which the gate does not promote."""
    version, run_id = _candidate("lossy", _predictions(), local_judge)
    assert gate("lossy", version, POLICY, record=False).exit_code == 0
    registry.set_tag(run_id, "rag_eval.rows_lost", "2")
    decision = gate("lossy", version, POLICY, record=False)
    assert decision.exit_code == 1
    (check,) = [c for c in decision.failed_checks if c.kind == "rows stored"]
    assert "2 evaluated row(s)" in check.reason and "rag_eval.rows_lost" in check.reason


# -- the policy as a typed file format -------------------------------------------------------------
def test_the_shipped_json_schema_is_the_models():
    from mlflow_rag_eval.gate.policy import SCHEMA_FILE, policy_json_schema

    shipped = json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))
    assert shipped == policy_json_schema(), (
        "policy.schema.json is stale: python -c 'from mlflow_rag_eval.gate.policy import write_json_schema; "
        "write_json_schema()'")
    props = shipped["properties"]
    assert shipped["additionalProperties"] is False
    assert props["max_error_rate"]["default"] == 0.05 and props["min_scored_rows"]["default"] == 30
    assert props["max_error_rate"]["maximum"] == 1 and props["min_scored_rows"]["minimum"] == 0
    assert set(props["floors"]["patternProperties"]) == {
        "^.+/(mean|median|p10|ci_low|ci_high|ppi_mean|ppi_ci_low|ppi_ci_high)$"}
    assert props["floors"]["additionalProperties"] is False
    regression = shipped["$defs"]["RegressionTest"]["properties"]
    assert regression["decide_on"]["enum"] == ["point", "ci_low", "test", "ppi"]
    assert regression["correction"]["enum"] == ["holm", "none"] and regression["correction"]["default"] == "holm"
    assert shipped["$defs"]["CalibrationRequirement"]["additionalProperties"] is False


def test_the_example_policy_loads():

    policy = load_policy(ROOT / "examples" / "gate.yaml")
    assert policy.require_metrics == ("hit_at_5", "mrr", "ndcg_at_10", "faithfulness", "abstention")
    assert policy.max_error_rate == 0.0 and policy.min_scored_rows == 20
    assert policy.floors["abstention/mean"] == 0.5 and policy.max_regression["faithfulness"] == 0.05
    assert policy.slice_floors == {"question_type": {"*": {"faithfulness/mean": 0.8}}}
    # the demo's judge is uncalibrated, and the policy says it waives the check
    assert policy.calibration.required is False


def test_a_policy_is_a_validated_model_however_it_is_made():
    """Found by review: the policy was a plain dataclass; GatePolicy(...) took any value."""
    from pydantic import ValidationError

    from mlflow_rag_eval.gate import GatePolicy, RegressionTest

    with pytest.raises(ValidationError, match="max_error_rate"):
        GatePolicy(require_metrics=("faithfulness",), max_error_rate=2.0)
    with pytest.raises(ValidationError, match="gates no metric"):
        GatePolicy()
    with pytest.raises(ValidationError, match="extra"):
        RegressionTest(alpha=0.1)
    policy = GatePolicy(require_metrics=("ndcg@10",), floors={"hit@5/mean": 1})
    assert policy.require_metrics == ("ndcg_at_10",) and policy.floors == {"hit_at_5/mean": 1.0}
    assert load_policy(policy) is policy
    with pytest.raises(Exception):
        policy.max_error_rate = 1.0  # frozen: the hash stays the policy's


def test_policy_hashes_are_unchanged_by_the_model():
    """The hash is recorded on every decision; these were computed before the policy was a
    pydantic model, and must not move."""
    assert load_policy({"require_metrics": ["faithfulness"]}).policy_hash == \
        "de019576b66592a62c9a36ab70eb333b06e8098bbb2d578d7810446d250e4ea3"
    assert load_policy(POLICY).policy_hash == "cd8afe437476d264c97de1a686f9781cc48b83a85fb67e9bac199ee0a56d4318"
    full = {"model": " rag ", "dataset_digest": "abc123", "require_metrics": ["hit@5", "hit_at_5"],
            "floors": {"hit_at_5/mean": 1, "ndcg@10/p10": 0}, "ceilings": {"false_abstention/mean": 0.1},
            "regression_test": {"confidence": 0.9, "decide_on": "ci_low"},
            "calibration": {"min_labels": 20, "min_spearman": -1}, "max_error_rate": 1}
    assert load_policy(full).policy_hash == "d2249aad53122cef8046fc102d01748952218a3871f7591637d81be3726c9929"


@pytest.mark.parametrize("policy, key, message", [
    ({"require_metrics": ["faithfulness"], "min_scored_rows": -1}, "min_scored_rows", "must be >= 0, got -1"),
    ({"require_metrics": ["faithfulness"], "max_error_rate": float("nan")}, "max_error_rate", "must be finite"),
    ({"require_metrics": ["faithfulness", ""]}, "require_metrics[1]", "must be a non-empty string, got ''"),
    ({"require_metrics": ["f"], "calibration": {"min_spearman": 2}}, "calibration.min_spearman",
     "must be in [-1, 1], got 2"),
    ({"require_metrics": ["f"], "regression_test": {"confidence": 1.0}}, "regression_test.confidence",
     "must be in (0, 1), got 1"),
    ({"require_metrics": ["f"], "calibration": {"required": "yes"}}, "calibration.required",
     "must be true or false, got 'yes'"),
    ({"floors": {"faithfulness": 0.8}}, "floors.faithfulness", "name an aggregate as <metric>/<stat>"),
    ({"ceilings": {"faithfulness/mean": 0.1}}, "ceilings.faithfulness/mean",
     "higher-is-better: put its limit under floors"),
    ({"require_metrics": ["f"], "floors": None}, "floors", "must be a mapping, got NoneType"),
    ({"max_regression": {"ndcg@10": 0.02, "ndcg_at_10": 0.05}}, "max_regression.ndcg_at_10",
     "the same limit as ndcg@10 (ndcg_at_10)"),
])
def test_policy_errors_name_the_key_and_say_what_is_wrong(policy, key, message):
    with pytest.raises(PolicyError) as info:
        load_policy(policy)
    assert info.value.key == key and f"gate policy: {key}: " in str(info.value) and message in str(info.value)


# -- the regression rule's CI ----------------------------------------------------------------------
def _evaluated(run_id: str, scores: list[float]):
    from mlflow_rag_eval.compare import EvaluatedRun

    table = pd.DataFrame({"question": [f"q{i}" for i in range(len(scores))], "reference": "r",
                          "faithfulness/score": scores})
    return EvaluatedRun(run_id, {}, table, {})


def _regression(champion, candidate, **policy):
    from mlflow_rag_eval.compare import compare_evaluations
    from mlflow_rag_eval.gate.checks import regression_check

    policy = load_policy({"max_regression": {"faithfulness": 0.1}, **policy})
    (delta,) = compare_evaluations(champion, candidate).deltas
    return regression_check("faithfulness", champion, candidate, delta, policy)


def test_the_regression_ci_is_the_paired_bca_at_the_policys_confidence():
    from mlflow_rag_eval import stats

    a = [1.0] * 20
    b = [0.0, 0.0, 1.0, 0.5] + [1.0] * 16
    check = _regression(_evaluated("A", a), _evaluated("B", b),
                        regression_test={"confidence": 0.9, "decide_on": "ci_low"})
    low, high = stats.paired_difference_ci(a, b, confidence=0.9)
    assert f"90% CI [{low:+.3f}, {high:+.3f}]" in check.detail
    assert check.value == low and not check.passed and "90% CI lower bound" in check.reason


def test_one_pair_cannot_bound_a_drop():
    """Today's bug: one pair gave the zero-width CI [d, d], which then decided on its own."""
    check = _regression(_evaluated("A", [1.0]), _evaluated("B", [0.95]), regression_test={"decide_on": "ci_low"})
    assert not check.passed and check.value is None
    assert "cannot decide on the 95% CI lower bound" in check.reason
    assert "CI not computable (a CI needs at least 2 paired differences, got 1)" in check.reason
    point = _regression(_evaluated("A", [1.0]), _evaluated("B", [0.95]))
    assert point.passed and point.value == pytest.approx(-0.05)  # the point estimate still decides


def test_equal_differences_decide_on_that_difference():
    same = _regression(_evaluated("A", [0.5, 1.0, 0.0]), _evaluated("B", [0.5, 1.0, 0.0]),
                       regression_test={"decide_on": "ci_low"})
    assert same.passed and same.value == 0 and "CI not computable (all 3 paired differences equal 0" in same.detail
    drop = _regression(_evaluated("A", [1.0] * 4), _evaluated("B", [0.8] * 4), regression_test={"decide_on": "ci_low"})
    assert not drop.passed and drop.reason.startswith("faithfulness regressed: paired delta -0.200 < -0.1")
    assert "no CI to tell a real drop from noise" in drop.reason


def test_decide_on_ppi_decides_on_the_human_corrected_difference():
    """The judge says nothing moved (same scores); the PPI estimates, which human labels
    corrected, say the candidate dropped: the difference's CI is the normal one of two
    independent estimates, each standard error read back from its logged 95% interval."""
    from scipy.stats import norm

    from mlflow_rag_eval.stats.ppi import ppi_difference

    scores = [1.0, 0.0, 1.0, 1.0] * 10
    z = norm.ppf(0.975)

    def with_ppi(run, mean, se):
        run.metrics.update({"faithfulness/ppi_mean": mean, "faithfulness/ppi_ci_low": mean - z * se,
                            "faithfulness/ppi_ci_high": mean + z * se, "faithfulness/ppi_confidence": 0.95})
        return run

    champion = with_ppi(_evaluated("A", scores), 0.80, 0.03)
    dropped = with_ppi(_evaluated("B", scores), 0.62, 0.04)
    check = _regression(champion, dropped, regression_test={"decide_on": "ppi", "confidence": 0.9})
    low = (0.62 - 0.80) - norm.ppf(0.95) * (0.03 ** 2 + 0.04 ** 2) ** 0.5
    assert check.value == pytest.approx(low, abs=1e-12) and not check.passed
    assert check.reason.startswith(f"faithfulness regressed: the PPI CI lower bound {low:+.3f} < -0.1")
    assert "judge: " in check.reason and check.delta == 0  # the judge alone saw no change
    assert ppi_difference(champion.metrics, dropped.metrics, "faithfulness").delta == pytest.approx(-0.18)

    same = with_ppi(_evaluated("C", scores), 0.80, 0.03)
    assert _regression(champion, same, regression_test={"decide_on": "ppi"}).passed
    unlabelled = _regression(champion, _evaluated("D", scores), regression_test={"decide_on": "ppi"})
    assert not unlabelled.passed and unlabelled.value is None
    assert "the candidate run has no PPI estimate of faithfulness" in unlabelled.reason
    assert "mlflow-rag-eval ppi --run RUN --metric faithfulness" in unlabelled.reason


def test_decide_on_ppi_leaves_metrics_the_judge_does_not_grade_to_the_paired_delta():
    from mlflow_rag_eval.compare import EvaluatedRun, compare_evaluations
    from mlflow_rag_eval.gate.checks import regression_check

    def run(run_id, scores):
        return EvaluatedRun(run_id, {}, pd.DataFrame({"question": [f"q{i}" for i in range(4)], "reference": "r",
                                                     "mrr/score": scores}), {"mrr": True})

    a, b = run("A", [1.0, 1.0, 0.5, 1.0]), run("B", [1.0, 0.5, 0.5, 1.0])
    (delta,) = compare_evaluations(a, b).deltas
    check = regression_check("mrr", a, b, delta, load_policy({"max_regression": {"mrr": 0.1},
                                                              "regression_test": {"decide_on": "ppi"}}))
    assert check.value == pytest.approx(-0.125) and not check.passed
    assert check.reason.startswith("mrr regressed: paired delta -0.125 < -0.1")


def test_a_floor_on_a_ci_the_run_could_not_compute_says_so():
    from mlflow_rag_eval.gate.checks import metric_checks

    metrics = {"faithfulness/mean": 1.0, "faithfulness/n_scored": 74, "faithfulness/n_error": 0}
    policy = load_policy({"floors": {"faithfulness/ci_low": 0.8}, "min_scored_rows": 10})
    (floor,) = [c for c in metric_checks(metrics, policy) if c.kind == "floor ci_low"]
    assert not floor.passed and floor.reason == (
        "faithfulness/ci_low was not logged (the CI is not computable: fewer than 2 scored rows, or all of them equal)")


def test_the_decision_table_is_the_shared_text_table():
    decision = GateDecision("rag", "7", False, 1, checks=[
        Check("faithfulness", "floor mean", 0.71, 0.85, False, "x", delta=-0.12),
        Check("ndcg_at_10", "regression", None, -0.02, True),
    ])
    lines = decision.to_text().splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("metric"))
    header, rule, first, second = lines[head:head + 4]
    assert set(rule) == {"-"} and len(rule) == len(header)
    assert header.index("result") == first.index("FAIL") == second.index("ok")
    assert first.split() == ["faithfulness", "floor", "mean", "0.7100", "0.8500", "-0.1200", "FAIL"]
    assert second.split() == ["ndcg_at_10", "regression", "-", "-0.0200", "-", "ok"]


# -- per-slice limits, end to end ------------------------------------------------------------------
def _sliced_version(name: str, *, bad_hard: bool, slice_by=("difficulty",)) -> tuple[str, str]:
    """A registered version evaluated on retrieval metrics (no judge) with a ``difficulty``
    column: every third row is hard; ``bad_hard`` ranks the relevant passage last on those."""
    data = _predictions()
    data["difficulty"] = ["hard" if i % 3 == 0 else "easy" for i in range(N)]
    if bad_hard:
        data["contexts"] = [[*DISTRACTORS, c[0]] if i % 3 == 0 else c for i, c in enumerate(data.contexts)]
    version, model_id = _register(name)
    with mlflow.start_run() as run:
        mlflow.models.evaluate(data=data, model_type="rag", evaluators="rag", model_id=model_id,
                               evaluator_config={"metrics": ["mrr", "hit@5"], "slice_by": list(slice_by),
                                                 "log_traces": False})
    return version, run.info.run_id


SLICED_POLICY = {"require_metrics": ["mrr"], "min_scored_rows": 5, "max_error_rate": 0.0,
                 "slice_floors": {"difficulty": {"*": {"mrr/mean": 0.5}, "hard": {"mrr/mean": 0.9}}},
                 "max_regression": {"mrr": 1.0}, "calibration": {"required": False}}


def test_per_slice_floors_decide_the_gate(registry):
    version, _ = _sliced_version("sliced", bad_hard=False)
    first = gate("sliced", version, SLICED_POLICY)
    assert first.passed, first.to_text()
    assert {(c.slice, c.kind) for c in first.checks if c.slice} == {
        (s, k) for s in ("difficulty=easy", "difficulty=hard") for k in ("min_scored_rows", "floor mean")}
    assert {c.threshold for c in first.checks if c.kind == "floor mean"} == {0.5, 0.9}  # hard: the named floor

    worse, run_id = _sliced_version("sliced", bad_hard=True)
    decision = gate("sliced", worse, SLICED_POLICY)
    assert decision.exit_code == 1
    (failed,) = decision.failed_checks  # easy still passes; the run's mean and regression too
    assert (failed.metric, failed.label) == ("mrr", "floor mean [difficulty=hard]")
    assert failed.reason == f"mrr/mean on slice difficulty=hard = {1 / 3:.3f} < floor 0.9 (n=5)"
    assert failed.delta is None  # the run's paired delta is not the slice's
    assert next(c for c in decision.checks if c.kind == "min_scored_rows" and not c.slice).delta is not None
    assert "floor mean [difficulty=hard]" in decision.to_text()
    logged = _decision_json(registry, run_id)
    assert {c["slice"] for c in logged["checks"]} == {"", "difficulty=easy", "difficulty=hard"}
    assert str(registry.get_model_version_by_alias("sliced", "champion").version) == version


def test_a_per_slice_floor_fails_a_run_that_was_not_sliced(registry):
    version, _ = _sliced_version("unsliced", bad_hard=False, slice_by=())
    decision = gate("unsliced", version, SLICED_POLICY, record=False)
    assert decision.exit_code == 1
    assert {c.slice for c in decision.failed_checks} == {"difficulty=*", "difficulty=hard"}
    assert all("the run was not sliced by 'difficulty' (sliced by: none)" in c.reason for c in decision.failed_checks)


def _paired_runs(n_rows: int, drops: dict[str, float], seed: int = 0):
    """Champion and candidate tables (the comparison's EvaluatedRun) over the same questions;
    the candidate's scores of each metric shifted by ``drops[metric]`` plus a little noise."""
    import numpy as np
    import pandas as pd

    from mlflow_rag_eval.compare import EvaluatedRun

    rng = np.random.default_rng(seed)
    questions = [f"q{i}" for i in range(n_rows)]
    base = {m: rng.uniform(0.2, 0.8, n_rows) for m in drops}
    cand = {m: np.clip(v - drops[m] + rng.normal(0, 0.05, n_rows), 0, 1) for m, v in base.items()}

    def run(name, scores):
        return EvaluatedRun(name, {}, pd.DataFrame({"question": questions, "reference": ["r"] * n_rows,
                                                    **{f"{m}/score": v for m, v in scores.items()}}), {})

    return run("champion", base), run("candidate", cand)


@pytest.mark.parametrize("correction", ["holm", "none"])
def test_decide_on_test_refuses_a_real_drop_and_reports_raw_and_adjusted_p(correction):
    from mlflow_rag_eval.compare import compare_evaluations
    from mlflow_rag_eval.gate.checks import regression_check, regression_p_values
    from mlflow_rag_eval.stats import holm, regression_p

    metrics = {"faithfulness": 0.15, "mrr": 0.0, "hit_at_5": 0.0}
    champion, candidate = _paired_runs(60, metrics)
    policy = load_policy({"max_regression": {m: 0.02 for m in metrics},
                          "regression_test": {"decide_on": "test", "correction": correction}})
    deltas = {d.metric: d for d in compare_evaluations(champion, candidate, n_boot=200).deltas}
    p_values = regression_p_values(champion, candidate, deltas, policy)
    raw = [regression_p(champion.scores(m), candidate.scores(m), 0.02) for m in metrics]
    assert [p_values[m][0] for m in metrics] == raw
    assert [p_values[m][1] for m in metrics] == (holm(raw) if correction == "holm" else raw)
    checks = {m: regression_check(m, champion, candidate, deltas[m], policy, p_values[m]) for m in metrics}
    assert not checks["faithfulness"].passed and "drop beyond 0.02 is significant" in checks["faithfulness"].reason
    assert checks["mrr"].passed and checks["hit_at_5"].passed
    label = "Holm-adjusted" if correction == "holm" else "uncorrected"
    assert f"regression p={raw[1]:.3g} ({label} {p_values['mrr'][1]:.3g})" in checks["mrr"].detail


def test_holm_is_the_step_down_formula():
    from mlflow_rag_eval.stats import holm

    assert holm([0.01, 0.04, 0.03, None, 0.005]) == pytest.approx([0.03, 0.06, 0.06, None, 0.02])
    assert holm([0.5, 0.9]) == [1.0, 1.0] and holm([]) == [] and holm([None]) == [None]
