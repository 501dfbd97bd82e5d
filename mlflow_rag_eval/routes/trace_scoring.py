"""Scoring production traces in place (the writing half of
:mod:`~mlflow_rag_eval.routes.production_traces`): candidates scored a share at a time, each by
the metrics it lacks, every verdict a Feedback on its trace (a failed one overridden by the new
one), written on a writer thread while the next share is judged (one write in flight, in
order), the lease checked before each write, a trace deleted meanwhile skipped; under a cap with
a paid judge, the spend checked before each trace and before each judge call; and what the
judge cache answers, found before the estimate."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from mlflow_rag_eval._util.spooled import SpooledSequence
from mlflow_rag_eval._util.writer import InOrderWriter
from mlflow_rag_eval.evaluation.budget import Budget, llm_judges
from mlflow_rag_eval.evaluation.engine import no_judge, score_records
from mlflow_rag_eval.evaluation.suite import Suite
from mlflow_rag_eval.metrics import Metric
from mlflow_rag_eval.results import MetricResult, RowResult
from mlflow_rag_eval.stats import SEED
from mlflow_rag_eval.tracking.lease import ExperimentLease
from mlflow_rag_eval.tracking.traces import feedback_name, log_assessments_on_live_traces, row_feedback

__all__ = ["ALREADY_SCORED", "RETRY_TAG", "TraceScorer", "answered_by_cache", "judge_usage", "metric_result",
           "set_retry_tags"]

#: trace tag of a trace to read again on the next ``since_last`` run
RETRY_TAG = "mlflow_rag_eval.retry"
ALREADY_SCORED = "already scored by this judge (the trace carries the Feedback)"


class TraceScorer:
    """Scores the candidates a share at a time, each trace by the metrics it lacks, and puts
    every verdict on its trace at once (what was scored stays scored if the run stops).

    The judge is metered by the budget while it scores (:meth:`Budget.metering`): each judge
    call reserves what it may cost before it is sent and is refused (``BudgetExhausted``, the
    metric's error on that trace) once that would pass the cap. Under a cap with a paid judge a
    share is one trace: before its judge calls, the spend so far plus its estimate (scaled up by
    how much dearer than estimated the replies have been) must fit under the cap
    (:meth:`Budget.allows`), and the lease is checked before its write."""

    def __init__(self, suite: Suite, budget: Budget, client, run_id: str, progress: bool, lease: ExperimentLease):
        self.suite, self.budget, self.client, self.run_id, self.progress = suite, budget, client, run_id, progress
        self.lease = lease
        #: per metric, the rows of the traces scored (past a few thousand, in a temporary file)
        self.rows: dict[str, SpooledSequence[RowResult]] = {m.display_name: SpooledSequence() for m in suite.metrics}
        self.scored: list = []
        self.gone: list[str] = []
        self.failed: list[str] = []
        self.timings: dict[str, float] = {m.display_name: 0.0 for m in suite.metrics}

    def score(self, candidates: Sequence, row_costs: Sequence[float], share: int) -> list:
        """Score every share the budget allows; returns the candidates left unscored.

        A share's Feedback is written on a writer thread while the next share is judged (the
        store's writes were as long as the local judge's work: 2,000 traces, 14.4 s of 30.2).
        One write is in flight at most, shares are written in order, and every write has ended,
        or raised here, before this returns."""
        per_trace = self.budget.max_cost is not None and any(row_costs)
        step = 1 if per_trace else share
        with self.budget.metering(self.suite.judge), InOrderWriter("rag_eval_feedback") as writer:
            for start in range(0, len(candidates), step):
                if not self.budget.allows(sum(row_costs[start : start + step]), len(candidates) - start):
                    return list(candidates[start:])
                judged = self._judge_share(candidates[start : start + step])
                writer.submit(self._write_share, *judged)
                if self.suite.judge is not None and self.suite.judge.stopped():  # the rest: next run
                    return list(candidates[start + step :])
        return []

    def _judge_share(self, chunk: Sequence) -> tuple[Sequence, dict[str, MetricResult], dict[str, list], set[str]]:
        """The share's rows per metric, each trace's Feedback and the traces with a failed verdict."""
        groups: dict[tuple[str, ...], list[int]] = {}
        for i, c in enumerate(chunk):
            todo = tuple(m.display_name for m in self.suite.metrics if m.display_name not in c.done)
            groups.setdefault(todo, []).append(i)
        rows: dict[str, list[RowResult | None]] = {m.display_name: [None] * len(chunk) for m in self.suite.metrics}
        for todo, members in groups.items():
            sub = Suite([m for m in self.suite.metrics if m.display_name in todo], self.suite.judge, default=False)
            got, seconds = score_records(sub, [chunk[i].record for i in members], progress=self.progress)
            for name, results in got.items():
                self.timings[name] += seconds.get(name, 0.0)
                for i, row in zip(members, results):
                    rows[name][i] = row
        info = self.suite.judge.info() if self.suite.judge is not None else no_judge()
        by_trace: dict[str, list] = {c.trace_id: [] for c in chunk}
        results = {m.display_name: metric_result(m, [r or RowResult.not_applicable(ALREADY_SCORED)
                                                      for r in rows[m.display_name]]) for m in self.suite.metrics}
        errored: set[str] = set()
        for metric in self.suite.metrics:
            for c, row in zip(chunk, results[metric.display_name].rows):
                judge = info if metric.primitives else None
                made = row_feedback(results[metric.display_name], row, judge=judge, trace_id=c.trace_id,
                                    span_id=c.span_id, run_id=self.run_id,
                                    name=feedback_name(metric.key, judge, getattr(c, "assessments", ())))
                if made is None:  # None: not applicable (or scored before)
                    continue
                if metric.display_name in c.failed:  # the failed Feedback is marked invalid by MLflow
                    made.overrides = c.failed[metric.display_name]
                if row.status == "error":
                    errored.add(c.trace_id)
                by_trace[c.trace_id].append(made)
        return chunk, results, by_trace, errored

    def _write_share(self, chunk: Sequence, results: dict[str, MetricResult], by_trace: dict[str, list],
                     errored: set[str]) -> None:
        """Put the share's Feedback on its traces and count what was scored (on the writer thread)."""
        self.lease.check()  # before any write: a run that lost its lease writes nothing more
        gone = log_assessments_on_live_traces(self.client, by_trace)
        self.gone += sorted(gone)
        for k, c in enumerate(chunk):
            if c.trace_id in gone:
                continue
            for metric in self.suite.metrics:
                self.rows[metric.display_name].append(results[metric.display_name].rows[k])
            self.scored.append(c)
            if c.trace_id in errored:
                self.failed.append(c.trace_id)
        set_retry_tags(self.client, [c.trace_id for c in chunk if c.trace_id in errored and not c.tagged_retry],
                       [c.trace_id for c in chunk if c.trace_id not in errored and c.tagged_retry
                        and c.trace_id not in gone])


