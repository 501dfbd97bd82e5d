"""Production traffic: score the traces a RAG app already logs, in place, incrementally,
within a budget, exactly once: a job to leave to cron.

:func:`evaluate_traces` (the CLI's ``evaluate --traces EXPERIMENT``) reads an experiment's
traces page by page by start time (:mod:`~mlflow_rag_eval.tracking.trace_pages`: the spans of
one page at a time are in memory, never all of them; deletions between pages skip nothing),
with the user's filter in MLflow's own grammar, and turns each into a
:class:`~mlflow_rag_eval.records.RagRecord` (:mod:`~mlflow_rag_eval.routes.trace_reading`:
which span holds what, and the strict reading of Expectations).

One trace, one failure: a trace that cannot be read (spans that do not decode, invalid
Expectations, no root span, no question, no RETRIEVER span...) is skipped and counted under its
reason, with its id (:attr:`TracesEvaluation.unreadable`), as are traces still in progress and
the row traces of an evaluation run (``rag_eval.row``); :attr:`TracesEvaluation.skipped` and the
run's ``rag_eval/traces.json`` hold the counts. A trace that may read or score differently
later (undecodable, invalid Expectations, a judgement that failed) gets the trace tag
:data:`RETRY_TAG`, and a ``since_last`` run reads the tagged traces again, behind its window too,
until they are scored. Never a crash, never a silent drop.

Each metric's verdict becomes a ``Feedback`` on the trace itself (the same assessment the rows
of any route get: :func:`~mlflow_rag_eval.tracking.traces.row_feedback`), and an evaluation
run records the sample (trace ids as ``rag_eval/traces.json``, their digest as param
``rag_eval.traces.digest``), aggregates, slices, worst rows and the report, with the scored
traces linked to it. A trace deleted before its Feedback is written is skipped and counted.

Exactly once:

- idempotent: a metric is not scored again on a trace that carries its valid Feedback by the
  same judge fingerprint, or a person's verdict on it (HUMAN Feedback, an override); a failed
  judgement is scored again (:func:`~mlflow_rag_eval.routes.trace_reading.prior_verdicts`);
- incremental: every run keeps on the experiment, under a tag named after its filter, metrics
  and judge (:func:`checkpoint_tag`), a start time the next ``since_last=True`` run reads
  after: the newest end time seen less the ``lag`` window (MLflow writes a trace when it ends,
  stamped with its start: a long request lands behind the newest start), so the overlap is
  read again and skipped at no cost;
- one run at a time: a lease (:class:`~mlflow_rag_eval.tracking.lease.ExperimentLease`, an
  experiment tag with owner and expiry) is taken before reading and checked before every
  write; a second run waits ``lease_wait`` seconds or stops with :class:`LeaseHeld` naming
  the first.

Sampling is by a hash of the trace id, so a rerun draws the same sample.

Before any judge call the estimate of calls, tokens and cost is printed, and ``max_cost``
refuses a run estimated above it; under a cap with a paid judge the spend is checked before
each trace (its estimate, scaled by how much dearer the replies so far were than estimated)
and before each judge call (what the call may cost at most reserved, settled with its usage; a
reply without usage is charged at its estimate; a call that does not fit is refused:
``BudgetExhausted``, that metric's error on the trace, scored again by the next run), and the
run stops with the reason (:mod:`mlflow_rag_eval.evaluation.budget`,
:mod:`mlflow_rag_eval.judges.llm.spend`); what was scored is kept and logged. A judge that
answered and then stays away past its outage budget stops the run the same way: the traces of
the share in flight get a ``JudgeStopped`` error (read again by the next run), the rest are
left before the checkpoint.
The run records and the summary prints the judge's calls, cache hits, tokens, estimated and
actual spend.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import heapq
import json
import re
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from mlflow import MlflowClient
from mlflow.entities import Param, RunStatus, TraceState

from mlflow_rag_eval._util.summary_log import say
from mlflow_rag_eval._util.text import did_you_mean
from mlflow_rag_eval.evaluation.budget import Budget, Estimate, estimate_cost, llm_judges
from mlflow_rag_eval.evaluation.engine import no_judge
from mlflow_rag_eval.evaluation.result import EvaluationResult
from mlflow_rag_eval.evaluation.slices import check_slice_by, slice_members
from mlflow_rag_eval.evaluation.suite import ALL_FIELDS, Suite, fields_present, prepare_suite
from mlflow_rag_eval.judges import Judge, JudgeInfo
from mlflow_rag_eval.keys import check_run_metrics
from mlflow_rag_eval.metrics import Metric
from mlflow_rag_eval.records import ColumnMapping, RagRecord, dataset_digest
from mlflow_rag_eval.routes.trace_reading import UnreadableTrace, prior_verdicts, record_from_trace, root_span
from mlflow_rag_eval.routes.trace_scoring import (
    ALREADY_SCORED,
    RETRY_TAG,
    TraceScorer,
    answered_by_cache,
    judge_usage,
    metric_result,
    set_retry_tags,
)
from mlflow_rag_eval.tracking.lease import ExperimentLease, LeaseHeld
from mlflow_rag_eval.tracking.run_logging import announce, log_run_contents
from mlflow_rag_eval.tracking.trace_pages import Undecodable, combined_filter, pages_by_time, trace_end_ms
from mlflow_rag_eval.tracking.traces import ROW_METADATA, link_traces

__all__ = ["CHECKPOINT_TAG", "LEASE_TAG", "LeaseHeld", "RETRY_TAG", "TrackingServerError", "TracesEvaluation",
           "UnreadableTrace", "checkpoint_tag", "evaluate_traces", "parse_since", "record_from_trace",
           "traces_digest"]

#: experiment tag prefix of the checkpoints (``<prefix><hash of filter, metrics and judge>``)
CHECKPOINT_TAG = "mlflow_rag_eval.traces_checkpoint."
#: experiment tag prefix of the leases (the same hash as the checkpoint's)
LEASE_TAG = "mlflow_rag_eval.traces_lease."
#: traces per search page (and per scored share: the budget is checked between them)
PAGE_SIZE = 100
#: the lag window: the longest a request runs plus the time its trace takes to land
DEFAULT_LAG = "10m"
#: seconds a lease lasts unless renewed (each write renews it when half is gone)
LEASE_TTL_S = 600.0
TRACES_FILE = "rag_eval/traces.json"


# --------------------------------------------------------------------------- reading and sampling


def parse_since(value: str | int | float | _dt.datetime | None, *, now_ms: int | None = None) -> int | None:
    """A start time as epoch milliseconds: epoch ms, an ISO 8601 time (UTC unless it says),
    a datetime, or a duration before now (``90m``, ``24h``, ``7d``)."""
    if value is None:
        return None
    if isinstance(value, _dt.datetime):
        moment = value if value.tzinfo else value.replace(tzinfo=_dt.timezone.utc)
        return int(moment.timestamp() * 1000)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return int(value)
    text = str(value).strip()
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    duration = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smhdw])", text)
    if duration:
        seconds = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}[duration.group(2)]
        return now_ms - int(float(duration.group(1)) * seconds * 1000)
    if text.isdigit():
        return int(text)
    try:
        return parse_since(_dt.datetime.fromisoformat(text.replace("Z", "+00:00")))
    except ValueError:
        raise ValueError(f"since: {value!r} is no time; give epoch milliseconds, an ISO 8601 time "
                         "(2025-06-01T00:00:00Z) or a duration before now (90m, 24h, 7d)") from None


def _sample_key(trace_id: str, seed: int) -> float:
    """A trace's place in the sample order: a hash of its id, uniform in [0, 1), the same on every run."""
    digest = hashlib.sha256(f"{seed}:{trace_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


@dataclass
class _Candidate:
    trace_id: str
    timestamp_ms: int
    record: RagRecord
    span_id: str | None
    #: metric display names the trace is not to be scored by again (scored, or judged by a person)
    done: set[str]
    #: metric -> our failed Feedback on it, which the new one overrides
    failed: dict[str, str] = field(default_factory=dict)
    #: the trace carries the retry tag (removed once it is scored)
    tagged_retry: bool = False
    #: the assessments the trace carries (a Feedback's name depends on other judges' there)
    assessments: list = field(default_factory=list)


@dataclass
class _Reading:
    """What reading the experiment found: the candidates to score, the counts, the window."""

    candidates: list[_Candidate] = field(default_factory=list)
    read: int = 0
    skipped: Counter = field(default_factory=Counter)
    #: trace id -> why it was not read (undecodable, invalid Expectations...), the first few hundred
    unreadable: dict[str, str] = field(default_factory=dict)
    newest_end_ms: int | None = None
    #: the oldest trace still in progress: the checkpoint stays before it
    oldest_in_progress_ms: int | None = None
    #: traces to read again next time (a retry tag set), and those to untag (readable now)
    to_tag: list[str] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)


