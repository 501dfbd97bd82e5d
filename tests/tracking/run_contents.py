"""What an evaluation run holds in the tracking store, as one JSON document with everything that
varies from one run of the same rows to the next (ids, times, paths, durations) put in words: two
runs of the same rows and judge give the same document, and a change that moves any row, trace,
Feedback, table or seal shows up as a difference (issue 46: speed changes must not change a run).
"""

from __future__ import annotations

import hashlib
import json
import re
import sysconfig
from pathlib import Path
from typing import Any

import mlflow

#: Values that differ between two runs of the same rows, whatever the code: replaced by a word
#: (the installation's own paths first: a model shipped in a package lives under site-packages,
#: which is elsewhere on every machine).
_VOLATILE = [
    *((re.compile(re.escape(path)), word) for path, word in
      sorted({(sysconfig.get_paths()["purelib"], "<site-packages>"), (sysconfig.get_paths()["platlib"], "<site-packages>"),
              (str(Path(__file__).resolve().parents[2]), "<repo>")}, key=lambda p: -len(p[0]))),
    (re.compile(r"tr-[0-9a-f]{32}"), "<trace id>"),
    (re.compile(r"a-[0-9a-f]{32}"), "<assessment id>"),
    (re.compile(r"\b[0-9a-f]{32}\b"), "<run id>"),
    (re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z?"), "<time>"),
    (re.compile(r"(/tmp|/var/folders)/[^\s\"',)]+"), "<path>"),
    (re.compile(r"models:/m-[0-9a-f]+"), "models:/<model id>"),
    (re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"), "<time>"),
    # the lineage as the report prints it (HTML-escaped JSON): its timings
    (re.compile(r"&#34;(timings_s|latency_s|usage|versions)&#34;: (\{[^{}]*(\{[^{}]*\}[^{}]*)*\}|[0-9.]+)"), r"&#34;\1&#34;: <varies>"),
    (re.compile(r'<div class="usage">.*'), '<div class="usage"><varies>'),
]
#: Keys whose values are times, durations or ids in any run.
_VOLATILE_KEYS = {"create_time", "last_update_time", "request_time", "execution_duration", "execution_duration_ms",
                  "start_time_ns", "end_time_ns", "span_id", "parent_id", "trace_id", "assessment_id",
                  "mlflow.sourceRun", "mlflow.assessment.sourceRunId", "mlflow.artifactLocation",
                  "seconds", "duration_s", "wall_s", "elapsed_s", "timings_s", "latency_s",
                  # the judge's accounting: two metrics asking the same prompt at once race for the
                  # cache, so calls, hits and tokens move by one between runs of the same rows
                  "usage",
                  # the installed packages (numpy, torch, ...): the environment's, not the run's
                  "versions"}
#: The seal params and the artifact each is the sha256 of (mlflow_rag_eval.tracking.seal).
SEALED = {"rag_eval.seal.rows_sha256": "eval_results_table.json", "rag_eval.seal.slices_sha256": "rag_eval/slices.json",
          "rag_eval.seal.lineage_sha256": "rag_eval/judge_lineage.json"}
#: Tags MLflow sets from the process (user, source file, run name), not from the evaluation.
_PROCESS_TAGS = {"mlflow.user", "mlflow.source.name", "mlflow.source.type", "mlflow.runName",
                 "mlflow.source.git.commit", "mlflow.loggedArtifacts", "rag_eval.version"}


def _plain(value: Any) -> Any:
    """``value`` with every volatile key dropped and every volatile text replaced, recursively;
    a string holding JSON is read and normalised as JSON."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in sorted(value.items()) if k not in _VOLATILE_KEYS}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, str):
        stripped = value.strip()
        if stripped[:1] in "{[" and stripped[-1:] in "}]":
            try:
                return _plain(json.loads(stripped))
            except ValueError:
                pass
        for pattern, word in _VOLATILE:
            value = pattern.sub(word, value)
        return value
    if isinstance(value, float):
        return round(value, 12)
    return value


def _artifacts(client, run_id: str, path: str | None = None) -> list[str]:
    out = []
    for item in client.list_artifacts(run_id, path):
        out += _artifacts(client, run_id, item.path) if item.is_dir else [item.path]
    return out


def _artifact(run_id: str, path: str) -> Any:
    local = Path(mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=path))
    if local.suffix == ".json":
        return json.loads(local.read_text())
    if local.suffix in {".md", ".txt", ".html", ".csv", ".yaml", ".yml"}:
        return local.read_text()
    return {"bytes": local.stat().st_size}


def _trace(trace) -> dict[str, Any]:
    info = trace.info
    spans = sorted(({"name": s.name, "type": s.span_type, "inputs": s.inputs, "outputs": s.outputs,
                     "parent": "root" if s.parent_id is None else "child"} for s in trace.data.spans),
                   key=lambda s: (s["parent"] != "root", s["name"]))
    assessments = sorted((a.to_dictionary() for a in info.assessments),
                         key=lambda a: (a["assessment_name"], json.dumps(a.get("feedback") or a.get("expectation"),
                                                                          sort_keys=True, default=str)))
    return {"request_preview": info.request_preview, "response_preview": info.response_preview,
            "state": str(info.state), "metadata": info.trace_metadata, "tags": info.tags, "spans": spans,
            "assessments": assessments}


def run_contents(run_id: str) -> dict[str, Any]:
    """The run's params, metrics, evaluation tags, artifacts (JSON and text read, others sized)
    and traces (previews, spans, assessments), ordered by row and normalised (see the module)."""
    client = mlflow.MlflowClient()
    run = client.get_run(run_id)
    traces = mlflow.search_traces(run_id=run_id, return_type="list")
    traces.sort(key=lambda t: int(t.info.trace_metadata.get("rag_eval.row", -1)))
    paths = _artifacts(client, run_id)
    params = dict(run.data.params)
    for key, path in SEALED.items():  # a seal covers ids and times: whether it holds is what compares
        if params.get(key, "none") != "none":
            data = Path(mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=path)).read_bytes()
            params[key] = f"<sha256 of {path}: {'holds' if hashlib.sha256(data).hexdigest() == params[key] else 'BROKEN'}>"
    return _plain({
        "params": params,
        "metrics": run.data.metrics,
        "tags": {k: v for k, v in run.data.tags.items() if k not in _PROCESS_TAGS},
        "artifacts": {p: _artifact(run_id, p) for p in paths},
        "traces": [_trace(t) for t in traces],
    })


#: How far two floats may be apart and still be the same value (see :func:`differences`).
FLOAT_TOLERANCE = 2e-6


def differences(before: Any, after: Any, where: str = "run") -> list[str]:
    """Where two documents differ, one line each."""
    out: list[str] = []
    if isinstance(before, dict) and isinstance(after, dict):
        for key in sorted(set(before) | set(after)):
            if key not in after:
                out.append(f"{where}.{key}: gone")
            elif key not in before:
                out.append(f"{where}.{key}: new")
            else:
                out += differences(before[key], after[key], f"{where}.{key}")
    elif isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        for i, (b, a) in enumerate(zip(before, after)):
            out += differences(b, a, f"{where}[{i}]")
    elif isinstance(before, str) and isinstance(after, str) and "\n" in before + after and before != after:
        lines = list(zip(before.splitlines(), after.splitlines()))
        k = next((k for k, (b, a) in enumerate(lines) if b != a), len(lines))
        b, a = (before.splitlines() + [""])[k], (after.splitlines() + [""])[k]
        out.append(f"{where}, line {k + 1}: {b[:160]!r} -> {a[:160]!r}")
    elif isinstance(before, float) and isinstance(after, float):
        # another CPU's kernels may move an embedding in the 7th digit (a score rounded to 1e-6 by
        # one unit): within that, the same value
        if not abs(before - after) <= FLOAT_TOLERANCE:
            out.append(f"{where}: {before!r} -> {after!r}")
    elif before != after:
        out.append(f"{where}: {str(before)[:120]!r} -> {str(after)[:120]!r}")
    return out
