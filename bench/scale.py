"""Benchmark: does ``mlflow.evaluate(model_type="rag")`` cost linear time in the row count?

Why: teams evaluate sampled traffic and nightly sets of 100k rows and more. Through the main
route with graded relevance as ``{id: grade}`` dicts, retrieval metrics alone took 185 s for
5,000 rows (MLflow's schema inference of the data, before any evaluator runs, sorting the
union of every row's dict keys). The target: rows/s at 100k within 1.5x of rows/s at 1k.

Usage::

    python bench/scale.py                           # 1k, 10k, 100k retrieval; 1k, 10k local suite
    python bench/scale.py --sizes 1000 10000 --suite-sizes 1000
    python bench/scale.py --form dict --sizes 1000 3000     # the quadratic form, for comparison

Each size runs in a fresh subprocess (peak RSS is per size), into a fresh sqlite store, as a
user would: static predictions in a DataFrame (question, answer, 5 retrieved contexts with ids,
reference, graded ``relevant_ids``), ``mlflow.models.evaluate(data=..., model_type="rag",
evaluators="rag")`` inside a run. Retrieval runs use hit@5, mrr, ndcg@10 and no judge; suite
runs use the default suite with the embedded local judge. Runs log everything but the per-row
traces (``log_traces=False``: metrics, params, table, lineage, worst rows, report), so every
size does the same work per row; ``--traces-below N`` logs traces for sizes below N too (they
cost ~12 ms per row on sqlite here, the same at every size; ``bench/log_evaluation.py`` times
them).

Printed: per size, wall time, rows/s, peak RSS, and the ratio of rows/s to the smallest size's.
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


def _frame(n: int, form: str, seed: int = 0):
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(seed)
    words = np.array("fare ticket train delay refund station platform bike seat pass child season "
                     "route coast valley lakes airport peak off-peak compensation claim".split())
    rows = []
    for i in range(n):
        ids = [f"doc{int(j)}/{int(k)}" for j, k in zip(rng.integers(0, 50_000, 5), rng.integers(0, 8, 5))]
        texts = [" ".join(rng.choice(words, 25)) + "." for _ in ids]
        relevant = {ids[int(rng.integers(0, 5))]: 2, f"doc{int(rng.integers(0, 50_000))}/0": 1}
        if form == "dict":
            graded = relevant
        else:  # the schema-stable form docs/concepts/records.md recommends
            graded = [{"id": k, "grade": g} for k, g in relevant.items()]
        rows.append({
            "question": f"question {i}: " + " ".join(rng.choice(words, 8)) + "?",
            "answer": texts[0].split(".")[0] + ".",
            "contexts": [{"id": d, "text": t} for d, t in zip(ids, texts)],
            "reference": texts[0],
            "relevant_ids": graded,
        })
    return pd.DataFrame(rows)


def _child(n: int, kind: str, form: str, traces_below: int) -> None:
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("DO_NOT_TRACK", "true")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    import mlflow

    data = _frame(n, form)
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        mlflow.set_tracking_uri(f"sqlite:///{tmp}/mlflow.db")
        mlflow.set_experiment("scale")
        config = {"log_traces": n < traces_below}
        if kind == "retrieval":
            config["metrics"] = ["hit@5", "mrr", "ndcg@10"]
        else:
            config["judge"] = "local:minilm-l6"
            from mlflow_rag_eval.judges import get_judge

            get_judge("local:minilm-l6").embedder.encode(["warm up"])  # model load is not per row
        start = time.perf_counter()
        with mlflow.start_run():
            result = mlflow.models.evaluate(data=data, model_type="rag", evaluators="rag", evaluator_config=config)
        wall = time.perf_counter() - start
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"n": n, "kind": kind, "form": form, "wall_s": wall, "rss_mb": rss_mb,
                      "traces": config["log_traces"], "metrics": len(result.metrics)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10_000, 100_000])
    parser.add_argument("--suite-sizes", type=int, nargs="*", default=[1000, 10_000])
    parser.add_argument("--form", choices=["id-grade", "dict"], default="id-grade",
                        help="relevant_ids as [{id, grade}] lists (recommended) or {id: grade} dicts")
    parser.add_argument("--traces-below", type=int, default=0)
    parser.add_argument("--child", nargs=2, metavar=("N", "KIND"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(int(args.child[0]), args.child[1], args.form, args.traces_below)
        return

    traces = f"traces logged below {args.traces_below:,} rows" if args.traces_below else "no per-row traces"
    print(f"mlflow.evaluate(model_type='rag'), static predictions, relevant_ids as {args.form}; {traces}")
    print(f"{'kind':<10}{'rows':>9}{'wall s':>10}{'rows/s':>10}{'peak RSS MB':>13}{'traces':>8}{'rows/s vs smallest':>20}")
    for kind, sizes in (("retrieval", args.sizes), ("suite", args.suite_sizes)):
        base = None
        for n in sizes:
            out = subprocess.run([sys.executable, __file__, "--child", str(n), kind, "--form", args.form,
                                  "--traces-below", str(args.traces_below)],
                                 capture_output=True, text=True, check=True)
            figures = json.loads(out.stdout.strip().splitlines()[-1])
            rate = n / figures["wall_s"]
            base = base or rate
            print(f"{kind:<10}{n:>9,}{figures['wall_s']:>10.1f}{rate:>10.0f}{figures['rss_mb']:>13.0f}"
                  f"{'yes' if figures['traces'] else 'no':>8}{rate / base:>20.2f}", flush=True)


if __name__ == "__main__":
    main()
