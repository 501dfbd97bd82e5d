"""Benchmark ``log_evaluation``: the time to put a 10,000-row evaluation on an MLflow run,
rows as traces with their assessments, beside ``mlflow.genai.evaluate`` logging the same rows.

Why: an evaluation must be cheap to log next to scoring it, whatever the row count, and every
row must land where MLflow 3 users look (a trace with Feedback and Expectation assessments).
MLflow's own way of logging evaluated rows is ``mlflow.genai.evaluate``; the target is
ours <= 0.5x its time on the same rows.

Usage::

    python bench/log_evaluation.py                  # 10,000 rows, a local sqlite store
    python bench/log_evaluation.py --server         # through a loopback `mlflow server` instead
    python bench/log_evaluation.py --rows 2000 --repeats 1

What is timed, on fresh runs of one sqlite store (or server), in one process:

* ``log_evaluation`` (traces): the package's function on an already-computed
  :class:`EvaluationResult`: one trace per row (root span, RETRIEVER span with the 10
  contexts, ten Feedback and two Expectation assessments), metrics, params, table, lineage,
  worst rows and report;
* ``log_evaluation`` (no traces): the same with ``log_traces=False``, the run contents alone;
* ``mlflow.genai.evaluate``: the same rows as static data (``inputs`` = the question,
  ``outputs`` = answer and contexts, ``expectations`` = reference and relevant ids) with one
  trivial code scorer. It computes nothing worth timing, so its time is MLflow logging the
  rows: a trace per row, the scorer's Feedback, the expectations, run links, aggregates. It
  runs with ``MLFLOW_GENAI_EVAL_MAX_WORKERS=4`` (``--mlflow-workers``): with its default of 10
  threads on a sqlite store, MLflow 3.17.2's trace writes wait on each other's database
  connections (``start_trace`` takes a second connection from a pool the threads have emptied)
  and 300 rows took 605 s here; 4 threads took 20 s.

The evaluation: generated records (10 retrieved passages of ~40 words each, graded relevant
ids), scored by ``evaluate_records`` with the six retrieval metrics (hit@5, precision@5,
recall@5, mrr, map, ndcg@10; no judge), plus four judge metrics (faithfulness,
answer_relevancy, context_relevance, context_recall) whose rows are built directly, with
justifications and claim details shaped like the real ones.

Reported: wall time per way (best and median of ``--repeats``; MLflow's once: it is slow),
the client calls of ours (``outer``: made by ``log_evaluation``; ``all``: also those MLflow
makes inside them), and the in-process parts (aggregates, table, lineage, report, building
the traces) each timed alone. ``--profile`` adds a cProfile of one ``log_evaluation`` call.

(Issue 5 asked for ``bench/logging.py``; a script of that name shadows the standard
``logging`` module for every script in ``bench/``, so it is named for what it times.)
"""

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(_HERE))
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DO_NOT_TRACK", "true")
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

import argparse  # noqa: E402
import cProfile  # noqa: E402
import dataclasses  # noqa: E402
import functools  # noqa: E402
import inspect  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import pstats  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections import Counter, defaultdict  # noqa: E402
from contextlib import contextmanager  # noqa: E402
from pathlib import Path  # noqa: E402

import mlflow  # noqa: E402
import requests  # noqa: E402
from mlflow import MlflowClient  # noqa: E402
from mlflow.tracing.client import TracingClient  # noqa: E402

from mlflow_rag_eval.evaluation.engine import evaluate_records  # noqa: E402
from mlflow_rag_eval.evaluation.result import EvaluationResult  # noqa: E402
from mlflow_rag_eval.judges import JudgeInfo  # noqa: E402
from mlflow_rag_eval.records import Context, RagRecord  # noqa: E402
from mlflow_rag_eval.results import MetricResult, RowResult  # noqa: E402
from mlflow_rag_eval.testing import mlflow_server  # noqa: E402
from mlflow_rag_eval.tracking import run_logging as mlflow_logging  # noqa: E402
from mlflow_rag_eval.tracking.run_logging import lineage, log_evaluation  # noqa: E402

RETRIEVAL_METRICS = ["hit@5", "precision@5", "recall@5", "mrr", "map", "ndcg@10"]
TARGET_RATIO = 0.5
WORDS = (
    "train ticket fare bike dog cat carrier station platform journey sunday weekday refund "
    "delay season pass child senior discount luggage seat reservation first class second "
    "connection timetable conductor validate machine online app border night regional"
).split()


# --------------------------------------------------------------------------- data


def _sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + "."