#: unreadable traces named one by one in the summary and traces.json (all are counted)
UNREADABLE_NAMED = 200


def _unreadable(reading: _Reading, trace_id: str, reason: str, retry: bool, tagged: bool) -> None:
    reading.skipped[f"unreadable: {reason}"] += 1
    if len(reading.unreadable) < UNREADABLE_NAMED:
        reading.unreadable[trace_id] = reason
    if retry and not tagged:
        reading.to_tag.append(trace_id)


def _take(reading: _Reading, trace, suite: Suite, fingerprint: str, fraction: float | None, seed: int):
    """One trace read: a candidate, or None (counted under its reason)."""
    info = trace.info
    ts = int(info.request_time)
    tagged = RETRY_TAG in (info.tags or {})
    if isinstance(trace, Undecodable):
        _unreadable(reading, info.trace_id, f"it cannot be fetched or decoded ({trace.error})", True, tagged)
        return None
    if info.state == TraceState.IN_PROGRESS:
        reading.skipped["still in progress"] += 1
        reading.oldest_in_progress_ms = min(ts, reading.oldest_in_progress_ms or ts)
        return None
    if ROW_METADATA in (info.trace_metadata or {}):
        reading.skipped["a row trace of an evaluation run"] += 1
        return None
    if fraction is not None and _sample_key(info.trace_id, seed) >= fraction:
        reading.skipped["not in the sample"] += 1
        return None
    try:
        record = record_from_trace(trace)
    except UnreadableTrace as exc:
        _unreadable(reading, info.trace_id, exc.reason, exc.retry, tagged)
        return None
    prior = prior_verdicts(trace, suite, fingerprint)
    return _Candidate(info.trace_id, ts, record, root_span(trace).span_id, prior.done, prior.failed, tagged,
                      list(info.assessments or []))


