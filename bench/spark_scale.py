"""Benchmark: rows/s of ``evaluate_spark`` on local[1] and local[2], beside the single-process engine.

Why: teams evaluate 100k to 10M rows; ``mlflow.evaluate`` keeps 10k rows of a Spark DataFrame and
the engine runs in one process. The Spark route must scale with cores and keep the driver's
memory flat (only score columns come back to it).

Usage::

    python bench/spark_scale.py                                  # retrieval at 100k and 1M, suite at 100k
    python bench/spark_scale.py --rows 100000 --suite-rows 2000  # a quick check

Each measurement runs in a fresh subprocess (peak RSS is per measurement) on the same rows,
written once as Parquet (100k-row files, ``bench/scale.py``'s rows: question, answer, 5
contexts with ids, reference, graded ``relevant_ids``):

- ``engine``: ``records_from_frame`` + ``evaluate_records`` in one process (the Parquet read
  with pandas is not timed), no logging;
- ``local[k]``: ``evaluate_spark`` on the Parquet folder into a sqlite store, the whole call
  timed (read, validation, scoring, the figures, the run's logging; not the SparkSession's
  start), with ``max_table_rows=0`` (no per-row table or traces, as at these sizes).

Retrieval runs use hit@5, mrr and ndcg@10 (no judge); suite runs the default suite with the
embedded local judge (each Spark worker loads the model once, inside the timed call).

Printed: per measurement, wall time, rows/s, peak RSS of the driver's Python process and of
the Spark JVM, and local[2]'s rows/s over local[1]'s. Retrieval runs at each ``--rows`` size,
so the driver's peak RSS at 100k and at 1M shows whether it holds the rows (it must not: it
holds 8 bytes per row and metric of scores, and a flag).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)

CHUNK = 100_000
RETRIEVAL = ["hit@5", "mrr", "ndcg@10"]


def _write_rows(n: int, folder: str) -> None:
    """``n`` rows as Parquet files of at most CHUNK rows (memory stays bounded at any size)."""
    from scale import _frame

    os.makedirs(folder)
    for k, start in enumerate(range(0, n, CHUNK)):
        _frame(min(CHUNK, n - start), "id-grade", seed=k).to_parquet(
            os.path.join(folder, f"part-{k:05d}.parquet"), index=False)


def _peak_kb(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return None


def _child(route: str, kind: str, folder: str) -> None:
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("DO_NOT_TRACK", "true")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    metrics = RETRIEVAL if kind == "retrieval" else None
    judge = "local:minilm-l6"
    jvm_mb = None
    if route == "engine":
        import pandas as pd

        from mlflow_rag_eval.evaluation.engine import evaluate_records
        from mlflow_rag_eval.judges import get_judge
        from mlflow_rag_eval.records import records_from_frame

        frame = pd.read_parquet(folder)
        if kind == "suite":
            get_judge(judge).embedder.encode(["warm up"])  # the model's load is not per row
        start = time.perf_counter()
        evaluate_records(records_from_frame(frame), metrics, judge, progress=False)
        wall = time.perf_counter() - start
    else:
        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
        import mlflow
        from pyspark.sql import SparkSession

        from mlflow_rag_eval.spark import evaluate_spark

        spark = (SparkSession.builder.master(route).config("spark.ui.enabled", "false")
                 .config("spark.ui.showConsoleProgress", "false")
                 .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
                 .config("spark.sql.shuffle.partitions", "8").config("spark.driver.memory", "4g").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        with tempfile.TemporaryDirectory() as tmp:
            mlflow.set_tracking_uri(f"sqlite:///{tmp}/mlflow.db")
            mlflow.set_experiment("spark-scale")
            start = time.perf_counter()
            with mlflow.start_run():
                evaluate_spark(folder, metrics, judge, output=os.path.join(tmp, "scored"), max_table_rows=0)
            wall = time.perf_counter() - start
        jvm_kb = _peak_kb(spark.sparkContext._gateway.proc.pid)
        jvm_mb = jvm_kb / 1024 if jvm_kb else None
        spark.stop()
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"wall_s": wall, "rss_mb": rss_mb, "jvm_mb": jvm_mb}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[100_000, 1_000_000],
                        help="rows of the retrieval runs (one run per size)")
    parser.add_argument("--suite-rows", type=int, default=100_000, help="rows of the local-judge suite run")
    parser.add_argument("--routes", nargs="+", default=["engine", "local[1]", "local[2]"])
    parser.add_argument("--child", nargs=3, metavar=("ROUTE", "KIND", "FOLDER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(*args.child)
        return

    print("evaluate_spark vs evaluate_records on the same rows (bench/scale.py's rows, Parquet)")
    print(f"{'kind':<10}{'rows':>11}{'route':>10}{'wall s':>9}{'rows/s':>9}{'driver RSS MB':>15}{'JVM RSS MB':>12}"
          f"{'vs local[1]':>13}")
    with tempfile.TemporaryDirectory() as data:
        for kind, n in [*(("retrieval", n) for n in args.rows), ("suite", args.suite_rows)]:
            if n <= 0:
                continue
            folder = os.path.join(data, f"{kind}-{n}")
            _write_rows(n, folder)
            rates: dict[str, float] = {}
            for route in args.routes:
                out = subprocess.run([sys.executable, __file__, "--child", route, kind, folder],
                                     capture_output=True, text=True)
                if out.returncode != 0:
                    print(f"{kind:<10}{n:>11,}{route:>10}  failed:\n{out.stderr[-3000:]}", flush=True)
                    continue
                figures = json.loads(out.stdout.strip().splitlines()[-1])
                rates[route] = n / figures["wall_s"]
                jvm = f"{figures['jvm_mb']:.0f}" if figures["jvm_mb"] else "-"
                ratio = f"{rates[route] / rates['local[1]']:.2f}" if route != "engine" and "local[1]" in rates else "-"
                print(f"{kind:<10}{n:>11,}{route:>10}{figures['wall_s']:>9.1f}{rates[route]:>9.0f}"
                      f"{figures['rss_mb']:>15.0f}{jvm:>12}{ratio:>13}", flush=True)


if __name__ == "__main__":
    main()
