"""Production traces scored in place: N traces of a traced BM25 pipeline logged to a sqlite
store, then read page by page and scored with the local judge (``evaluate_traces``).

Prints the traces/s of logging, of reading alone (a rerun: the route's page loop, ``search_traces``
with spans, each trace turned into a record and found scored already) and of the whole scoring run (read + judge + a Feedback
per metric on each trace + the evaluation run), and the process's RSS at a few points: the
spans of one page at a time are in memory, so RSS grows with the records kept for the run's
table (a few hundred bytes of text per trace), not with the traces.

    python bench/production_traces.py --n 10000 [--metrics faithfulness,context_relevance]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "rag_pipeline"))
for key, value in {"MLFLOW_DISABLE_TELEMETRY": "true", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                   "TOKENIZERS_PARALLELISM": "false", "MLFLOW_ENABLE_ASYNC_TRACE_LOGGING": "false"}.items():
    os.environ.setdefault(key, value)


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class RssSampler:
    """RSS every ``every`` seconds on a thread of this script, while a call runs: memory flat or not."""

    def __init__(self, every: float = 2.0):
        import threading

        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._start = time.perf_counter()
        self._thread = threading.Thread(target=self._run, args=(every,), daemon=True)

    def _run(self, every: float) -> None:
        while not self._stop.wait(every):
            self.samples.append((time.perf_counter() - self._start, rss_mib()))

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def summary(self, points: int = 10) -> str:
        if not self.samples:
            return "no sample"
        step = max(1, len(self.samples) // points)
        return ", ".join(f"{t:.0f}s {r:.0f}" for t, r in self.samples[::step]) + " (MiB)"


def log_traces(n: int) -> float:
    import mlflow
    from pipeline import load_golden, traced_app

    answer = traced_app()
    questions = list(load_golden()["question"])

    start = time.perf_counter()
    for i in range(n):
        answer(f"{questions[i % len(questions)]} (request {i})")
    mlflow.flush_trace_async_logging()
    return time.perf_counter() - start


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000, help="traces to log and score")
    parser.add_argument("--metrics", default="faithfulness,context_relevance")
    parser.add_argument("--page-size", type=int, default=100)
    args = parser.parse_args(argv)

    import mlflow
    from mlflow import MlflowClient

    from mlflow_rag_eval.judges import get_judge
    from mlflow_rag_eval.routes import production_traces as route

    home = Path(tempfile.mkdtemp(prefix="rag_eval_traces_bench_"))
    os.chdir(home)
    mlflow.set_tracking_uri(f"sqlite:///{home / 'mlflow.db'}")
    mlflow.set_experiment("production")
    print(f"store {home / 'mlflow.db'}; RSS at start {rss_mib():.0f} MiB")
    seconds = log_traces(args.n)
    print(f"logged {args.n} traces in {seconds:.1f} s ({args.n / seconds:.0f} traces/s); RSS {rss_mib():.0f} MiB")

    client = MlflowClient()
    judge = get_judge("local:minilm-l6")
    metrics = args.metrics.split(",")
    peaks = []
    start = time.perf_counter()
    with RssSampler() as rss:
        out = route.evaluate_traces("production", metrics=metrics, judge=judge, page_size=args.page_size,
                                    progress=False, client=client)
    seconds = time.perf_counter() - start
    print(f"RSS while scoring: {rss.summary()}")
    peaks.append(rss_mib())
    print(f"scored {len(out.scored)} traces in place ({len(metrics)} metrics, a Feedback each) in {seconds:.1f} s "
          f"({len(out.scored) / seconds:.1f} traces/s, read + judge + write + run); RSS {peaks[-1]:.0f} MiB")
    start = time.perf_counter()
    again = route.evaluate_traces("production", metrics=metrics, judge=judge, page_size=args.page_size,
                                  progress=False, client=client)
    seconds = time.perf_counter() - start
    print(f"rerun (reads every trace, page by page, scores none): {len(again.scored)} scored, {again.read} read in {seconds:.1f} s ({again.read / seconds:.0f} "
          f"traces/s); RSS {rss_mib():.0f} MiB")
    import resource

    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