def _read(client, experiment_id: str, filter_string: str | None, since_ms: int | None, suite: Suite,
          fingerprint: str, *, sample: int | None, fraction: float | None, seed: int, page_size: int) -> _Reading:
    """Every matching trace, page by page, sampled and turned into a candidate or a counted
    skip; with a window (``since_ms``), the traces before it tagged to retry as well."""
    reading, heap = _Reading(), []  # heap: the ``sample`` candidates with the smallest keys, negated
    passes = [(filter_string, since_ms)]
    if since_ms is not None:
        passes.insert(0, (combined_filter(filter_string, f"tags.`{RETRY_TAG}` = 'true'",
                                          f"timestamp_ms <= {since_ms}"), None))
    for filt, after in passes:
        for traces in pages_by_time(client, experiment_id, filt, after_ms=after, page_size=page_size):
            for trace in traces:
                if trace.info.trace_id in reading.seen:
                    continue
                reading.seen.add(trace.info.trace_id)
                reading.read += 1
                if trace.info.state != TraceState.IN_PROGRESS:
                    end = trace_end_ms(trace.info)
                    reading.newest_end_ms = max(end, reading.newest_end_ms or end)
                candidate = _take(reading, trace, suite, fingerprint, fraction, seed)
                if candidate is None:
                    continue
                key = _sample_key(candidate.trace_id, seed)
                if sample is None:
                    reading.candidates.append(candidate)
                elif len(heap) < sample:
                    heapq.heappush(heap, (-key, candidate.trace_id, candidate))
                elif -heap[0][0] > key:
                    heapq.heapreplace(heap, (-key, candidate.trace_id, candidate))
                    reading.skipped["not in the sample"] += 1
                else:
                    reading.skipped["not in the sample"] += 1
    if sample is not None:
        reading.candidates = [c for _, _, c in heap]
    reading.candidates.sort(key=lambda c: (c.timestamp_ms, c.trace_id))
    return reading


