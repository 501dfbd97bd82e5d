"""An evaluation against the speed of its judge: eval wall and process wall of the public routes
beside the floor the judge alone sets, and where the rest goes.

    .venv/bin/python bench/route_speed.py [--rows 200 1000] [--latency 0.1] [--concurrency 16]
                                          [--route plugin scorers] [--profile DIR]

The workload (issue 46): rows of the Northwind example (5 retrieved contexts each), faithfulness,
answer relevancy, context precision and context recall, against a loopback OpenAI-compatible
judge (:class:`FakeJudgeServer`) that answers every call after ``--latency`` seconds, with the
judge's concurrency at ``--concurrency``. Each run is a fresh process (its own empty judge cache,
its own sqlite store) started by this script, which serves the judge from outside it: the
process wall is what a user's ``python train.py`` pays, start-up and shutdown included.

The floor is calls x latency / concurrency: what the judge alone costs at that concurrency.
The breakdown samples the process's main thread every 10 ms and names the phase it is in (the
deepest known frame on its stack); the judge's worker threads are sampled too and split into
waiting on the judge's HTTP reply and local work (prompt rendering, parsing, embeddings). With
``--profile DIR`` each child also writes a cProfile of its main thread (``DIR/<route>-<rows>.prof``,
open with ``snakeviz`` or ``python -m pstats``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
METRICS = ["faithfulness", "answer_relevancy", "context_precision", "context_recall"]

#: (file suffix, function or None) -> phase: the deepest frame of the main thread's stack that
#: matches names the phase (the evaluator's own call, the engine's scoring, trace logging, ...)
PHASES = [
    (("mlflow/models/evaluation/base.py", None), "mlflow.evaluate (dataset, run, evaluator lookup)"),
    (("mlflow_rag_eval/routes/evaluator.py", "evaluate"), "evaluator: config, frame, records"),
    (("mlflow_rag_eval/routes/scorers.py", None), "scorers: records"),
    (("mlflow_rag_eval/evaluation/suite.py", None), "suite and judge preparation"),
    (("mlflow_rag_eval/evaluation/engine.py", "evaluate_records"), "engine: estimate, summaries"),
    (("mlflow_rag_eval/evaluation/engine.py", "score"), "scoring (waiting on the judge's workers)"),
    (("mlflow_rag_eval/tracking/run_logging.py", None), "run logging: metrics, tables, artifacts"),
    (("mlflow_rag_eval/tracking/traces.py", None), "traces and assessments"),
    (("mlflow_rag_eval/routes/evaluator.py", "_artifacts"), "artifact listing"),
    (("mlflow/genai/evaluation/", None), "mlflow.genai.evaluate harness"),
]


def _phase(frame) -> str:
    names = []
    while frame is not None:
        names.append((frame.f_code.co_filename.replace(os.sep, "/"), frame.f_code.co_name))
        frame = frame.f_back
    found = "other"
    for filename, function in reversed(names):  # outermost first: the deepest match wins
        for (suffix, name), phase in PHASES:
            if suffix in filename and (name is None or name == function):
                found = phase
    return found


def _worker_state(frame) -> str | None:
    """What a judge worker thread is doing: waiting on the judge's reply, local work, or idle."""
    files = []
    while frame is not None:
        files.append((frame.f_code.co_filename.replace(os.sep, "/"), frame.f_code.co_name))
        frame = frame.f_back
    if not any("mlflow_rag_eval" in f for f, _ in files):
        return None  # an idle pool thread, or someone else's
    if any(f.endswith(("http/client.py", "socket.py", "ssl.py")) or "httpx" in f or "httpcore" in f
           for f, _ in files):
        return "waiting on the judge (HTTP)"
    if any("local_model" in f or "embedding" in f for f, _ in files):
        return "embeddings"
    return "local work (prompts, parsing, bookkeeping)"


class Sampler:
    """Samples every thread's stack every ``interval`` seconds from a daemon thread."""

    def __init__(self, interval: float | None = 0.01):
        import threading

        self.interval, self.main = interval, threading.main_thread().ident
        self.phases: Counter = Counter()
        self.workers: Counter = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="route-speed-sampler")

    def __enter__(self) -> Sampler:
        if self.interval is not None:  # None: no sampling
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        import threading

        own = threading.get_ident()
        while not self._stop.wait(self.interval):
            for ident, frame in sys._current_frames().items():
                if ident == own:
                    continue
                if ident == self.main:
                    self.phases[_phase(frame)] += 1
                else:
                    state = _worker_state(frame)
                    if state is not None:
                        self.workers[state] += 1


