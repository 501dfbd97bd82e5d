"""A registered model's sequence of gate decisions."""

from __future__ import annotations

import json

import pandas as pd

from mlflow_rag_eval.gate.decision import DECISIONS_DIR

__all__ = ["gate_history", "HISTORY_COLUMNS"]

HISTORY_COLUMNS = [
    "decided_at", "version", "verdict", "exit_code", "champion_version", "candidate_run_id",
    "champion_run_id", "policy_sha256", "dataset_digest", "judge_fingerprint", "allow_judge_change",
    "n_checks", "n_failed", "reasons",
]


def gate_history(model: str, client=None) -> pd.DataFrame:
    """Every recorded gate decision on ``model``, oldest first (newest last).

    Two searches, both on tags the gate writes:

    1. the versions that were gated, from the model registry::

           client.search_model_versions("name = 'MODEL' and tags.`rag_eval.gate` LIKE '%'")

       each carries ``rag_eval.gate_run_id``, the evaluation run the decision was made on;
    2. on that run, every decision file under ``rag_eval/gate_decisions/`` for this model and
       version (a version gated twice has two rows; its tags keep only the latest). The same
       runs are found with ``mlflow.search_runs(search_all_experiments=True,
       filter_string="tags.`rag_eval.gate.model` = 'MODEL'")``.

    Where a decision file cannot be read (run deleted, artifacts gone), the version's tags give
    one row with what they hold. Unusable-input outcomes (exit 2) are never recorded, so they
    are not in the history.
    """
    import mlflow

    client = client or mlflow.MlflowClient()
    if "'" in model:
        raise ValueError(f"model name {model!r} cannot be searched (quote in the name)")
    versions, token = [], None
    while True:
        page = client.search_model_versions(f"name = '{model}' and tags.`rag_eval.gate` LIKE '%'",
                                            page_token=token)
        versions += list(page)
        token = page.token
        if not token:
            break
    rows = []
    for mv in versions:
        decisions = _decisions(client, mv.tags.get("rag_eval.gate_run_id"), model, str(mv.version))
        if decisions:
            rows += [_row(d) for d in decisions]
        else:
            rows.append({
                "decided_at": mv.tags.get("rag_eval.gate_decided_at"), "version": str(mv.version),
                "verdict": mv.tags.get("rag_eval.gate"), "candidate_run_id": mv.tags.get("rag_eval.gate_run_id"),
                "policy_sha256": mv.tags.get("rag_eval.gate_policy_sha256"),
            })
    frame = pd.DataFrame(rows, columns=HISTORY_COLUMNS)
    return frame.sort_values("decided_at", kind="stable").reset_index(drop=True)


def _decisions(client, run_id: str | None, model: str, version: str) -> list[dict]:
    if not run_id:
        return []
    out = []
    try:
        files = client.list_artifacts(run_id, DECISIONS_DIR)
        from mlflow_rag_eval._util.mlflow_compat import read_run_artifact  # imports MLflow
        for f in files:
            if not f.path.endswith(".json"):
                continue
            doc = json.loads(read_run_artifact(client, run_id, f.path).decode("utf-8"))
            if doc.get("model") == model and str(doc.get("candidate_version")) == version:
                out.append(doc)
    except Exception:  # noqa: BLE001 - a deleted run or artifact store falls back to the tags
        return []
    return out


def _row(doc: dict) -> dict:
    checks = doc.get("checks") or []
    return {
        "decided_at": doc.get("decided_at"), "version": str(doc.get("candidate_version")),
        "verdict": doc.get("verdict"), "exit_code": doc.get("exit_code"),
        "champion_version": doc.get("champion_version"), "candidate_run_id": doc.get("candidate_run_id"),
        "champion_run_id": doc.get("champion_run_id"), "policy_sha256": doc.get("policy_hash"),
        "dataset_digest": doc.get("dataset_digest"),
        "judge_fingerprint": (doc.get("judge_fingerprints") or {}).get("candidate"),
        "allow_judge_change": doc.get("allow_judge_change"), "n_checks": len(checks),
        "n_failed": sum(not c.get("passed") for c in checks), "reasons": doc.get("reasons") or [],
    }