# --------------------------------------------------------------------------- the checkpoint


def checkpoint_tag(filter_string: str | None, metrics: Sequence[str | Metric] | None, judge: JudgeInfo) -> str:
    """The experiment tag holding the checkpoint of evaluations with this filter, these
    metrics (as named; none named: the default suite) and this judge (its fingerprint)."""
    names = sorted(m if isinstance(m, str) else m.display_name for m in metrics) if metrics is not None else None
    blob = json.dumps({"filter": filter_string or "", "metrics": names, "judge": judge.fingerprint}, sort_keys=True)
    return CHECKPOINT_TAG + hashlib.sha256(blob.encode()).hexdigest()[:16]


def _read_checkpoint(client, experiment_id: str, tag: str) -> int | None:
    value = client.get_experiment(experiment_id).tags.get(tag)
    return int(value) if value is not None and str(value).isdigit() else None


def _new_checkpoint(reading: _Reading, unscored: Sequence[_Candidate], old: int | None, lag_ms: int,
                    now_ms: int) -> int | None:
    """The start time the next ``since_last`` run reads after: the newest end time the run saw
    (or now, if the traces' clock is ahead), less the lag window, so that a request still
    running now (written when it ends, with its start time) is read next time; before the
    first trace the run left unscored (the budget) and any still in progress; never earlier
    than the last checkpoint."""
    limits = []
    if reading.newest_end_ms is not None:
        limits.append(min(reading.newest_end_ms, now_ms) - lag_ms)
    if unscored:
        limits.append(unscored[0].timestamp_ms - 1)
    if reading.oldest_in_progress_ms is not None:
        limits.append(reading.oldest_in_progress_ms - 1)
    new = min(limits) if limits else None
    known = [x for x in (new, old) if x is not None]
    return max(known) if known else None


# --------------------------------------------------------------------------- the route


class TrackingServerError(RuntimeError):
    """The tracking URI answers, but not as MLflow does: nothing can be read or written."""


@dataclass
class TracesEvaluation:
    """What :func:`evaluate_traces` did."""

    experiment_id: str
    #: the evaluation run (None when nothing was left to score)
    run_id: str | None
    #: traces read (every page of the window)
    read: int
    #: the traces scored, oldest first
    scored: list[str]
    #: reason -> traces not scored for it
    skipped: dict[str, int]
    estimate: Estimate
    budget: Budget
    checkpoint_tag: str
    #: the experiment's checkpoint after the run (epoch ms), and the one it read from
    checkpoint_ms: int | None
    since_ms: int | None
    result: EvaluationResult | None = None
    #: trace id -> why it could not be read (the first :data:`UNREADABLE_NAMED`)
    unreadable: dict[str, str] = field(default_factory=dict)
    #: the judge's spending during the run: calls, cache hits, tokens, cost
    spending: dict[str, Any] = field(default_factory=dict)

    def summary_text(self) -> str:
        lines = [f"traces: {self.read} read, {len(self.scored)} scored in place"
                 + (f" (run {self.run_id})" if self.run_id else " (no run: nothing to score)")]
        for reason, n in sorted(self.skipped.items(), key=lambda kv: -kv[1]):
            lines.append(f"  {n:>6} not scored: {reason.removeprefix('not scored: ')}")
        for trace_id, reason in list(self.unreadable.items())[:10]:
            lines.append(f"         unreadable {trace_id}: {reason}")
        if len(self.unreadable) > 10:
            lines.append(f"         ... {len(self.unreadable) - 10} more in {TRACES_FILE}")
        if self.spending:
            s = self.spending
            lines.append(f"  judge: {s['calls']} calls, {s['cache_hits']} cache hits, {s['tokens_in']} + "
                         f"{s['tokens_out']} tokens, estimated ${s['estimated_usd']:.4f}, spent ${s['spent_usd']:.4f}"
                         + (f" ({s['usage_unknown']} replies without usage, charged at the estimate)"
                            if s.get("usage_unknown") else ""))
        if self.budget.stopped:
            refused = self.budget.ledger.calls_refused
            lines.append(f"  stopped: {self.budget.stopped}"
                         + (f" ({refused} judge calls refused by the cap: their metric is an error on the trace, "
                            "scored again next run)" if refused else ""))
        return "\n".join(lines)


