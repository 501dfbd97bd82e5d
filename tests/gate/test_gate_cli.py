"""The ``gate`` CLI command against a real sqlite registry: exit codes 0 / 1 / 2, and unusable
input refused in one line with nothing recorded."""

from __future__ import annotations

import json

import mlflow
import pytest
from click.testing import CliRunner
from gate_support import POLICY, _candidate, _predictions, _register

from mlflow_rag_eval.cli import main
from mlflow_rag_eval.gate import gate

pytest_plugins = ["gate_support"]  # its fixture: registry, a fresh sqlite registry per test


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


# -- unusable input, refused in one line -----------------------------------------------------------
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
    # ... and when the candidate itself holds it: it is no first version either
    result = _gate_cli(champion, policy, "--first-version")
    assert result.exit_code == 2, result.output
    assert f"v{champion} (the candidate itself) holds alias 'champion'" in _one_line(result)


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
    assert result.exit_code == 0 and "champion: none (first version: no version holds alias 'champion')" in result.output


def test_cli_refuses_a_digest_with_a_quote(registry, champion_and_regressed, tmp_path):
    champion, regressed, run, policy = champion_and_regressed
    quoted = tmp_path / "quoted.yaml"
    quoted.write_text(json.dumps({**POLICY, "dataset_digest": "abc'; --"}))
    result = _gate_cli(regressed, quoted)
    assert result.exit_code == 2 and "dataset_digest: must be a dataset digest" in _one_line(result)

    # a digest tag rewritten on the candidate's run is not what the gate reads: the param is,
    # which cannot change (nor goes into a search filter)
    digest = registry.get_run(run).data.params["rag_eval.dataset_digest"]
    registry.set_tag(run, "rag_eval.dataset_digest", "it's")
    decision = gate("reg", regressed, POLICY, record=False)
    assert decision.exit_code == 1 and decision.candidate_run_id == run, decision.to_text()
    assert decision.dataset_digest == digest


def test_cli_gate_on_an_unknown_model_or_version_is_one_line(registry, champion_and_regressed):
    _, _, _, policy = champion_and_regressed
    for model, version in (("reg", "99"), ("reg", "not-a-number"), ("no-such-model", "1")):
        result = _gate_cli(version, policy, model=model)
        assert result.exit_code == 2 and "not found" in _one_line(result), result.output
