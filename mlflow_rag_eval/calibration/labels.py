"""Human labels, read one way for calibration and PPI: labels files (CSV, JSON, JSONL), the
HUMAN Feedback reviewers leave on an evaluation run's traces, and their values as numbers in
[0, 1] (yes/no, pass/fail, booleans, numbers)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from mlflow_rag_eval.keys import metric_key

__all__ = ["label_value", "labels_from_run", "load_labels", "read_labels_file"]


def read_labels_file(path: str | Path) -> pd.DataFrame:
    """A labels file as it is: CSV by its ``.csv`` suffix, else JSON (JSON lines for ``.jsonl``
    and ``.ndjson``). Every reader of human labels (calibration, PPI) reads them this way."""
    path = Path(path)
    if path.suffix == ".csv":
        return pd.read_csv(path)
    return pd.read_json(path, lines=path.suffix in (".jsonl", ".ndjson"), dtype=False)


def load_labels(labels: pd.DataFrame | str | Path) -> pd.DataFrame:
    """Read labels (CSV, JSONL or JSON) and normalise them to record columns plus ``label``.

    Columns: ``answer``, ``contexts`` (a list, or one context string; ``context`` is accepted
    too), ``label`` (a number in [0, 1]); ``question``, ``reference`` and ``id`` are optional.
    """
    if isinstance(labels, (str, Path)):
        frame = read_labels_file(labels)
    elif isinstance(labels, pd.DataFrame):
        frame = labels.copy()
    else:
        raise TypeError(f"labels must be a DataFrame or a file path, got {type(labels).__name__}")
    frame = frame.reset_index(drop=True)
    if "contexts" not in frame.columns and "context" in frame.columns:
        frame = frame.rename(columns={"context": "contexts"})
    for column in ("answer", "contexts", "label"):
        if column not in frame.columns:
            raise ValueError(f"labels: required column {column!r} is missing (columns: {list(frame.columns)})")
    frame["contexts"] = [c if not isinstance(c, str) else _maybe_list(c) for c in frame["contexts"]]
    if "question" not in frame.columns:
        # faithfulness ignores the question; records need one, and a unique one keeps rows apart.
        frame["question"] = [f"(calibration row {i})" for i in range(len(frame))]
    label = pd.to_numeric(frame["label"], errors="coerce")
    bad = label.isna() | (label < 0) | (label > 1)
    if bad.any():
        row = int(np.flatnonzero(bad.to_numpy())[0])
        raise ValueError(f"labels: row {row}, column 'label': must be a number in [0, 1], got {frame['label'][row]!r}")
    frame["label"] = label.astype(float)
    return frame


def _maybe_list(text: str) -> list[str]:
    """A CSV cell holding a JSON list of contexts, or one context string."""
    if text.lstrip().startswith("["):
        try:
            value = json.loads(text)
            if isinstance(value, list):
                return value
        except json.JSONDecodeError:
            pass
    return [text]


_YES = {"yes", "true", "pass", "passed", "correct", "1"}
_NO = {"no", "false", "fail", "failed", "incorrect", "0"}


def label_value(value: Any) -> float:
    """A human Feedback value as a label in [0, 1]: booleans, numbers in [0, 1], or yes/no,
    pass/fail, true/false words (what the MLflow UI's feedback forms produce)."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if 0.0 <= float(value) <= 1.0:
            return float(value)
        raise ValueError(f"label {value!r} is outside [0, 1]")
    if isinstance(value, str):
        word = value.strip().lower()
        if word in _YES:
            return 1.0
        if word in _NO:
            return 0.0
        try:
            return label_value(float(word))
        except ValueError:
            pass
    raise ValueError(f"label {value!r} is not a yes/no, a boolean or a number in [0, 1]")


def _run_traces(client, run) -> list:
    from mlflow_rag_eval._util.mlflow_compat import search_traces

    infos, token = [], None
    while True:
        page = search_traces(client, run.info.experiment_id, run_id=run.info.run_id,
                             include_spans=False, max_results=500, page_token=token)
        infos += [t.info for t in page]
        token = page.token
        if not token:
            return infos


def labels_from_run(run_id: str, metric: str = "faithfulness", *, label_name: str | None = None,
                    client=None, unlabelled: bool = False) -> tuple[pd.DataFrame, dict[str, str]]:
    """Pair, trace by trace, the judge's Feedback on ``metric`` with the humans' Feedback.

    On each of the run's traces: the judge's value is the Feedback named after the metric key
    that the evaluation logged (source LLM_JUDGE or CODE, ``mlflow.assessment.sourceRunId`` =
    the run), kept even when a reviewer overrode it in the UI; the label is the HUMAN Feedback
    named ``label_name`` (default: the metric key), the newest of each reviewer, averaged over
    reviewers. Traces without a label are left out; a label that is not a yes/no or a number
    in [0, 1] stops with an error naming the trace.

    ``unlabelled``: keep the traces no human labelled too, with a None label (PPI needs the
    judge's scores of every row).

    Returns:
        rows (trace id, label, score, status, justification) and the run's judge identity.
    """
    import mlflow
    from mlflow.entities import AssessmentSourceType, Feedback

    client = client or mlflow.MlflowClient()
    run = client.get_run(run_id)
    params = run.data.params
    from mlflow_rag_eval.tracking.search import is_evaluation_run

    if not is_evaluation_run(run):  # by its params: a tag can be deleted
        raise ValueError(f"run {run_id} holds no rag evaluation")
    key = metric_key(metric)
    label_name = label_name or key
    rows = []
    for info in _run_traces(client, run):
        judged, humans = None, {}
        for a in info.assessments or []:
            if not isinstance(a, Feedback):
                continue
            source = a.source.source_type if a.source else None
            if (a.name == key and source in (AssessmentSourceType.LLM_JUDGE, AssessmentSourceType.CODE)
                    and (a.metadata or {}).get("mlflow.assessment.sourceRunId", run_id) == run_id):
                judged = a
            elif a.name == label_name and source == AssessmentSourceType.HUMAN and a.error is None \
                    and a.value is not None:
                who = a.source.source_id or "unknown"
                if who not in humans or (a.create_time_ms or 0) >= (humans[who].create_time_ms or 0):
                    humans[who] = a
        if not humans and not unlabelled:
            continue
        try:
            label = float(np.mean([label_value(a.value) for a in humans.values()])) if humans else None
        except ValueError as exc:
            raise ValueError(f"trace {info.trace_id}, feedback {label_name!r}: {exc}") from None
        if judged is None:
            status, score, why = "skipped", None, f"the evaluation logged no {key} feedback on this trace"
        elif judged.error is not None:
            status, score, why = "error", None, judged.error.error_message or judged.error.error_code
        else:
            status, score, why = "scored", float(judged.value), judged.rationale or ""
        rows.append({"id": info.trace_id, "label": label, "score": score, "status": status,
                     "justification": why, "n_reviewers": len(humans)})
    identity = {k: params.get(f"rag_eval.{k}", "") for k in ("judge", "judge_fingerprint", "prompts_version")}
    columns = ["id", "label", "score", "status", "justification", "n_reviewers"]
    return pd.DataFrame(rows, columns=columns), identity