def _checked(found, asked: str, uri: str):
    """``found`` when it is an experiment as MLflow returns one, else TrackingServerError."""
    if found is not None and not (getattr(found, "experiment_id", None) and getattr(found, "name", None)):
        raise TrackingServerError(f"the tracking server at {uri} does not answer like MLflow (experiment {asked!r} "
                                  "came back without an id or a name): check --tracking-uri")
    return found


def _close_experiments(client, name: str) -> str:
    """A did-you-mean of the active experiments' names closest to ``name`` (the first 1000)."""
    from mlflow.exceptions import MlflowException

    try:
        names = [e.name for e in client.search_experiments(max_results=1000)]
    except (MlflowException, OSError):  # a hint only: the error it decorates says what went wrong
        return ""
    return did_you_mean(name, names)


def _experiment_id(client, experiment: str) -> str:
    """The experiment ``id:<id>``, ``name:<name>``, or a bare value that names one experiment
    only (an id that is also another experiment's name is refused as ambiguous)."""
    from mlflow.exceptions import MlflowException

    uri = getattr(client, "tracking_uri", "the tracking URI")
    text = str(experiment)
    kind, _, value = text.partition(":")
    if kind in ("id", "name") and value:
        if kind == "name":
            found = _checked(client.get_experiment_by_name(value), text, uri)
            if found is None:
                raise ValueError(f"no experiment named {value!r}{_close_experiments(client, value)}")
            return found.experiment_id
        try:
            return _checked(client.get_experiment(value), text, uri).experiment_id
        except MlflowException as exc:
            raise ValueError(f"no experiment with id {value!r}: {exc.message}") from None
    by_name = _checked(client.get_experiment_by_name(text), text, uri)
    by_id = None
    if text.isdigit():
        try:
            by_id = _checked(client.get_experiment(text), text, uri)
        except MlflowException:
            by_id = None
    if by_name is not None and by_id is not None and by_name.experiment_id != by_id.experiment_id:
        raise ValueError(f"{text!r} is ambiguous: experiment {by_id.experiment_id} is named {by_id.name!r} and "
                         f"experiment {by_name.experiment_id} is named {text!r}; give id:{text} or name:{text}")
    found = by_name or by_id
    if found is None:
        raise ValueError(f"no experiment named {text!r}" + (" or with that id" if text.isdigit() else "")
                         + _close_experiments(client, text) + "; give name:<name> or id:<id>")
    return found.experiment_id


