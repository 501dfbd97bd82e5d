"""The promotion gate: policy, decision, judge calibration and decision history.

    from mlflow_rag_eval.gate import calibrate, gate, gate_history, load_policy

    calibrate("human.jsonl", metric="faithfulness", judge="local:minilm-l6")   # once per judge
    calibrate_from_run(run_id, metric="faithfulness")    # or from labels left in the MLflow UI
    decision = gate("rag-pipeline", "7", "gate.yaml")                          # in CI
    raise SystemExit(decision.exit_code)                                      # 0 / 1 / 2

Importing this package does not import MLflow or a judge model; the functions do, when called.
"""

from mlflow_rag_eval.calibration.calibrate import CalibrationResult, calibrate, calibrate_from_run
from mlflow_rag_eval.calibration.labels import load_labels
from mlflow_rag_eval.gate.checks import Check
from mlflow_rag_eval.gate.decision import DECISION_FILE, GateDecision, gate
from mlflow_rag_eval.gate.history import gate_history
from mlflow_rag_eval.gate.policy import (
    CalibrationRequirement,
    GatePolicy,
    PolicyError,
    RegressionTest,
    load_policy,
)

__all__ = [
    "DECISION_FILE", "CalibrationRequirement", "CalibrationResult", "Check", "GateDecision",
    "GatePolicy", "PolicyError", "RegressionTest", "calibrate", "calibrate_from_run", "gate", "gate_history", "load_labels",
    "load_policy",
]
