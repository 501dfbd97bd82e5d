"""Start-up cost: what ``import mlflow_rag_eval`` and ``mlflow-rag-eval --help`` take, and load.

Each measurement runs in a fresh interpreter (a warm import in this process would say nothing),
a few times, and reports the median: the whole process's wall time (what a user waits for)
and, for the import, the time of the import statement alone. ``--embedding`` also times, in
fresh processes, ``import mlflow_rag_eval`` and the first embedding of the default local judge
(model loaded, numpy encoder: target <= 1.5 s), and lists the heavy modules it loaded (torch,
transformers and sentence-transformers must not be among them).

    .venv/bin/python bench/startup.py [--runs 5] [--embedding]
    .venv/bin/python bench/startup.py --evaluate [--against LABEL=PYTHON[:SOURCE] ...]

``--evaluate`` times the whole ``mlflow-rag-eval evaluate --data`` process on 30 rows (the
default suite, a fresh sqlite store each time) with this interpreter and with each
``--against`` one (``SOURCE``: a checkout put first on its ``PYTHONPATH``, e.g. the code before
a change), interleaved run by run, and prints each median beside the first's (target for the
base install: <= 0.6x the development venv before the numpy encoder).

The heavy modules listed must stay out of the import and of ``--help``: a process that only
asks for help, or builds a judge from its name, must not pay seconds for torch or MLflow.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

#: modules that cost seconds to import; none belongs to start-up
HEAVY = ("torch", "sentence_transformers", "transformers", "mlflow", "ragas", "deepeval", "sklearn", "pandas")

_IMPORT = f"""
import json, sys, time
t = time.perf_counter()
import mlflow_rag_eval
dt = time.perf_counter() - t
print(json.dumps({{"seconds": dt, "heavy": [m for m in {HEAVY!r} if m in sys.modules]}}))
"""

_HELP = f"""
import contextlib, io, json, sys, time
sys.argv = ["mlflow-rag-eval", "--help"]
t = time.perf_counter()
from mlflow_rag_eval.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    try:
        main()
    except SystemExit:
        pass
dt = time.perf_counter() - t
print(json.dumps({{"seconds": dt, "heavy": [m for m in {HEAVY!r} if m in sys.modules]}}))
"""

_EMBED = f"""
import json, sys, time
t = time.perf_counter()
import mlflow_rag_eval
imported = time.perf_counter() - t
from mlflow_rag_eval.judges import get_judge
judge = get_judge()
judge.info()
built = time.perf_counter() - t
heavy_built = [m for m in {HEAVY!r} if m in sys.modules]
judge.similarity([("train fare", "ticket price")])
print(json.dumps({{"import_seconds": imported, "build_seconds": built - imported, "heavy_after_build": heavy_built,
                  "first_embedding_seconds": time.perf_counter() - t - built,
                  "heavy": [m for m in {HEAVY!r} if m in sys.modules]}}))
"""


def _script() -> list[str]:
    """The installed console script, or the module run by this interpreter."""
    exe = Path(sys.executable).with_name("mlflow-rag-eval")
    return [str(exe)] if exe.exists() else [sys.executable, "-c", "from mlflow_rag_eval.cli import main; main()"]


def _run(argv: list[str]) -> tuple[float, str]:
    t = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"{argv[:2]} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return wall, proc.stdout


def _median_of(runs: int, argv: list[str]) -> tuple[float, list[dict]]:
    walls, reports = [], []
    for _ in range(runs):
        wall, out = _run(argv)
        walls.append(wall)
        if out.strip().startswith("{"):
            reports.append(json.loads(out.strip().splitlines()[-1]))
    return statistics.median(walls), reports


def _evaluate_rows(path: Path, n: int = 30) -> None:
    """``n`` rows of bench/local_judge.py's frame (Northwind questions with answers) as JSON lines."""
    sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parents[1] / "examples" / "rag_pipeline")]
    from local_judge import bench_frame

    bench_frame(n).to_json(path, orient="records", lines=True)