def _prepare(suite: Suite, reading: _Reading, slice_by: Sequence[str]) -> tuple[list[_Candidate], list[set[str]]]:
    """The candidates some metric is left to score, and per candidate what it is not scored by
    (scored before); the others counted as skipped."""
    if reading.candidates:
        suite.drop_inapplicable([c.record for c in reading.candidates])
    if slice_by:
        slice_members([c.record for c in reading.candidates], slice_by)  # a bad field costs no judge call
    todo, done = [], []
    for c in reading.candidates:
        applicable = [m for m in suite.metrics if m.not_applicable(c.record) is None]
        missing = [m for m in applicable if m.display_name not in c.done]
        if missing:
            todo.append(c)
            done.append(set(c.done) | {m.display_name for m in suite.metrics if m not in applicable})
        else:
            reading.skipped[ALREADY_SCORED if applicable else "no metric of the suite applies"] += 1
    return todo, done


def evaluate_traces(
    experiment: str,
    *,
    metrics: Sequence[str | Metric] | None = None,
    judge: str | Judge | None = None,
    filter_string: str | None = None,
    since: str | int | _dt.datetime | None = None,
    since_last: bool = False,
    lag: str | int | float = DEFAULT_LAG,
    sample: int | None = None,
    sample_fraction: float | None = None,
    max_cost: float | None = None,
    slice_by: Sequence[str] = (),
    run_name: str | None = None,
    page_size: int = PAGE_SIZE,
    progress: bool | None = None,
    seed: int = 0,
    lease_wait: float = 0.0,
    lease_ttl: float = LEASE_TTL_S,
    client: MlflowClient | None = None,
    run_metrics: str = "means",
) -> TracesEvaluation:
    """Score the traces of ``experiment`` in place (see the module docstring).

    Args:
        experiment: ``name:<name>``, ``id:<id>``, or a bare name or id (refused when it is
            both an id and another experiment's name).
        metrics: metric names (default: the suite the traces can feed, expectations included).
        judge: a judge name or object (default ``local:minilm-l6``).
        filter_string: a ``search_traces`` filter in MLflow's grammar (clauses joined by AND,
            no parentheses), e.g. ``"tags.env = 'prod' AND trace.status = 'OK'"``; the time
            window is added to it.
        since: only traces started after this (epoch ms, ISO 8601, or ``24h``-like durations).
        since_last: only traces after the checkpoint of the last run with the same filter,
            metrics and judge (all of them when there is none); exclusive with ``since``.
        lag: the lag window (seconds, or ``10m``-like): the longest a request runs plus the
            time its trace takes to land. The checkpoint stays this far behind the newest end
            time seen, and the overlap is read again (scored traces are skipped at no cost).
        sample: score at most this many traces, chosen by a hash of the trace id (a rerun
            draws the same ones).
        sample_fraction: or score this share of them, chosen the same way.
        max_cost: US dollars the judge may cost at most (:mod:`mlflow_rag_eval.evaluation.budget`).
        slice_by: trace tags to report every metric per value of.
        lease_wait: seconds to wait for another run holding the lease (then :class:`LeaseHeld`).
        lease_ttl: seconds a lease lasts without renewal (a killed run's lease expires).
        run_metrics: which statistics are the run's MLflow metrics, as on every route
            (:data:`~mlflow_rag_eval.keys.RUN_METRICS`).
    """
    client = client or MlflowClient()
    check_run_metrics(run_metrics)
    _check_arguments(since, since_last, sample, sample_fraction, page_size)
    lag_ms = _lag_ms(lag)
    slice_by = check_slice_by(list(slice_by) or None, "slice_by")
    experiment_id = _experiment_id(client, experiment)
    suite = prepare_suite(metrics, judge, set(ALL_FIELDS))
    info = suite.judge.info() if suite.judge is not None else no_judge()
    tag = checkpoint_tag(filter_string, metrics, info)
    lease = ExperimentLease(client, experiment_id, LEASE_TAG + tag[len(CHECKPOINT_TAG):], ttl_s=lease_ttl)
    lease.acquire(wait_s=lease_wait)  # LeaseHeld: another run scores these traces
    try:
        return _evaluate(client, experiment_id, suite, info, tag, lease, filter_string=filter_string, since=since,
                         since_last=since_last, lag_ms=lag_ms, sample=sample, sample_fraction=sample_fraction,
                         max_cost=max_cost, slice_by=slice_by, run_name=run_name, page_size=page_size,
                         progress=progress, seed=seed, run_metrics=run_metrics)
    finally:
        lease.release()