def child(args) -> None:
    """One evaluation in this process; prints one JSON line of its figures."""
    imported = time.perf_counter()
    import mlflow
    import pandas as pd

    sys.path.insert(0, str(ROOT / "bench"))
    from judge_calls import bench_rows

    import_s = time.perf_counter() - imported
    prepared = time.perf_counter()
    rows = bench_rows(args.rows)
    frame = pd.DataFrame({"question": [r.question for r in rows], "answer": [r.answer for r in rows],
                          "contexts": [[{"id": c.id, "text": c.text} for c in r.contexts] for r in rows],
                          "reference": [r.reference for r in rows]})
    rows_s = time.perf_counter() - prepared
    store_started = time.perf_counter()
    mlflow.set_tracking_uri(f"sqlite:///{args.home}/mlflow.db")
    experiment = mlflow.set_experiment("route-speed")  # a new sqlite store: MLflow creates and migrates it
    store_s = time.perf_counter() - store_started
    judge = f"openai:/bench-judge?base_url={args.base_url}&concurrency={args.concurrency}"
    profile = None
    if args.profile:
        import cProfile

        profile = cProfile.Profile()
    start = time.perf_counter()
    sampler = Sampler(interval=None if args.no_breakdown else 0.01)
    with sampler:
        if profile:
            profile.enable()
        if args.route == "plugin":
            with mlflow.start_run(experiment_id=experiment.experiment_id):
                mlflow.models.evaluate(data=frame, model_type="rag", evaluators="rag",
                                       evaluator_config={"metrics": METRICS, "judge": judge, "progress": False})
        else:
            from mlflow_rag_eval.routes.scorers import rag_scorers

            data = [{"inputs": {"question": r.question}, "outputs": {"answer": r.answer, "contexts": c},
                     "expectations": {"expected_response": r.reference}}
                    for r, c in zip(rows, frame["contexts"])]
            mlflow.genai.evaluate(data=data, scorers=rag_scorers(METRICS, judge=judge))
        if profile:
            profile.disable()
    wall = time.perf_counter() - start
    if profile:
        profile.dump_stats(str(Path(args.profile) / f"{args.route}-{args.rows}.prof"))
    samples = sum(sampler.phases.values()) or 1
    worker_samples = sum(sampler.workers.values()) or 1
    print(json.dumps({
        "import_s": import_s, "rows_s": rows_s, "store_s": store_s, "eval_wall_s": wall,
        "phases": {k: v / samples * wall for k, v in sampler.phases.most_common()},
        "workers": {k: v / worker_samples for k, v in sampler.workers.most_common()},
    }))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, nargs="+", default=[200, 1000])
    parser.add_argument("--latency", type=float, default=0.1)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--route", nargs="+", default=["plugin"], choices=["plugin", "scorers"])
    parser.add_argument("--profile", default=None, help="a folder for each child's cProfile")
    parser.add_argument("--no-breakdown", action="store_true",
                        help="no stack sampling (it holds the GIL: with many threads it slows the run it measures)")
    parser.add_argument("--genai-workers", default="4",
                        help="MLFLOW_GENAI_EVAL_MAX_WORKERS for the scorers route (default 4, as docs/how-to/"
                             "genai-scorers.md says for a sqlite store; 'unset' leaves MLflow's default, whose "
                             "threads stall on the store's connection pool: 200 no-op rows take minutes)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--home", help=argparse.SUPPRESS)
    parser.add_argument("--base-url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        args.rows = args.rows[0]
        args.route = args.route[0]
        child(args)
        return
    from mlflow_rag_eval.testing import FakeJudgeServer

    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true", "HF_HUB_OFFLINE": "1"}
    if args.genai_workers != "unset":
        env["MLFLOW_GENAI_EVAL_MAX_WORKERS"] = args.genai_workers
    print(f"{len(METRICS)} metrics ({', '.join(METRICS)}), 5 contexts per row, judge latency "
          f"{args.latency * 1000:.0f} ms, concurrency {args.concurrency}")
    with FakeJudgeServer(latency=args.latency) as server:
        for route in args.route:
            for n in args.rows:
                with tempfile.TemporaryDirectory() as home:
                    server.reset()
                    command = [sys.executable, __file__, "--child", "--rows", str(n), "--route", route,
                               "--concurrency", str(args.concurrency), "--home", home,
                               "--base-url", f"http://127.0.0.1:{server.port}/v1"]
                    if args.no_breakdown:
                        command.append("--no-breakdown")
                    if args.profile:
                        Path(args.profile).mkdir(parents=True, exist_ok=True)
                        command += ["--profile", args.profile]
                    started = time.perf_counter()
                    done = subprocess.run(command, env={**env, "MLFLOW_RAG_EVAL_CACHE_DIR": home},
                                          capture_output=True, text=True, cwd=home)
                    process = time.perf_counter() - started
                    if done.returncode:
                        sys.exit(f"{route} at {n} rows failed:\n{done.stderr[-4000:]}")
                    figures = json.loads(done.stdout.strip().splitlines()[-1])
                    calls = server.calls
                    floor = calls * args.latency / args.concurrency
                    wall = figures["eval_wall_s"]
                    print(f"\n{route}, {n} rows: {calls} judge calls ({calls / n:.1f}/row), floor {floor:.1f} s, "
                          f"eval wall {wall:.1f} s ({wall / floor:.2f}x the floor), process wall {process:.1f} s "
                          f"(imports {figures['import_s']:.1f} s, the bench's rows {figures['rows_s']:.1f} s, a new sqlite "
                          f"store {figures['store_s']:.1f} s)")
                    for phase, seconds in figures["phases"].items():
                        print(f"  {seconds:6.2f} s  {phase}")
                    print("  judge workers: " + ", ".join(f"{share:.0%} {state}"
                                                          for state, share in figures["workers"].items()))


if __name__ == "__main__":
    main()