def make_records(n: int, seed: int = 0, k: int = 10) -> list[RagRecord]:
    """``n`` records: k ranked passages of ~40 words, 1-4 graded relevant ids (some unjudged)."""
    rng = random.Random(seed)
    records = []
    for i in range(n):
        ids = [f"doc-{rng.randrange(1_000_000)}" for _ in range(k)]
        relevant = {d: rng.choice((1, 2)) for d in rng.sample(ids, rng.randint(0, 2))}
        relevant.update({f"doc-{rng.randrange(1_000_000)}": 1 for _ in range(rng.randint(0, 2))})
        records.append(
            RagRecord(
                question=f"Q{i}: " + _sentence(rng, 10)[:-1] + "?",
                answer=" ".join(_sentence(rng, 12) for _ in range(3)),
                contexts=tuple(Context(text=_sentence(rng, 40), id=d) for d in ids),
                reference=_sentence(rng, 15),
                relevant_ids=relevant or None,
            )
        )
    return records


def _claims_row(rng: random.Random, what: str) -> RowResult:
    claims = [
        {"claim": _sentence(rng, 8), "value": rng.random() < 0.8, "reason": f"nli entailment {rng.random():.2f}"}
        for _ in range(rng.randint(1, 5))
    ]
    supported = sum(c["value"] for c in claims)
    unsupported = [c["claim"] for c in claims if not c["value"]]
    why = f"{supported} of {len(claims)} {what} supported by the contexts"
    if unsupported:
        why += f"; unsupported: {unsupported[0]!r}" + (
            f" and {len(unsupported) - 1} more" if len(unsupported) > 1 else ""
        )
    return RowResult.scored(supported / len(claims), why, claims=claims)


def judge_metrics(records: list[RagRecord], seed: int = 1) -> list[MetricResult]:
    """Four judge metrics with rows shaped like the real ones (no judge runs)."""
    rng = random.Random(seed)
    n = len(records)
    faithfulness = [_claims_row(rng, "answer claims") for _ in range(n)]
    recall = [_claims_row(rng, "reference claims") for _ in range(n)]
    relevancy = []
    relevance = []
    for r in records:
        sim = rng.random()
        relevancy.append(RowResult.scored(sim, f"question-answer similarity {sim:.2f}"))
        verdicts = [rng.random() < 0.4 for _ in r.contexts]
        relevance.append(
            RowResult.scored(
                sum(verdicts) / len(verdicts),
                f"{sum(verdicts)} of {len(verdicts)} retrieved passages are relevant to the question",
                passages=[{"id": c.id, "value": v, "reason": ""} for c, v in zip(r.contexts, verdicts)],
            )
        )
    return [
        MetricResult(name, {"name": name, "version": 1, "params": {}}, tuple(rows), judged=True)
        for name, rows in (
            ("faithfulness", faithfulness),
            ("answer_relevancy", relevancy),
            ("context_relevance", relevance),
            ("context_recall", recall),
        )
    ]


def make_result(n_rows: int) -> EvaluationResult:
    records = make_records(n_rows)
    result = evaluate_records(records, metrics=RETRIEVAL_METRICS, progress=False)
    return dataclasses.replace(
        result,
        metrics=judge_metrics(records) + result.metrics,
        judge=JudgeInfo(
            name="local:minilm-l6", kind="local", model="sentence-transformers/all-MiniLM-L6-v2",
            fingerprint="0123456789abcdef", prompts_version="v1",
            params={"nli_threshold": 0.5}, model_files_sha256="0" * 64,
        ),
        judge_usage={"calls": {"extract_and_verify": 2 * n_rows, "rate_relevance": n_rows}, "cache_hits": 0},
    )


def fresh(result: EvaluationResult) -> EvaluationResult:
    """A copy whose metric summaries (a cached bootstrap) are not computed yet."""
    return dataclasses.replace(result, metrics=[dataclasses.replace(m) for m in result.metrics])


WAYS = {
    "log_evaluation (traces)": log_evaluation,
    "log_evaluation (no traces)": functools.partial(log_evaluation, log_traces=False),
}


# --------------------------------------------------------------------------- counting