def _time_evaluate(runs: int, against: list[str]) -> None:
    import os
    import tempfile

    envs = [("this venv", sys.executable, None)]
    for spec in against:
        label, _, target = spec.partition("=")
        python, _, source = target.partition(":")
        envs.append((label, python, source or None))
    walls: dict[str, list[float]] = {label: [] for label, _, _ in envs}
    with tempfile.TemporaryDirectory() as tmp:
        rows = Path(tmp) / "rows.jsonl"
        _evaluate_rows(rows)
        for i in range(runs):
            for label, python, source in envs:
                store = Path(tmp) / f"store-{i}-{len(walls[label])}-{abs(hash(label))}"
                store.mkdir()
                env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{store}/mlflow.db"}
                if source:
                    env["PYTHONPATH"] = source
                t = time.perf_counter()
                proc = subprocess.run([python, "-c", "from mlflow_rag_eval.cli import main; main()", "evaluate",
                                       "--data", str(rows), "--no-progress"], capture_output=True, text=True,
                                      cwd=store, env=env, timeout=900)
                walls[label].append(time.perf_counter() - t)
                if proc.returncode != 0:
                    raise SystemExit(f"{label}: evaluate failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    first = statistics.median(walls["this venv"])
    print(f"mlflow-rag-eval evaluate --data (30 rows, default suite), median of {runs}:")
    for label, python, source in envs:
        median = statistics.median(walls[label])
        where = python + (f" with PYTHONPATH={source}" if source else "")
        print(f"  {label:<30} {median:6.2f} s   this venv: {first / median:4.2f}x its time   ({where})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--embedding", action="store_true", help="also time the first embedding")
    parser.add_argument("--evaluate", action="store_true", help="time a 30-row `evaluate --data` process instead")
    parser.add_argument("--against", action="append", default=[], metavar="LABEL=PYTHON[:SOURCE]",
                        help="with --evaluate: another interpreter (and checkout) to time the same command with")
    args = parser.parse_args()
    if args.evaluate:
        _time_evaluate(args.runs, args.against)
        return

    bare, _ = _median_of(args.runs, [sys.executable, "-c", "pass"])
    print(f"python -c pass                 {bare:6.3f} s (process, median of {args.runs})")

    wall, reports = _median_of(args.runs, [sys.executable, "-c", _IMPORT])
    inner = statistics.median(r["seconds"] for r in reports)
    print(f"import mlflow_rag_eval         {wall:6.3f} s (process)  {inner:6.3f} s (import statement)")
    print(f"  heavy modules imported: {reports[-1]['heavy'] or 'none'}")

    wall, _ = _median_of(args.runs, _script() + ["--help"])
    _, reports = _median_of(1, [sys.executable, "-c", _HELP])
    print(f"mlflow-rag-eval --help         {wall:6.3f} s (process)")
    print(f"  heavy modules imported: {reports[-1]['heavy'] or 'none'}")

    if args.embedding:
        wall, reports = _median_of(args.runs, [sys.executable, "-c", _EMBED])
        heavy = reports[-1]["heavy"]

        def med(key: str) -> float:
            return statistics.median(r[key] for r in reports)

        print(f"import mlflow_rag_eval         {med('import_seconds'):6.3f} s (in the embedding process)")
        print(f"get_judge() + info()           {med('build_seconds'):6.3f} s  heavy: "
              f"{reports[-1]['heavy_after_build'] or 'none'}")
        first = med("first_embedding_seconds")
        print(f"first embedding                {first:6.3f} s  ({'within' if first <= 1.5 else 'over'} the 1.5 s target)")
        print(f"  whole process                {wall:6.3f} s  heavy: {heavy or 'none'}")
        torch_like = [m for m in heavy if m in ("torch", "transformers", "sentence_transformers")]
        if torch_like:
            print(f"  the local judge loaded {torch_like}: it must run without them")


if __name__ == "__main__":
    main()
