"""Runs a metric suite over records: up-front checks, batches, per-row isolation, a summary.

Order of work, so that bad input never costs a judge call:
1. the suite (:mod:`mlflow_rag_eval.evaluation.suite`): named metrics checked, the default suite made of
   what the data can feed, the judge checked for every primitive;
2. each metric validates the records (errors name row and column);
3. score in batches (an LLM judge's next batch starts while the last calls of the one before are
   out: two in flight at most, results in row order); an exception inside a metric fails that
   batch's rows of that metric with a named error and the run goes on, except
   :class:`JudgeUnreachable` (a judge never reached), which stops it before anything is logged.
   A judge that answered and then stays away past its outage budget stops asking instead: the
   rows it had not judged fail as ``JudgeStopped`` and the run ends with every verdict given
   (``EvaluationFigures.stopped``);
4. :meth:`EvaluationResult.summary_text` says, per metric, what was scored, what failed and
   why, what did not apply: every route prints it.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import math
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

from mlflow_rag_eval._util.callers_state import callers_logging_kept
from mlflow_rag_eval._util.progress import Progress, progress_wanted, rows_reported_to
from mlflow_rag_eval._util.redaction import redact
from mlflow_rag_eval._util.spooled import SpooledSequence
from mlflow_rag_eval.evaluation.budget import Budget, estimate_cost
from mlflow_rag_eval.evaluation.result import EvaluationResult
from mlflow_rag_eval.evaluation.suite import Suite, fields_present, prepare_suite
from mlflow_rag_eval.judges import Judge, JudgeInfo, JudgeUnreachable
from mlflow_rag_eval.metrics import Metric
from mlflow_rag_eval.metrics.base import batch_memo
from mlflow_rag_eval.records import ColumnMapping, RagRecord, dataset_digest
from mlflow_rag_eval.results import MetricResult, RowResult
from mlflow_rag_eval.stats import SEED

__all__ = ["OnBatch", "evaluate_records", "no_judge", "run_metric", "score_records"]

_logger = logging.getLogger(__name__)

BATCH_SIZE = 1024
#: rows per batch of an LLM judge's evaluation whose finished batches are handed on while the
#: next are judged (``on_batch``: the plugin route writes their traces meanwhile); the judge's
#: pool stays as full (two batches in flight, the next started in this one's tail)
STREAMED_BATCH_SIZE = 128
#: rows per batch under a cost cap, at least: the budget is checked between batches
BUDGET_BATCH_SIZE = 16
#: under a cap, a batch holds at most this share of it (by the estimate), at least
#: BUDGET_BATCH_SIZE rows: each batch waits for its slowest call (a retry after a 429, a stalled
#: socket), so 16-row batches made a run with 4.6% of calls faulty 6.3x slower than without
#: faults (bench/faults.py, 1,000 rows); the cap itself holds call by call either way
BUDGET_BATCH_SHARE = 0.01


@callers_logging_kept()
def evaluate_records(
    records: Sequence[RagRecord],
    metrics: Iterable[str | Metric] | None = None,
    judge: str | Judge | None = None,
    *,
    available_fields: set[str] | None = None,
    mapping: ColumnMapping | None = None,
    progress: bool | None = None,
    suite: Suite | None = None,
    seed: int = SEED,
    budget: Budget | None = None,
    on_batch: OnBatch | None = None,
) -> EvaluationResult:
    """Score ``records`` with a metric suite and a judge (default: the local MiniLM judge).

    Args:
        available_fields: record fields the data provides (e.g. ``{"answer", "contexts",
            "reference"}``); defaults to what the records themselves carry.
        progress: show a progress bar on stderr (default: ``MLFLOW_RAG_EVAL_PROGRESS``, else
            when stderr is a terminal; :mod:`mlflow_rag_eval._util.progress`).
        suite: a suite :func:`~mlflow_rag_eval.evaluation.suite.prepare_suite` made already (the rag
            evaluator makes it before the pipeline runs); ``metrics`` and ``judge`` are then
            not used.
        seed: the bootstrap seed of the metrics' CIs.
        budget: the run's cost cap (:mod:`mlflow_rag_eval.evaluation.budget`): the estimate
            is printed, a run estimated above ``budget.max_cost`` is refused before any judge
            call (:class:`BudgetExceeded`), each judge call reserves what it may cost and is
            refused once that would pass the cap (``BudgetExhausted``: the row's error), and
            the batches after that are left unscored as not applicable, with the reason
            (``budget.stopped``).
        on_batch: called with each batch's first row and its rows per metric as the batch
            finishes, in row order, on this thread, while the next batches are judged (see
            :func:`score_records`).
    """
    records = list(records)
    mapping = mapping or ColumnMapping()
    if available_fields is None:
        available_fields = fields_present(records)
    if suite is None:
        suite = prepare_suite(metrics, judge, available_fields, mapping)
    suite.drop_inapplicable(records)
    suite.validate(records, mapping)
    if budget is not None:  # after every check on the data, before any judge call
        budget.check(estimate_cost(suite.metrics, records, suite.judge), judge=suite.judge)
    if suite.judge is not None:  # a stop (an outage past its budget) holds for one evaluation
        suite.judge.restart()
    rows, timings = score_records(suite, records, progress=progress_wanted(progress), budget=budget, on_batch=on_batch)
    judge_obj = suite.judge
    results = [
        MetricResult(name=m.display_name, spec=m.spec(), rows=rows[m.display_name],
                     greater_is_better=m.greater_is_better, judged=bool(m.primitives), seed=seed)
        for m in suite.metrics
    ]
    return EvaluationResult(
        records=records,
        metrics=results,
        judge=judge_obj.info() if judge_obj is not None else _NO_JUDGE,
        dataset_digest=dataset_digest(records),
        timings=timings,
        judge_usage=judge_obj.usage() if judge_obj is not None else {},
        fields=frozenset(available_fields),
        default_suite=suite.default,
        left_out=dict(suite.left_out),
    )


#: what ``on_batch`` is called with: a finished batch's first row and its rows per metric
OnBatch = Callable[[int, Mapping[str, Sequence[RowResult]]], None]


def score_records(suite: Suite, records: Sequence[RagRecord], *, progress: bool = False,
                  budget: Budget | None = None,
                  on_batch: OnBatch | None = None) -> tuple[dict[str, Sequence[RowResult]], dict[str, float]]:
    """Score records already validated for ``suite``: per metric name, one row result per
    record, and the seconds each metric took. The rows past the first few thousand are kept in
    a temporary file (:class:`~mlflow_rag_eval._util.spooled.SpooledSequence`), so a run's
    memory does not grow with its rows.

    The engine's batches and failure handling without the checks and the summary around them:
    a runner that validates the data itself (Spark, per partition, before any of it is
    scored) scores each share of the rows with this, so a row gets the same result on every
    route. With a ``budget`` checked already (:meth:`Budget.check`) the judge is metered by it
    (each judge call reserves what it may cost, and one that would pass the cap is refused:
    ``BudgetExhausted``, that row's error); with a cap, the batches are
    at most :data:`BUDGET_BATCH_SHARE` of the cap by the estimate (at least
    :data:`BUDGET_BATCH_SIZE` rows) and each starts only while the budget allows its estimate.

    ``on_batch(start, rows)`` is called on this thread as each batch finishes, in row order,
    while the batches after it are judged: what it does with them (a writer thread's traces)
    overlaps the judge. An LLM judge's batches are then :data:`STREAMED_BATCH_SIZE` rows, so
    the last one handed on is a small share of the run.
    """
    runner = _Runner(suite, len(records), progress, budget, on_batch)
    with budget.metering(suite.judge) if budget is not None else contextlib.nullcontext():
        return runner.score(list(records)), runner.timings


class _Runner:
    """Runs a suite's metrics over batches of records and owns their failures: a metric that
    raises fails that batch's rows with the exception's kind, message and traceback, and the
    run goes on — except :class:`JudgeUnreachable`, which stops it."""

    def __init__(self, suite: Suite, n_records: int, progress: bool, budget: Budget | None = None,
                 on_batch: OnBatch | None = None):
        self.suite, self.n_records, self.progress, self.budget = suite, n_records, progress, budget
        self.on_batch = on_batch
        capped = budget is not None and budget.max_cost is not None
        self.waits_on_network = bool(getattr(suite.judge, "parallel_metrics", False))
        streamed = on_batch is not None and self.waits_on_network
        self.batch_size = _capped_batch_size(budget) if capped else STREAMED_BATCH_SIZE if streamed else BATCH_SIZE
        self.timings: dict[str, float] = {m.display_name: 0.0 for m in suite.metrics}
        self.errors = 0
        self._lock = threading.Lock()
        self._changed = threading.Event()  # a batch in flight finished or reached its tail
        # A step is one row scored by one metric: the total is rows x metrics, said in the label.
        n_metrics = len(suite.metrics)
        self.bar = Progress(n_records * n_metrics, shown=progress, unit="score",
                            description=f"rag eval ({n_records} rows x {n_metrics} metric{'s' * (n_metrics != 1)})")

    def _activity(self) -> dict[str, int]:
        """What the bar shows beside the scores done: errors, and, for a judge that calls a
        provider (an LLM), its calls and cache hits; a local judge makes neither."""
        activity = {"errors": self.errors}
        usage = self.suite.judge.usage() if self.suite.judge is not None else {}
        if "provider_calls" in usage:
            activity["calls"] = usage["provider_calls"]
            activity["cached"] = usage.get("cache_hits", 0)
        return activity

    def _watch(self, done: threading.Event) -> None:
        """Refresh the judge's activity while a batch runs (an LLM batch can take minutes)."""
        while not done.wait(0.5):
            self.bar.note(**self._activity())

    def score(self, records: list[RagRecord]) -> dict[str, SpooledSequence[RowResult]]:
        metrics = self.suite.metrics
        rows: dict[str, SpooledSequence[RowResult]] = {m.display_name: SpooledSequence() for m in metrics}
        # An LLM judge waits on the network: its metrics run side by side, sharing the judge's
        # bounded pool, so one metric's local work (e.g. embeddings) overlaps the others' calls,
        # and the next batch starts once this one is down to its last calls (_Batch.tail): a
        # batch's slowest call (a retry after a 429, a stalled socket) no longer idles the pool.
        # The local judge is CPU-bound: its metrics and batches run one after another.
        waits_on_network = self.waits_on_network
        parallel = waits_on_network and len(metrics) > 1
        window = BATCHES_IN_FLIGHT if waits_on_network else 1
        done = threading.Event()
        watcher = threading.Thread(target=self._watch, args=(done,), daemon=True, name="rag-eval-progress")
        if self.progress:
            watcher.start()
        pending: deque[_Batch] = deque()
        try:
            workers = (len(metrics) if parallel else 1) * window
            with ThreadPoolExecutor(max_workers=workers) as pool:
                for start in range(0, len(records), self.batch_size):
                    batch = records[start : start + self.batch_size]
                    self._make_room(pending, window, rows)
                    if not self._allowed(start, len(batch), len(records), pending):
                        skipped = [RowResult.not_applicable(self.budget.reason())] * len(batch)
                        pending.append(_Batch.finished(start, {m.display_name: skipped for m in metrics}))
                        continue
                    entry = _Batch(start, batch, metrics, self._changed)
                    with batch_memo():  # what the batch's metrics share, dropped with the batch
                        # Each task runs in a copy of this context, which holds the batch's memo.
                        entry.futures = [pool.submit(contextvars.copy_context().run, self.run, m, entry)
                                         for m in metrics]
                    pending.append(entry)
                self._make_room(pending, 1, rows)
        finally:  # the bar is gone before any summary is printed
            done.set()
            if watcher.is_alive():
                watcher.join()
            self.bar.close()
        return rows

    def _make_room(self, pending: deque[_Batch], window: int, rows: dict[str, SpooledSequence[RowResult]]) -> None:
        """Wait until another batch may start: fewer than ``window`` batches in flight and the
        newest down to its tail. Finished batches are taken in order (a failure raises here)."""
        while True:
            self._changed.clear()
            while pending and pending[0].finished_now():
                finished = pending.popleft()
                results = finished.results()
                for name, out in results.items():
                    rows[name].extend(out)
                if self.on_batch is not None:
                    self.on_batch(finished.start, results)
            if not pending or (len(pending) < window and pending[-1].in_tail()):
                return
            self._changed.wait(0.5)

    def _allowed(self, start: int, size: int, total: int, pending: Sequence[_Batch] = ()) -> bool:
        """Whether the batch at ``start`` may be scored within the budget (always without a
        cap), beside what the batches in flight may still cost; a batch that may not is left
        unscored, a not-applicable row per record and metric."""
        if self.budget is None or self.budget.max_cost is None:
            return True
        costs = self.budget.estimate.row_costs if self.budget.estimate is not None else []
        owed = sum(b.left_share() * sum(costs[b.start : b.start + b.size]) for b in pending)
        allowed = self.budget.allows(sum(costs[start : start + size]) + owed, total - start)
        if not allowed:
            self.bar.advance(size * len(self.suite.metrics))
        return allowed

    def run(self, metric: Metric, entry: _Batch) -> list[RowResult]:
        start = time.perf_counter()
        batch = entry.records
        # The judge reports each row it answers (row_done): the bar moves with them, short of
        # the batch's last row, which it counts when the metric returns (a metric that asks
        # twice per row, e.g. questions then similarities, must not look done half-way).
        shown = [0]

        def one_row() -> None:
            if shown[0] < len(batch) - 1:
                shown[0] += 1
                entry.row_done(metric.display_name)
                self.bar.advance(1)

        try:
            with rows_reported_to(one_row):
                out = run_metric(metric, batch, self.suite.judge)
            with self._lock:
                self.timings[metric.display_name] += time.perf_counter() - start
                self.errors += sum(r.status == "error" for r in out)
            self.bar.advance(len(batch) - shown[0], **self._activity())
            return out
        finally:
            entry.metric_done(metric.display_name)


#: batches an LLM judge's run holds in flight: the next starts while the last calls of this one
#: finish. A fault mix with 4.6% of calls failing (a 3 s stall, backoff after a 429) cost each
#: 1,024-row batch ~3 s of idle pool at its end, 1.6x the fault-free wall (bench/faults.py)
BATCHES_IN_FLIGHT = 2


class _Batch:
    """One batch's rows and its metrics' tasks: how far each metric got (the rows its judge
    reported), whether all are done, and their results in metric order."""

    #: a batch is in its tail once every metric has this share of its rows or fewer to go
    TAIL = 0.125

    def __init__(self, start: int, records: list[RagRecord], metrics: Sequence[Metric], changed: threading.Event):
        self.start, self.records, self.size = start, records, len(records)
        self.names = [m.display_name for m in metrics]
        self.futures: list = []
        self._changed = changed
        self._lock = threading.Lock()
        self._reported = dict.fromkeys(self.names, 0)
        self._finished: set[str] = set()
        self._results: dict[str, list[RowResult]] | None = None

    @classmethod
    def finished(cls, start: int, results: dict[str, list[RowResult]]) -> _Batch:
        entry = cls(start, [], [], threading.Event())
        entry.size = len(next(iter(results.values()), []))
        entry._results = results
        return entry

    def row_done(self, name: str) -> None:
        with self._lock:
            self._reported[name] += 1
            if self._reported[name] == math.ceil(self.size * (1 - self.TAIL)):
                self._changed.set()

    def metric_done(self, name: str) -> None:
        with self._lock:
            self._finished.add(name)
        self._changed.set()

    def finished_now(self) -> bool:
        """Every metric's task returned or raised (its future is settled a moment later:
        :meth:`results` waits for that)."""
        with self._lock:
            return self._results is not None or len(self._finished) == len(self.names)

    def in_tail(self) -> bool:
        with self._lock:
            return all(n in self._finished or self._reported[n] >= self.size * (1 - self.TAIL) for n in self.names)

    def left_share(self) -> float:
        """The share of this batch's work not reported done yet (0 once finished)."""
        if self._results is not None or not self.names:
            return 0.0
        with self._lock:
            done = sum(self.size if n in self._finished else self._reported[n] for n in self.names)
        return 1.0 - done / (self.size * len(self.names)) if self.size else 0.0

    def results(self) -> dict[str, list[RowResult]]:
        if self._results is None:
            self._results = {name: f.result() for name, f in zip(self.names, self.futures)}
        return self._results


def _capped_batch_size(budget: Budget) -> int:
    """Rows per batch under a cap: as many as cost :data:`BUDGET_BATCH_SHARE` of it by the
    estimate, between :data:`BUDGET_BATCH_SIZE` and :data:`BATCH_SIZE`."""
    costs = budget.estimate.row_costs if budget.estimate is not None else []
    per_row = sum(costs) / len(costs) if costs else 0.0
    if per_row <= 0:
        return BUDGET_BATCH_SIZE
    return int(min(BATCH_SIZE, max(BUDGET_BATCH_SIZE, BUDGET_BATCH_SHARE * budget.max_cost // per_row)))


def run_metric(metric: Metric, records: Sequence[RagRecord], judge: Judge | None) -> list[RowResult]:
    """One metric on validated records, one row result each; the one place a metric's failure
    becomes rows. An exception inside the metric fails every row given with ``MetricError:
    <kind>: <message>`` and its traceback (one metric's bug must not kill the run), and so does
    a wrong number of rows returned. :class:`JudgeUnreachable` is raised: no row can be judged,
    and each route stops (the engine before anything is logged)."""
    records = list(records)
    try:
        out = list(metric.compute(records, judge))
        if len(out) != len(records):
            raise RuntimeError(f"returned {len(out)} rows for {len(records)}")
    except JudgeUnreachable:
        raise
    except Exception as exc:
        message = redact(f"MetricError: {type(exc).__name__}: {exc}")
        _logger.warning("metric %s failed on a batch: %s", metric.display_name, message)
        failure = RowResult.failed(message, traceback=redact(traceback.format_exc(limit=20)))
        out = [failure] * len(records)
    return out


_NO_JUDGE = JudgeInfo(name="none", kind="none", model="", fingerprint="none", prompts_version="none")


def no_judge() -> JudgeInfo:
    """The judge identity of a suite that needs no judge (retrieval metrics only)."""
    return _NO_JUDGE