class ClientCalls:
    """Counts (and times) every public ``MlflowClient`` method call while installed.

    ``outer`` counts calls made from outside the client (by the logging function); ``all``
    also counts those the client makes on itself (``log_table`` -> ``list_artifacts``, ...).
    """

    def __init__(self):
        self.outer: Counter[str] = Counter()
        self.all: Counter[str] = Counter()
        self.seconds: defaultdict[str, float] = defaultdict(float)
        self.http: Counter[str] = Counter()
        self._depth = 0

    def _wrap(self, name, fn):
        @functools.wraps(fn)
        def counted(*args, **kwargs):
            self.all[name] += 1
            if self._depth == 0:
                self.outer[name] += 1
            self._depth += 1
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._depth -= 1
                self.seconds[name] += time.perf_counter() - start

        return counted

    @contextmanager
    def installed(self):
        originals = {
            (cls, name): fn for cls in (MlflowClient, TracingClient) for name, fn in vars(cls).items()
            if not name.startswith("_") and inspect.isfunction(fn)
        }
        original_request = requests.Session.request

        def request(session, method, url, *args, **kwargs):
            path = url.split("/api/2.0/", 1)[-1].split("?")[0]
            if path.startswith("mlflow-artifacts/artifacts/"):  # one file's upload/download
                path = "mlflow-artifacts/.../" + path.rsplit("/", 1)[-1]
            self.http[f"{method} {path}"] += 1
            return original_request(session, method, url, *args, **kwargs)

        try:
            for (cls, name), fn in originals.items():
                setattr(cls, name, self._wrap(f"{cls.__name__}.{name}", fn))
            requests.Session.request = request
            yield self
        finally:
            for (cls, name), fn in originals.items():
                setattr(cls, name, fn)
            requests.Session.request = original_request


def _fmt(counter: Counter) -> str:
    return ", ".join(f"{k} x{v}" for k, v in sorted(counter.items())) or "-"


# --------------------------------------------------------------------------- server


# --------------------------------------------------------------------------- timing


def new_run(client: MlflowClient, experiment_id: str) -> str:
    return client.create_run(experiment_id).info.run_id


def time_ways(result: EvaluationResult, client: MlflowClient, experiment_id: str, repeats: int):
    """Wall times of each way, interleaved (load drifts on a shared box), each call on a fresh
    run and a fresh copy of the result; with the client calls of each way's fastest call."""
    times: dict[str, list[float]] = {way: [] for way in WAYS}
    calls: dict[str, ClientCalls] = {}
    for _ in range(repeats):
        for way, log in WAYS.items():
            run_id = new_run(client, experiment_id)
            copy = fresh(result)
            counter = ClientCalls()
            with counter.installed():
                start = time.perf_counter()
                log(copy, run_id, client)
                elapsed = time.perf_counter() - start
            if not times[way] or elapsed < min(times[way]):
                calls[way] = counter
            times[way].append(elapsed)
    return times, calls


def genai_rows(result: EvaluationResult) -> list[dict]:
    """The result's records as ``mlflow.genai.evaluate`` static data."""
    rows = []
    for r in result.records:
        rows.append({
            "inputs": {"question": r.question},
            "outputs": {"answer": r.answer, "contexts": [{"id": c.id, "text": c.text} for c in r.contexts]},
            "expectations": {"reference": r.reference, "relevant_ids": dict(r.relevant_ids or {})},
        })
    return rows


def time_mlflow_genai(result: EvaluationResult, experiment_id: str, workers: int) -> tuple[float, int]:
    """Seconds ``mlflow.genai.evaluate`` takes to log the rows with one trivial code scorer,
    and the traces it left on its run."""
    from mlflow.genai.scorers import scorer

    @scorer
    def answered(outputs) -> float:
        return float(bool(outputs.get("answer")))

    data = genai_rows(result)
    os.environ["MLFLOW_GENAI_EVAL_MAX_WORKERS"] = str(workers)
    os.environ.setdefault("TQDM_DISABLE", "1")
    with mlflow.start_run(experiment_id=experiment_id) as run:
        start = time.perf_counter()
        mlflow.genai.evaluate(data=data, scorers=[answered])
        elapsed = time.perf_counter() - start
    traces = mlflow.search_traces(locations=[experiment_id], run_id=run.info.run_id, include_spans=False,
                                  return_type="list", max_results=len(data) + 10)
    return elapsed, len(traces)