def _evaluate(client, experiment_id: str, suite: Suite, info: JudgeInfo, tag: str, lease: ExperimentLease, *,
              filter_string, since, since_last, lag_ms, sample, sample_fraction, max_cost, slice_by, run_name,
              page_size, progress, seed, run_metrics="means") -> TracesEvaluation:
    now_ms = int(time.time() * 1000)
    old = _read_checkpoint(client, experiment_id, tag)
    since_ms = old if since_last else parse_since(since)
    reading = _read(client, experiment_id, filter_string, since_ms, suite, info.fingerprint,
                    sample=sample, fraction=sample_fraction, seed=seed, page_size=page_size)
    todo, done = _prepare(suite, reading, slice_by)
    set_retry_tags(client, reading.to_tag, [c.trace_id for c in reading.candidates
                                            if c.tagged_retry and not any(c is t for t in todo)])
    for metric in suite.metrics:
        metric.validate([c.record for c in todo], ColumnMapping())
    budget = Budget(max_cost)
    cached = answered_by_cache(suite, todo, done)
    estimate = estimate_cost(suite.metrics, [c.record for c in todo], suite.judge,
                             done=[d | c for d, c in zip(done, cached)])
    budget.check(estimate, judge=suite.judge)  # BudgetExceeded: before any judge call, nothing written
    if suite.judge is not None:  # a stop (an outage past its budget) holds for one run
        suite.judge.restart()
    usage_before = judge_usage(suite.judge)
    outcome = TracesEvaluation(experiment_id, None, reading.read, [], dict(reading.skipped), estimate, budget, tag,
                               old, since_ms, unreadable=dict(reading.unreadable))
    unscored: list[_Candidate] = []
    if todo:
        unscored = _score_into_run(outcome, client, suite, todo, reading, slice_by, run_name, page_size, progress,
                                   lease, filter_string=filter_string, usage_before=usage_before,
                                   run_metrics=run_metrics)
    outcome.checkpoint_ms = _new_checkpoint(reading, unscored, old, lag_ms, now_ms)
    if outcome.checkpoint_ms is not None and outcome.checkpoint_ms != old:
        lease.check()
        client.set_experiment_tag(experiment_id, tag, str(outcome.checkpoint_ms))
    say(outcome.summary_text())
    return outcome


def _lag_ms(lag) -> int:
    if isinstance(lag, bool):
        raise ValueError(f"lag must be seconds or a duration (10m), got {lag!r}")
    if isinstance(lag, (int, float)):
        seconds = float(lag)
    else:
        match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smhd]?)", str(lag).strip())
        if not match:
            raise ValueError(f"lag must be seconds or a duration (90s, 10m, 1h), got {lag!r}")
        seconds = float(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[match.group(2)]
    if seconds < 0:
        raise ValueError(f"lag must be >= 0, got {lag!r}")
    return int(seconds * 1000)


def _check_arguments(since, since_last: bool, sample, fraction, page_size: int) -> None:
    if since is not None and since_last:
        raise ValueError("since and since_last are exclusive: since_last starts at the last run's checkpoint")
    if sample is not None and fraction is not None:
        raise ValueError("sample and sample_fraction are exclusive: give a number of traces or a share")
    if sample is not None and (isinstance(sample, bool) or not isinstance(sample, int) or sample < 1):
        raise ValueError(f"sample must be a number of traces >= 1, got {sample!r}")
    if fraction is not None and (isinstance(fraction, bool) or not isinstance(fraction, (int, float))
                                 or not 0 < fraction <= 1):
        raise ValueError(f"sample_fraction must be a share in (0, 1], got {fraction!r}")
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size!r}")


