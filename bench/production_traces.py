"""Production traces scored in place: N traces of a traced BM25 pipeline logged to a sqlite
store, then read page by page and scored with the local judge (``evaluate_traces``).

Prints the traces/s of logging, of reading alone (a rerun: the route's page loop, ``search_traces``
with spans, each trace turned into a record and found scored already) and of the whole scoring run (read + judge + a Feedback
per metric on each trace + the evaluation run), and the process's RSS at a few points: the
spans of one page at a time are in memory, so RSS grows with the records kept for the run's
table (a few hundred bytes of text per trace), not with the traces.

    python bench/production_traces.py --n 10000 [--metrics faithfulness,context_relevance]

``--cron`` (with ``--quick`` for 300 traces) is the job left to cron instead: N traces, then
rounds of two concurrent ``evaluate_traces(since_last=True)`` processes on the same store
(one waits for the other's lease), a retention job deleting the oldest traces every second
while they page, and a priced fake judge on loopback whose replies carry long reasons (each
reply dearer than its estimate, within the judge's ``max_tokens``) under ``--max-cost`` per run
(held call by call), until a round scores nothing. It prints each run's calls, cache hits,
tokens, estimated and actual spend and stop reason, and checks that every surviving trace has
exactly one valid Feedback per metric and that no run spent more than its cap.

    python bench/production_traces.py --cron --quick
    python bench/production_traces.py --cron --n 10000

Logging 10,000 traces to sqlite takes half an hour on 2 cores: ``--store DIR`` keeps the store in
DIR (a new temp folder otherwise), a store already holding the N traces, unscored, is used as it
is, and one whose logging was stopped part-way is logged on from there; ``--log-only`` logs them
and stops. So the traces can be logged once (in several sittings) and the cron scenario run on
them later:

    python bench/production_traces.py --cron --n 10000 --store /tmp/traces10k --log-only
    python bench/production_traces.py --cron --n 10000 --store /tmp/traces10k
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


def log_traces(n: int, first: int = 0) -> float:
    """Seconds to log requests ``first`` .. ``n - 1`` of the traced app."""
    import mlflow
    from pipeline import load_golden, traced_app

    answer = traced_app()
    questions = list(load_golden()["question"])

    start = time.perf_counter()
    for i in range(first, n):
        answer(f"{questions[i % len(questions)]} (request {i})")
    mlflow.flush_trace_async_logging()
    return time.perf_counter() - start


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000, help="traces to log and score")
    parser.add_argument("--metrics", default="faithfulness,context_relevance")
    parser.add_argument("--page-size", type=int, default=100)
    parser.add_argument("--cron", action="store_true", help="the cron scenario (see the docstring)")
    parser.add_argument("--quick", action="store_true", help="300 traces (a bounded run)")
    parser.add_argument("--max-cost", type=float, default=None,
                        help="--cron: USD cap of each run (default $0.0005 a trace: above the estimate of the whole "
                             "backlog, so no run is refused, below what the long replies cost)")
    parser.add_argument("--store", default=None, help="--cron: the folder of the sqlite store (kept; reused when it "
                                                      "holds the N traces or fewer, unscored)")
    parser.add_argument("--log-only", action="store_true", help="--cron: log the N traces into --store and stop")
    parser.add_argument("--profile", default=None, help="write the scoring run's cProfile to this file")
    args = parser.parse_args(argv)
    if args.quick:
        args.n = 300
    if args.cron:
        cron(args)
        return

    import mlflow
    from mlflow import MlflowClient

    from mlflow_rag_eval.judges import get_judge
    from mlflow_rag_eval.routes import production_traces as route

    home = Path(tempfile.mkdtemp(prefix="rag_eval_traces_bench_"))
    os.chdir(home)
    if args.store:  # a copy of a store of N unscored traces (``--cron --log-only``), its artifacts here
        _copy_store(Path(args.store), home, args.n)
    mlflow.set_tracking_uri(f"sqlite:///{home / 'mlflow.db'}")
    mlflow.set_experiment("production")
    print(f"store {home / 'mlflow.db'}; RSS at start {rss_mib():.0f} MiB")
    if args.store:
        print(f"the {args.n} traces copied from {args.store}: logging skipped")
    else:
        seconds = log_traces(args.n)
        print(f"logged {args.n} traces in {seconds:.1f} s ({args.n / seconds:.0f} traces/s); RSS {rss_mib():.0f} MiB")

    client = MlflowClient()
    judge = get_judge("local:minilm-l6")
    metrics = args.metrics.split(",")
    peaks = []
    start = time.perf_counter()
    profile = None
    if args.profile:
        import cProfile

        profile = cProfile.Profile()
        profile.enable()
    with RssSampler() as rss:
        out = route.evaluate_traces("production", metrics=metrics, judge=judge, page_size=args.page_size,
                                    progress=False, client=client)
    seconds = time.perf_counter() - start
    if profile is not None:
        profile.disable()
        profile.dump_stats(args.profile)
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


def _copy_store(source: Path, home: Path, n: int) -> None:
    """Copy ``source``'s sqlite store of ``n`` unscored traces into ``home``, the experiment's
    artifacts moved to ``home`` (the source stays as it was, for the next measurement)."""
    import shutil
    import sqlite3

    shutil.copyfile(source / "mlflow.db", home / "mlflow.db")
    with sqlite3.connect(home / "mlflow.db") as db:
        traces = db.execute("SELECT COUNT(*) FROM trace_info").fetchone()[0]
        runs = db.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
        if traces != n or runs:
            raise SystemExit(f"{source} holds {traces} traces and {runs} runs: give a store of {n} unscored traces "
                             f"(python bench/production_traces.py --cron --n {n} --store DIR --log-only)")
        db.execute("UPDATE experiments SET artifact_location = ? || '/' || experiment_id",
                   (str(home / "mlruns"),))


LONG_REASON = "The passage states it in so many words, and nothing in the other passages contradicts it. " * 12
#: the judge's max_tokens: the long replies fit in it, as a provider's replies do (it bills no more)
MAX_TOKENS = 4096


def _long_judge(model: str):
    """A FakeJudgeServer whose replies carry long reasons and report their tokens (priced); it
    keeps the longest reply's tokens and counts the replies longer than the request's max_tokens."""
    import json

    from mlflow_rag_eval.testing import FakeJudgeServer

    class LongReplies(FakeJudgeServer):
        longest = past_max_tokens = 0

        def _completion(self, body):
            out = super()._completion(body)
            reply = json.loads(out["choices"][0]["message"]["content"])
            for item in reply.get("claims", []) + reply.get("verdicts", []):
                if isinstance(item, dict) and "reason" in item:
                    item["reason"] = LONG_REASON
            text = json.dumps(reply)
            out["choices"][0]["message"]["content"] = text
            out["usage"]["completion_tokens"] = tokens = len(text) // 4
            with self.lock:
                self.longest = max(self.longest, tokens)
                self.past_max_tokens += tokens > body.get("max_tokens", MAX_TOKENS)
            return out

    return LongReplies(model=model)


def _cron_run(uri: str, judge_url: str, metrics: list[str], max_cost: float, page_size: int, queue) -> None:
    """One cron run in its own process: what it scored, spent and why it stopped."""
    import mlflow

    from mlflow_rag_eval.judges import get_judge
    from mlflow_rag_eval.routes import production_traces as route

    mlflow.set_tracking_uri(uri)
    judge = get_judge(f"openai:/gpt-4o-mini?base_url={judge_url}", cache=False, max_tokens=MAX_TOKENS)
    start = time.perf_counter()
    try:
        out = route.evaluate_traces("production", metrics=metrics, judge=judge, since_last=True, max_cost=max_cost,
                                    page_size=page_size, progress=False, lease_wait=3600, lag=0)
    except Exception as exc:  # noqa: BLE001 - reported by the parent
        queue.put({"error": f"{type(exc).__name__}: {exc}"})
        return
    queue.put({"scored": len(out.scored), "read": out.read, "seconds": time.perf_counter() - start,
               "spent": out.budget.spent, "calls": out.spending.get("calls", 0), "stopped": out.budget.stopped,
               "refused": out.budget.ledger.calls_refused, "estimated": out.estimate.cost_usd or 0.0,
               "cache_hits": out.spending.get("cache_hits", 0),
               "tokens": out.spending.get("tokens_in", 0) + out.spending.get("tokens_out", 0),
               "gone": out.skipped.get("deleted before its Feedback was written", 0)})


def _retention(uri: str, experiment_id: str, stop, per_second: int, at_most: int, deleted: list) -> None:
    """Delete the ``per_second`` oldest traces every second until ``stop`` is set (``at_most`` in all)."""
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    while not stop.wait(1.0) and len(deleted) < at_most:
        oldest = client.search_traces(locations=[experiment_id], order_by=["timestamp_ms ASC"],
                                      max_results=per_second, include_spans=False)
        ids = [t.info.trace_id for t in oldest]
        if ids:
            client.delete_traces(experiment_id, trace_ids=ids)
            deleted += ids


def _check_exactly_once(uri: str, experiment_id: str, metrics_keys: list[str]) -> tuple[int, int, int]:
    """(surviving traces, those with exactly one valid Feedback per metric, those with more); a
    valid Feedback that is an error (a call the cap refused, never scored again) is not one."""
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    survivors = once = twice = 0
    token = None
    while True:
        page = client.search_traces(locations=[experiment_id], max_results=500, page_token=token, include_spans=False)
        for t in page:
            survivors += 1
            counts = {k: 0 for k in metrics_keys}
            for a in t.info.assessments:
                if a.feedback is not None and a.valid is not False and a.name in counts \
                        and "rag_eval.metric" in (a.metadata or {}) and a.feedback.error is None:
                    counts[a.name] += 1
            once += all(v == 1 for v in counts.values())
            twice += any(v > 1 for v in counts.values())
        token = page.token
        if not token:
            return survivors, once, twice


def _stored_traces(uri: str, experiment_id: str) -> int:
    from mlflow import MlflowClient

    client, n, token = MlflowClient(uri), 0, None
    while True:
        page = client.search_traces(locations=[experiment_id], max_results=500, page_token=token, include_spans=False)
        n += len(page)
        token = page.token
        if not token:
            return n


def cron(args) -> None:
    import multiprocessing as mp
    import threading

    import mlflow
    from mlflow import MlflowClient

    from mlflow_rag_eval.keys import metric_key

    os.environ["OPENAI_API_KEY"] = os.environ.get("OPENAI_API_KEY") or "sk-bench"
    home = Path(args.store) if args.store else Path(tempfile.mkdtemp(prefix="rag_eval_cron_bench_"))
    home.mkdir(parents=True, exist_ok=True)
    os.chdir(home)
    uri = f"sqlite:///{home / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    experiment_id = mlflow.set_experiment("production").experiment_id
    logged = _stored_traces(uri, experiment_id)
    if logged > args.n or MlflowClient(uri).search_runs([experiment_id]):
        raise SystemExit(f"the store in {home} holds {logged} traces or runs already: give an empty --store")
    if logged < args.n:  # a store whose logging was stopped goes on where it stopped
        seconds = log_traces(args.n, first=logged)
        print(f"logged {args.n - logged} traces in {seconds:.1f} s ({(args.n - logged) / seconds:.1f} traces/s) "
              f"into {home}" + (f" (after the {logged} logged before)" if logged else ""))
    else:
        print(f"the store in {home} holds the {args.n} traces, unscored: logging skipped")
    if args.log_only:
        return
    args.max_cost = args.n * 0.0005 if args.max_cost is None else args.max_cost
    per_second = max(1, args.n // 100)
    print(f"{args.n} traces; two concurrent cron runs per round, cap ${args.max_cost:g} "
          f"each, a retention job deleting the {per_second} oldest traces a second ({args.n // 5} at most)")
    metrics = args.metrics.split(",")
    ctx = mp.get_context("spawn")
    stop, deleted = threading.Event(), []
    cleaner = threading.Thread(target=_retention, args=(uri, experiment_id, stop, per_second, args.n // 5, deleted),
                               daemon=True)
    over_cap, start = [], time.perf_counter()
    with _long_judge("gpt-4o-mini") as judge_server:
        cleaner.start()
        for round_ in range(1, 30):
            queue = ctx.Queue()
            procs = [ctx.Process(target=_cron_run, args=(uri, judge_server.base_url, metrics, args.max_cost,
                                                         args.page_size, queue)) for _ in range(2)]
            for p in procs:
                p.start()
            results = [queue.get() for _ in procs]
            for p in procs:
                p.join()
            for r in results:
                if "error" in r:
                    print(f"  round {round_}: a run failed: {r['error']}")
                    continue
                print(f"  round {round_}: {r['scored']:>5} scored of {r['read']:>5} read in {r['seconds']:5.1f} s, "
                      f"{r['calls']} judge calls ({r['cache_hits']} cache hits, {r['tokens']} tokens), estimated "
                      f"${r['estimated']:.4f}, spent ${r['spent']:.4f}, {r['gone']} deleted before the write"
                      + (f"; stopped: {r['stopped']} ({r['refused']} calls refused)" if r["stopped"] else ""),
                      flush=True)
                if r["spent"] > args.max_cost:
                    over_cap.append(r["spent"])
            if all("error" not in r and r["scored"] == 0 for r in results):
                break
        stop.set()
        cleaner.join()
        calls, longest, past = judge_server.calls, judge_server.longest, judge_server.past_max_tokens
    elapsed = time.perf_counter() - start
    keys = [metric_key(m) for m in metrics]
    survivors, once, twice = _check_exactly_once(uri, experiment_id, keys)
    print(f"{round_} rounds in {elapsed:.0f} s, {calls} judge calls in all; {len(deleted)} traces deleted by the "
          f"retention job; {survivors} survive: {once} with exactly one Feedback per metric, {twice} with more; "
          f"runs over their cap: {len(over_cap)}; the longest reply {longest} tokens (max_tokens {MAX_TOKENS}, "
          f"{past} replies past it)")
    if twice or once != survivors or over_cap:
        raise SystemExit("FAILED: a surviving trace is not scored exactly once, or a run spent over its cap")


if __name__ == "__main__":
    main()