def breakdown(result: EvaluationResult) -> dict[str, float]:
    """The in-process parts of logging, each timed alone on a fresh copy of the result."""
    from mlflow_rag_eval.tracking.traces import _row_assessments, _row_trace

    copy = fresh(result)
    out = {}
    start = time.perf_counter()
    copy.aggregates()
    out["aggregates (summaries + bootstrap CI)"] = time.perf_counter() - start
    start = time.perf_counter()
    table = copy.table()
    out["table DataFrame build"] = time.perf_counter() - start
    start = time.perf_counter()
    text = table.to_json(orient="split", index=False, double_precision=15)
    out[f"table to_json ({len(text) / 1e6:.1f} MB)"] = time.perf_counter() - start
    start = time.perf_counter()
    doc = lineage(copy)
    json.dumps(doc, indent=2)
    out["lineage build"] = time.perf_counter() - start
    start = time.perf_counter()
    worst = mlflow_logging.worst_rows(copy)
    json.dumps(worst, default=str)
    out["worst rows build"] = time.perf_counter() - start
    start = time.perf_counter()
    page = mlflow_logging.render_report(copy, doc, worst=worst)
    out[f"HTML report render ({len(page) / 1e6:.1f} MB)"] = time.perf_counter() - start
    start = time.perf_counter()
    now = time.time_ns()
    for i, record in enumerate(copy.records):
        info, spans = _row_trace(record, i, experiment_id="0", run_id="r", model_id=None, now_ns=now)
        info.assessments = _row_assessments(copy, i, trace_id=info.trace_id, span_id=spans[0].span_id, run_id="r")
    out["traces + assessments build (no I/O)"] = time.perf_counter() - start
    return out


def bench_store(label: str, tracking_uri: str, artifact_location: str | None, result, args) -> None:
    client = MlflowClient(tracking_uri)
    mlflow.set_tracking_uri(tracking_uri)  # mlflow.genai.evaluate's store, and log_evaluation's default
    try:
        experiment_id = client.create_experiment(f"bench-{time.time_ns()}", artifact_location=artifact_location)
        # Warm-up (not timed): first-call imports, database connections, server code paths.
        for way in WAYS:
            WAYS[way](fresh(make_result(50)), new_run(client, experiment_id), client)
        print(f"\n== {label}: {len(result.records):,} rows, {len(result.metrics)} metrics ==")
        times, calls = time_ways(result, client, experiment_id, args.repeats)
        for way, counter in calls.items():
            best, median = min(times[way]), statistics.median(times[way])
            print(f"{way:>28}: best {best:7.2f} s, median {median:7.2f} s of {len(times[way])}")
            print(f"{'':>30}client calls, outer ({sum(counter.outer.values())}): {_fmt(counter.outer)}")
            print(f"{'':>30}client calls, all   ({sum(counter.all.values())}): {_fmt(counter.all)}")
            if counter.http:
                print(f"{'':>30}HTTP requests ({sum(counter.http.values())}): {_fmt(counter.http)}")
        if args.skip_mlflow:
            return
        seconds, n_traces = time_mlflow_genai(result, experiment_id, args.mlflow_workers)
        ours = min(times["log_evaluation (traces)"])
        print(f"{'mlflow.genai.evaluate':>28}: {seconds:7.2f} s  ({n_traces:,} traces; one trivial code scorer, "
              f"MLFLOW_GENAI_EVAL_MAX_WORKERS={args.mlflow_workers})")
        ratio = ours / seconds
        verdict = "OK" if ratio <= TARGET_RATIO else f"OVER the {TARGET_RATIO:g}x target"
        print(f"{'ours / mlflow':>28}: {ratio:.3f}x  ({verdict}); per row: ours {1000 * ours / len(result.records):.1f} ms, "
              f"mlflow {1000 * seconds / len(result.records):.1f} ms")
        if args.profile:
            run_id = new_run(client, experiment_id)
            profiler = cProfile.Profile()
            profiler.runcall(log_evaluation, fresh(result), run_id, client)
            out = io.StringIO()
            pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(25)
            print(out.getvalue())
    finally:
        mlflow.set_tracking_uri(None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--server", action="store_true", help="log through a loopback mlflow server")
    parser.add_argument("--mlflow-workers", type=int, default=4, help="MLFLOW_GENAI_EVAL_MAX_WORKERS for MLflow")
    parser.add_argument("--skip-mlflow", action="store_true", help="time ours only")
    parser.add_argument("--profile", action="store_true", help="cProfile one log_evaluation call")
    args = parser.parse_args()

    start = time.perf_counter()
    result = make_result(args.rows)
    print(f"built a {args.rows:,}-row result in {time.perf_counter() - start:.1f} s (not part of any timing)")
    print("\nin-process parts, each timed alone:")
    for part, seconds in breakdown(result).items():
        print(f"  {part:<40} {seconds:6.2f} s")

    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        if args.server:
            (home / "server").mkdir()
            with mlflow_server(home / "server") as (url, _):
                bench_store(f"loopback mlflow server ({url}, sqlite, proxied artifacts)", url, None, result, args)
        else:
            bench_store("local: sqlite store + local artifacts", f"sqlite:///{home / 'mlflow.db'}",
                        (home / "artifacts").as_uri(), result, args)


if __name__ == "__main__":
    main()
