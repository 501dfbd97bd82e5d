"""The gate policy (``gate/policy.py``): validation naming the key, defaults, hashing, the
shipped JSON schema and the example policy."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT
from gate_support import POLICY

from mlflow_rag_eval.gate import PolicyError, load_policy
from mlflow_rag_eval.pytest_plugin import assert_metrics_meet


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


# -- defaults, and input the gate must refuse ------------------------------------------------------
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
        "^.+/(mean|median|p10|worst10_mean|ci_low|ci_high|ppi_mean|ppi_ci_low|ppi_ci_high)$"}
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