def metric_result(metric: Metric, rows: Sequence[RowResult]) -> MetricResult:
    """``rows`` as the metric's result: a :class:`SpooledSequence` as it is, else as a tuple."""
    rows = rows if isinstance(rows, SpooledSequence) else tuple(rows)
    return MetricResult(name=metric.display_name, spec=metric.spec(), rows=rows,
                        greater_is_better=metric.greater_is_better, judged=bool(metric.primitives), seed=SEED)


def set_retry_tags(client, tag: Sequence[str], untag: Sequence[str]) -> None:
    """Tag traces to read again on the next ``since_last`` run (:data:`RETRY_TAG`), untag the
    ones that were scored; a trace deleted meanwhile is left alone."""
    for trace_id in tag:
        with contextlib.suppress(Exception):
            client.set_trace_tag(trace_id, RETRY_TAG, "true")
    for trace_id in untag:
        with contextlib.suppress(Exception):
            client.delete_trace_tag(trace_id, RETRY_TAG)


def answered_by_cache(suite: Suite, todo: Sequence, done: Sequence[set[str]]) -> list[set[str]]:
    """Per candidate, the judged metrics whose every LLM call the judge cache answers: they
    cost nothing, so the estimate (and the cap) leaves them out. Found by scoring them once in
    the judges' cache probe (a call not cached fails at once, no provider is asked, the usage
    is left as it was)."""
    out: list[set[str]] = [set() for _ in todo]
    judges = llm_judges(suite.judge)
    if not judges or not todo:
        return out
    with contextlib.ExitStack() as probes:
        for judge in judges:
            probes.enter_context(judge.cache_probe())
        for metric in (m for m in suite.metrics if m.primitives):
            members = [i for i, c in enumerate(todo) if metric.display_name not in done[i]
                       and metric.not_applicable(c.record) is None]
            if not members:
                continue
            got, _ = score_records(Suite([metric], suite.judge, default=False), [todo[i].record for i in members])
            for i, row in zip(members, got[metric.display_name]):
                if row.status == "scored":
                    out[i].add(metric.display_name)
    return out


def judge_usage(judge) -> dict[str, Any]:
    """The judge's running usage figures (summed over a panel's LLM members)."""
    totals = {"calls": 0, "cache_hits": 0, "tokens_in": 0, "tokens_out": 0, "usage_unknown": 0}
    for member in llm_judges(judge):
        usage = member.usage_
        totals["calls"] += usage.provider_calls
        totals["cache_hits"] += usage.cache_hits
        totals["tokens_in"] += usage.tokens_in
        totals["tokens_out"] += usage.tokens_out
        totals["usage_unknown"] += usage.usage_unknown
    return totals
