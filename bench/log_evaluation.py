"""Benchmark ``log_evaluation``: the time to put a 10,000-row evaluation on an MLflow run.

Why: logging must stay a handful of bulk calls whatever the row count, and cheap next to
scoring (target: <= 5 s for 10,000 rows). This script times ONLY the logging of an
already-computed :class:`EvaluationResult`, counts the ``MlflowClient`` calls it makes, and
compares it with an alternative that stages every file locally and uploads them at once.

Usage::

    python bench/log_evaluation.py                   # 10,000 rows, local sqlite store + local artifacts
    python bench/log_evaluation.py --server          # also through a loopback `mlflow server`
    python bench/log_evaluation.py --rows 2000 --repeats 1

The evaluation: generated records (10 retrieved passages of ~40 words each, graded relevant
ids), scored by ``evaluate_records`` with the six retrieval metrics (hit@5, precision@5,
recall@5, mrr, map, ndcg@10; no judge), plus four judge metrics (faithfulness,
answer_relevancy, context_relevance, context_recall) whose rows are built directly, with
justifications and claim details shaped like the real ones. Ten metrics: 35 table columns.

Two ways of logging are timed, interleaved, each call on a fresh run and a fresh copy of the
result (metric summaries are cached on the result, so every timed call pays for them, as in
production):

* ``log_evaluation``: the package's function with a real ``MlflowClient`` (``log_batch``,
  ``MlflowClient.log_table`` for the table, ``log_dict``/``log_text`` for the other files);
* ``direct``: the same function handed a :class:`StagingClient` (defined here) that writes
  every file into one local folder (the table with the same ``DataFrame.to_json`` call as
  ``log_table``) and then makes three calls: ``get_run`` (to merge the
  ``mlflow.loggedArtifacts`` tag that ``log_table`` sets), one ``log_batch`` carrying that tag,
  one ``log_artifacts``. The script checks that both ways leave the same metrics, params, tags
  and artifact bytes.

Reported: best and median wall time per way, the client calls (``outer``: made by
``log_evaluation``; ``all``: also those MLflow makes inside ``log_table``, ``log_dict``...),
the seconds spent inside each, HTTP requests in server mode, and the in-process parts
(aggregates, table build, JSON encoding, image scan, lineage, report) each timed alone.
``--profile`` adds a cProfile of one ``log_evaluation`` call.

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
import re  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections import Counter, defaultdict  # noqa: E402
from contextlib import contextmanager  # noqa: E402
from pathlib import Path  # noqa: E402

import mlflow  # noqa: E402
import requests  # noqa: E402
from mlflow import MlflowClient  # noqa: E402
from mlflow.entities import RunTag  # noqa: E402
from mlflow.utils.mlflow_tags import MLFLOW_LOGGED_ARTIFACTS  # noqa: E402

from mlflow_rag_eval.engine import EvaluationResult, evaluate_records  # noqa: E402
from mlflow_rag_eval.integrations import mlflow_logging  # noqa: E402
from mlflow_rag_eval.integrations.mlflow_logging import TABLE_FILE, lineage, log_evaluation  # noqa: E402
from mlflow_rag_eval.judges import JudgeInfo  # noqa: E402
from mlflow_rag_eval.records import Context, RagRecord  # noqa: E402
from mlflow_rag_eval.results import MetricResult, RowResult  # noqa: E402
from mlflow_rag_eval.testing import mlflow_server  # noqa: E402

RETRIEVAL_METRICS = ["hit@5", "precision@5", "recall@5", "mrr", "map", "ndcg@10"]
TARGET_S = 5.0
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
        MetricResult(name, {"name": name, "version": 1, "params": {}}, tuple(rows))
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


# --------------------------------------------------------------------------- the alternative


class StagingClient:
    """Stands in for ``MlflowClient`` inside ``log_evaluation``; ``flush`` sends it all in 3 calls.

    ``log_table`` lists the artifact folder, maps an image check over every cell, writes the
    JSON, uploads it, re-reads the run and sets the ``mlflow.loggedArtifacts`` tag (the tag
    the UI's evaluation view reads); ``log_dict``/``log_text`` upload one file each. Here every
    file is written into one local folder (the table with the same ``to_json`` call as
    ``log_table``, dicts with ``log_dict``'s ``json.dump``), the batch is held back, and
    ``flush`` makes one ``get_run`` (to merge the tag), one ``log_batch`` carrying the tag, and
    one ``log_artifacts``. Running ``log_evaluation`` itself through it keeps this alternative
    in step with whatever the package logs. Unlike ``log_table`` it overwrites an existing
    table instead of appending to it (a run holds one evaluation), and it refuses image cells.
    """

    def __init__(self, client: MlflowClient, root: Path):
        self._client = client
        self._root = root
        self._metrics: list = []
        self._params: list = []
        self._tags: list = []
        self._tables: list[str] = []

    def _path(self, artifact_file: str) -> Path:
        path = self._root / artifact_file
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def log_batch(self, run_id, metrics=(), params=(), tags=(), synchronous=None):
        self._metrics += list(metrics)
        self._params += list(params)
        self._tags += list(tags)

    def log_table(self, run_id, data, artifact_file):
        if len(data) and any(hasattr(x, "save") and hasattr(x, "resize") for x in data.iloc[0]):
            raise TypeError("image cells need MlflowClient.log_table")
        data.to_json(self._path(artifact_file), orient="split", index=False, date_format="iso")
        self._tables.append(artifact_file)

    def log_dict(self, run_id, dictionary, artifact_file):
        if Path(artifact_file).suffix in (".yml", ".yaml"):
            raise ValueError("YAML: use MlflowClient.log_dict")
        with open(self._path(artifact_file), "w") as f:
            json.dump(dictionary, f, indent=2, default=str)

    def log_text(self, run_id, text, artifact_file):
        self._path(artifact_file).write_text(text, encoding="utf-8")

    def __getattr__(self, name):
        raise AttributeError(f"StagingClient does not stand in for MlflowClient.{name}")

    def flush(self, run_id: str) -> None:
        logged = json.loads(self._client.get_run(run_id).data.tags.get(MLFLOW_LOGGED_ARTIFACTS, "[]"))
        for path in self._tables:
            if {"path": path, "type": "table"} not in logged:
                logged.append({"path": path, "type": "table"})
        tags = self._tags + ([RunTag(MLFLOW_LOGGED_ARTIFACTS, json.dumps(logged))] if self._tables else [])
        self._client.log_batch(run_id, metrics=self._metrics, params=self._params, tags=tags)
        self._client.log_artifacts(run_id, str(self._root))


def log_evaluation_direct(
    result: EvaluationResult, run_id: str, client: MlflowClient | None = None
) -> dict[str, float]:
    """``log_evaluation`` through a :class:`StagingClient`: the same run in three client calls."""
    with tempfile.TemporaryDirectory() as tmp:
        staging = StagingClient(client or MlflowClient(), Path(tmp))
        metrics = log_evaluation(result, run_id, staging)
        staging.flush(run_id)
    return metrics


WAYS = {"log_evaluation": log_evaluation, "direct": log_evaluation_direct}


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
            name: fn for name, fn in vars(MlflowClient).items()
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
            for name, fn in originals.items():
                setattr(MlflowClient, name, self._wrap(name, fn))
            requests.Session.request = request
            yield self
        finally:
            for name, fn in originals.items():
                setattr(MlflowClient, name, fn)
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
    last_run: dict[str, str] = {}
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
            last_run[way] = run_id
    return times, calls, last_run


def breakdown(result: EvaluationResult) -> dict[str, float]:
    """The in-process parts of logging, each timed alone on a fresh copy of the result."""
    copy = fresh(result)
    out = {}
    start = time.perf_counter()
    copy.aggregates()
    out["aggregates (summaries + bootstrap CI)"] = time.perf_counter() - start
    start = time.perf_counter()
    table = copy.table()
    out["table DataFrame build"] = time.perf_counter() - start
    start = time.perf_counter()
    text = table.to_json(orient="split", index=False, date_format="iso")
    out[f"table to_json ({len(text) / 1e6:.1f} MB)"] = time.perf_counter() - start
    start = time.perf_counter()
    for column in table.columns:  # log_table's image check: a Python call per cell
        any(table[column].map(lambda x: hasattr(x, "save") and hasattr(x, "resize")))
    out["log_table image scan (approx.)"] = time.perf_counter() - start
    start = time.perf_counter()
    doc = lineage(copy)
    json.dumps(doc, indent=2)
    out["lineage build"] = time.perf_counter() - start
    # The report parts, where this version of log_evaluation logs them.
    worst_rows = getattr(mlflow_logging, "worst_rows", None)
    render_report = getattr(mlflow_logging, "render_report", None)
    if worst_rows is not None:
        start = time.perf_counter()
        worst = worst_rows(copy)
        json.dumps(worst, indent=2, default=str)
        out["worst rows build"] = time.perf_counter() - start
        if render_report is not None:
            start = time.perf_counter()
            html = render_report(copy, doc, worst=worst)
            out[f"HTML report render ({len(html) / 1e6:.1f} MB)"] = time.perf_counter() - start
    return out


_TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(\+00:00| UTC)?")


def _artifact_files(client: MlflowClient, run_id: str, path: str | None = None) -> list[str]:
    out = []
    for f in client.list_artifacts(run_id, path):
        out += _artifact_files(client, run_id, f.path) if f.is_dir else [f.path]
    return sorted(out)


def check_same(client: MlflowClient, run_a: str, run_b: str) -> list[str]:
    """Differences between what the two ways left on their runs (empty: the same). Files are
    compared byte for byte, except for the creation time stamped in lineage and report."""
    diffs = []
    a, b = client.get_run(run_a).data, client.get_run(run_b).data
    skip = {"mlflow.runName"}
    if a.metrics != b.metrics:
        diffs.append("metrics")
    if a.params != b.params:
        diffs.append("params")
    tags_a = {k: v for k, v in a.tags.items() if k not in skip}
    tags_b = {k: v for k, v in b.tags.items() if k not in skip}
    if tags_a != tags_b:
        diffs.append(f"tags {sorted(set(tags_a.items()) ^ set(tags_b.items()))}")
    files = _artifact_files(client, run_a)
    if files != _artifact_files(client, run_b):
        return diffs + [f"artifact lists {files} vs {_artifact_files(client, run_b)}"]
    with tempfile.TemporaryDirectory() as tmp:
        for path in files:
            fa = Path(client.download_artifacts(run_a, path, f"{tmp}/a")).read_text(encoding="utf-8")
            fb = Path(client.download_artifacts(run_b, path, f"{tmp}/b")).read_text(encoding="utf-8")
            if path != TABLE_FILE:
                fa, fb = _TIMESTAMP.sub("<time>", fa), _TIMESTAMP.sub("<time>", fb)
            if fa != fb:
                diffs.append(path)
    return diffs


def bench_store(label: str, tracking_uri: str, artifact_location: str | None, result, args) -> None:
    client = MlflowClient(tracking_uri)
    mlflow.set_tracking_uri(tracking_uri)  # log_evaluation's default client, should it be used
    try:
        experiment_id = client.create_experiment(f"bench-{time.time_ns()}", artifact_location=artifact_location)
        # Warm-up (not timed): first-call imports, sqlite connections, server code paths.
        for way in WAYS:
            WAYS[way](fresh(make_result(50)), new_run(client, experiment_id), client)
        print(f"\n== {label}: {len(result.records):,} rows, {len(result.metrics)} metrics ==")
        times, calls, last_runs = time_ways(result, client, experiment_id, args.repeats)
        for way, counter in calls.items():
            best, median = min(times[way]), statistics.median(times[way])
            verdict = "OK" if best <= TARGET_S else f"OVER the {TARGET_S:g} s target"
            print(f"{way:>15}: best {best:5.2f} s, median {median:5.2f} s of {len(times[way])}  ({verdict})")
            print(f"{'':>17}client calls, outer ({sum(counter.outer.values())}): {_fmt(counter.outer)}")
            print(f"{'':>17}client calls, all   ({sum(counter.all.values())}): {_fmt(counter.all)}")
            inside = sorted(counter.seconds.items(), key=lambda kv: -kv[1])
            print(f"{'':>17}seconds inside each (nested calls inside their callers' too): "
                  + ", ".join(f"{k} {v:.2f}" for k, v in inside))
            if counter.http:
                print(f"{'':>17}HTTP requests ({sum(counter.http.values())}): {_fmt(counter.http)}")
        diffs = check_same(client, last_runs["log_evaluation"], last_runs["direct"])
        print(f"{'':>17}both ways leave the same run: {'yes' if not diffs else 'NO: ' + ', '.join(diffs)}")
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
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--server", action="store_true", help="also log through a loopback mlflow server")
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
        bench_store(
            "local: sqlite store + local artifacts",
            f"sqlite:///{home / 'mlflow.db'}",
            (home / "artifacts").as_uri(),
            result,
            args,
        )
        if args.server:
            (home / "server").mkdir()
            with mlflow_server(home / "server") as (url, _):
                bench_store(f"loopback mlflow server ({url}, proxied artifacts)", url, None, result, args)


if __name__ == "__main__":
    main()