def _score_into_run(outcome: TracesEvaluation, client, suite: Suite, todo: list[_Candidate], reading: _Reading,
                    slice_by, run_name, page_size: int, progress, lease: ExperimentLease, *, filter_string,
                    usage_before: dict[str, Any], run_metrics: str = "means") -> list[_Candidate]:
    """Start the evaluation run, score the candidates into it, log what was scored; returns
    the candidates the budget left unscored."""
    from mlflow_rag_eval._util.progress import progress_wanted

    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M")
    run = client.create_run(outcome.experiment_id, run_name=run_name or f"traces {stamp}")
    run_id = outcome.run_id = run.info.run_id
    try:
        scorer = TraceScorer(suite, outcome.budget, client, run_id, progress_wanted(progress), lease)
        unscored = scorer.score(todo, outcome.estimate.row_costs, page_size)
        stopped = suite.judge.stopped() if suite.judge is not None else None
        if unscored:
            outcome.skipped[f"not scored: {stopped}" if stopped else "not scored: the budget was reached"] = len(unscored)
        if scorer.gone:
            outcome.skipped["deleted before its Feedback was written"] = len(scorer.gone)
        outcome.scored = [c.trace_id for c in scorer.scored]
        if llm_judges(suite.judge):  # a judge that calls no LLM spends nothing worth a line
            now = judge_usage(suite.judge)
            outcome.spending = {k: now[k] - usage_before[k] for k in now}
            outcome.spending.update(estimated_usd=outcome.estimate.cost_usd or 0.0, spent_usd=outcome.budget.spent)
        outcome.result = _result(suite, scorer)
        _log_run(outcome, client, filter_string, slice_by, reading, run_metrics)
        link_traces(client, outcome.scored, run_id)
        announce(outcome.result)
    except BaseException:
        client.set_terminated(run_id, RunStatus.to_string(RunStatus.FAILED))
        raise
    client.set_terminated(run_id)
    return unscored


def _result(suite: Suite, scorer: TraceScorer) -> EvaluationResult:
    records = [c.record for c in scorer.scored]
    judge = suite.judge
    return EvaluationResult(
        records=records,
        metrics=[metric_result(m, scorer.rows[m.display_name]) for m in suite.metrics],
        judge=judge.info() if judge is not None else no_judge(),
        dataset_digest=dataset_digest(records),
        timings=scorer.timings,
        judge_usage=judge.usage() if judge is not None else {},
        fields=frozenset(fields_present(records)),
        default_suite=suite.default,
        left_out=dict(suite.left_out),
    )


def traces_digest(trace_ids: Iterable[str]) -> str:
    """The digest of a sample of traces: the same ids, in any order, give the same digest."""
    return hashlib.sha256("\n".join(sorted(trace_ids)).encode()).hexdigest()[:16]


def _log_run(outcome: TracesEvaluation, client, filter_string, slice_by, reading: _Reading,
             run_metrics: str = "means") -> None:
    params = {"rag_eval.traces.experiment_id": outcome.experiment_id,
              "rag_eval.traces.filter": filter_string or "",
              "rag_eval.traces.since_ms": "" if outcome.since_ms is None else str(outcome.since_ms),
              "rag_eval.traces.n_scored": str(len(outcome.scored)),
              "rag_eval.traces.digest": traces_digest(outcome.scored),
              "rag_eval.traces.checkpoint_tag": outcome.checkpoint_tag}
    client.log_batch(outcome.run_id, params=[Param(k, v[:6000]) for k, v in params.items()])
    spending = {f"rag_eval.judge.{k}": (f"{v:.6f}" if isinstance(v, float) else str(v))
                for k, v in outcome.spending.items()}
    log_run_contents(outcome.result, outcome.run_id, client, trace_ids=outcome.scored, slice_by=slice_by,
                     tags={**outcome.budget.run_tags(), **spending, "rag_eval.route": "traces"},
                     run_metrics=run_metrics)
    client.log_text(outcome.run_id, json.dumps({"trace_ids": outcome.scored, "read": reading.read,
                                                "skipped": outcome.skipped, "unreadable": outcome.unreadable,
                                                "spending": outcome.spending}, indent=1), TRACES_FILE)
