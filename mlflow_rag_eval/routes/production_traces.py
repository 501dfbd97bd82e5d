"""Production traffic: score the traces a RAG app already logs, in place, incrementally,
within a budget.

:func:`evaluate_traces` (the CLI's ``evaluate --traces EXPERIMENT``) reads an experiment's
traces page by page (``search_traces`` with ``max_results`` and ``page_token``, oldest first:
the spans of one page at a time are in memory, never all of them), and turns each into a
:class:`~mlflow_rag_eval.records.RagRecord`:

- question and answer from the root span's inputs and outputs, in their common shapes (a
  string; ``{"question"|"query"|"input"|"prompt": ...}``; chat ``{"messages": [...]}``, the last
  user message; outputs ``{"answer"|"output"|"response"|"result"|"text"|"content": ...}`` or
  OpenAI's ``{"choices": [{"message": {"content"}}]}``);
- the contexts from the last RETRIEVER span (a reranker after a retriever: its order is the
  ranking): its outputs are MLflow ``Document``\\ s, ``page_content`` the text and
  ``metadata.doc_uri`` (else the document's ``id``) the id, ``metadata.parent_id`` the parent;
- expectations from the trace's ``Expectation`` assessments when it has them (``reference`` or
  ``expected_response``, ``relevant_ids``, ``answerable``, ``reference_contexts``);
- the trace's own tags (not ``mlflow.*``) as the record's metadata, for ``slice_by``.

A trace that cannot be read (no root span, no question, no RETRIEVER span...) is skipped and
counted under its reason, as are traces still in progress and the row traces of an evaluation
run (``rag_eval.row``); :attr:`TracesEvaluation.skipped` and the run's ``rag_eval/traces.json``
hold the counts. Never a crash, never a silent drop.

Each metric's verdict becomes a ``Feedback`` on the trace itself (the same assessment the rows
of any route get: :func:`~mlflow_rag_eval.tracking.traces.row_feedback`), and an evaluation
run records the sample (trace ids as ``rag_eval/traces.json``, their digest as param
``rag_eval.traces.digest``), aggregates, slices, worst rows and the report, with the scored
traces linked to it.

Idempotent and incremental: a trace that carries a Feedback of a metric (same key and metric
version) by the same judge fingerprint is not scored by it again (a failed judgement, a
Feedback with an error, counts as judged); every run keeps on the experiment, under a tag
named after its filter, metrics and judge (:func:`checkpoint_tag`), the newest trace time it
dealt with, and ``since_last=True`` reads only traces after it. Sampling is by a hash of the
trace id, so a rerun draws the same sample.

Before any judge call the estimate of calls, tokens and cost is printed, and ``max_cost``
refuses a run estimated above it or stops one that reaches it between pages
(:mod:`mlflow_rag_eval.evaluation.budget`); what was scored is kept and logged, with the reason.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import heapq
import json
import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mlflow import MlflowClient
from mlflow.entities import Param, RunStatus, SpanType, TraceState

from mlflow_rag_eval._util.mlflow_compat import search_traces
from mlflow_rag_eval.evaluation.budget import Budget, Estimate, estimate_cost
from mlflow_rag_eval.evaluation.engine import no_judge, score_records
from mlflow_rag_eval.evaluation.result import EvaluationResult
from mlflow_rag_eval.evaluation.slices import check_slice_by, slice_members
from mlflow_rag_eval.evaluation.suite import ALL_FIELDS, Suite, fields_present, prepare_suite
from mlflow_rag_eval.judges import Judge, JudgeInfo
from mlflow_rag_eval.metrics import Metric
from mlflow_rag_eval.records import ColumnMapping, Context, RagRecord, dataset_digest
from mlflow_rag_eval.results import MetricResult, RowResult
from mlflow_rag_eval.stats import SEED
from mlflow_rag_eval.tracking.run_logging import announce, log_run_contents
from mlflow_rag_eval.tracking.traces import ROW_METADATA, link_traces, log_assessments, row_feedback

__all__ = ["CHECKPOINT_TAG", "TracesEvaluation", "UnreadableTrace", "checkpoint_tag", "evaluate_traces",
           "parse_since", "record_from_trace", "traces_digest"]

#: experiment tag prefix of the checkpoints (``<prefix><hash of filter, metrics and judge>``)
CHECKPOINT_TAG = "mlflow_rag_eval.traces_checkpoint."
#: traces per search page (and per scored share: the budget is checked between them)
PAGE_SIZE = 100
TRACES_FILE = "rag_eval/traces.json"
ALREADY_SCORED = "already scored by this judge (the trace carries the Feedback)"


# --------------------------------------------------------------------------- MLflow tracing calls
# Every call this module makes to MLflow's tracing API, in one place (names differ across
# MLflow 3 releases).

def _search_page(client: MlflowClient, experiment_id: str, filter_string: str | None, page_token: str | None,
                 page_size: int) -> tuple[list, str | None]:
    """One page of traces with their spans and assessments, oldest first, and the next token."""
    page = search_traces(client, experiment_id, filter_string=filter_string, max_results=page_size,
                         order_by=["timestamp_ms ASC"], page_token=page_token, include_spans=True)
    return list(page), page.token


def _root_span(trace):
    return next((s for s in trace.data.spans if s.parent_id is None), None)


def _retriever_spans(trace) -> list:
    return sorted((s for s in trace.data.spans if s.span_type == SpanType.RETRIEVER), key=lambda s: s.start_time_ns)


def _assessments(trace) -> list:
    return list(trace.info.assessments or [])


def _is_in_progress(trace) -> bool:
    return trace.info.state == TraceState.IN_PROGRESS


# --------------------------------------------------------------------------- a trace as a record


class UnreadableTrace(ValueError):
    """A trace that is no RAG request this module can read; ``reason`` is what is counted."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(reason)


_QUESTION_KEYS = ("question", "query", "input", "prompt", "user_input", "request")
_ANSWER_KEYS = ("answer", "output", "response", "result", "text", "content", "generation")


def _text_of(content: Any) -> str | None:
    """A chat message's content as text (a string, or OpenAI's list of ``{"text"}`` parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, Mapping) and isinstance(p.get("text"), str)]
        return "\n".join(parts) if parts else None
    return None


def _last_message(messages: Any, roles: tuple[str, ...]) -> str | None:
    if not isinstance(messages, list):
        return None
    for message in reversed(messages):
        if isinstance(message, Mapping) and message.get("role") in roles:
            return _text_of(message.get("content"))
    return None


def _under_keys(value: Mapping, keys: Sequence[str], read: Callable[[Any], str | None]) -> str | None:
    """The string under the first of ``keys`` that holds one, directly or in a mapping ``read``
    finds it in (``{"input": {"question": ...}}``)."""
    for key in keys:
        held = value.get(key)
        if isinstance(held, str):
            return held
        if isinstance(held, Mapping):
            nested = read(held)
            if nested is not None:
                return nested
    return None


def _question(inputs: Any) -> str | None:
    """The question in a root span's inputs, in the shapes RAG apps log it."""
    if isinstance(inputs, str):
        return inputs
    if not isinstance(inputs, Mapping):
        return None
    found = _under_keys(inputs, _QUESTION_KEYS, _question)
    if found is not None:
        return found
    if "messages" in inputs:
        return _last_message(inputs["messages"], ("user", "human"))
    strings = [v for v in inputs.values() if isinstance(v, str)]
    return strings[0] if len(strings) == 1 else None


def _answer(outputs: Any) -> str | None:
    """The answer in a root span's outputs, in the shapes RAG apps log it."""
    if isinstance(outputs, str):
        return outputs
    if not isinstance(outputs, Mapping):
        return None
    found = _under_keys(outputs, _ANSWER_KEYS, _answer)
    if found is not None:
        return found
    choices = outputs.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], Mapping):
        first = choices[0]
        message = first.get("message")
        return _text_of(message.get("content")) if isinstance(message, Mapping) else _text_of(first.get("text"))
    if "messages" in outputs:
        return _last_message(outputs["messages"], ("assistant", "ai"))
    return None


def _context(doc: Any) -> Context:
    """One retrieved document (an MLflow ``Document`` dict, or a plain string) as a context."""
    if isinstance(doc, str):
        return Context(doc)
    if not isinstance(doc, Mapping) or not isinstance(doc.get("page_content", doc.get("text")), str):
        raise UnreadableTrace("a RETRIEVER span output is no document (page_content)")
    metadata = doc.get("metadata") if isinstance(doc.get("metadata"), Mapping) else {}
    doc_id = metadata.get("doc_uri", doc.get("id", metadata.get("id")))
    parent = metadata.get("parent_id")
    return Context(doc.get("page_content", doc.get("text")), id=None if doc_id is None else str(doc_id),
                   parent_id=None if parent is None else str(parent))


def _relevant_ids(value: Any) -> dict[str, float]:
    """An Expectation ``relevant_ids``: ``{id: grade}``, a list of ids, or of ``{"id", "grade"}``."""
    if isinstance(value, Mapping):
        return {str(k): float(v) for k, v in value.items()}
    if isinstance(value, list):
        out: dict[str, float] = {}
        for item in value:
            if isinstance(item, Mapping):
                out[str(item["id"])] = float(item.get("grade", 1))
            else:
                out[str(item)] = 1.0
        return out
    raise TypeError(type(value).__name__)


def _expectations(trace) -> dict[str, Any]:
    """The record fields the trace's Expectation assessments give (the newest of each name)."""
    out: dict[str, Any] = {}
    for assessment in _assessments(trace):
        if getattr(assessment, "expectation", None) is None or getattr(assessment, "valid", True) is False:
            continue
        name, value = assessment.name, assessment.value
        try:
            if name in ("reference", "expected_response") and isinstance(value, str):
                out["reference"] = value
            elif name == "relevant_ids":
                out["relevant_ids"] = _relevant_ids(value)
            elif name == "answerable" and isinstance(value, bool):
                out["answerable"] = value
            elif name == "reference_contexts" and isinstance(value, list):
                out["reference_contexts"] = tuple(str(v) for v in value)
        except (TypeError, ValueError, KeyError):
            raise UnreadableTrace(f"its Expectation {name!r} is unreadable") from None
    return out


def record_from_trace(trace) -> RagRecord:
    """The record a trace holds (see the module docstring); :class:`UnreadableTrace` naming
    why when it holds none."""
    root = _root_span(trace)
    if root is None:
        raise UnreadableTrace("no root span")
    question, answer = _question(root.inputs), _answer(root.outputs)
    if not question or not question.strip():
        raise UnreadableTrace("no question in the root span's inputs")
    if answer is None:
        raise UnreadableTrace("no answer in the root span's outputs")
    retrievers = _retriever_spans(trace)
    if not retrievers:
        raise UnreadableTrace("no RETRIEVER span")
    documents = retrievers[-1].outputs
    if documents is None:
        documents = []
    if not isinstance(documents, list):
        raise UnreadableTrace("the RETRIEVER span's outputs are not a list of documents")
    tags = {k: v for k, v in (trace.info.tags or {}).items() if not k.startswith("mlflow.")}
    return RagRecord(question=question, answer=answer, contexts=tuple(_context(d) for d in documents),
                     metadata=tags, **_expectations(trace))


def _scored_before(trace, suite: Suite, fingerprint: str) -> set[str]:
    """The suite's metrics (display names) the trace carries our Feedback of, by this judge."""
    by_key = {m.key: m for m in suite.metrics}
    done = set()
    for assessment in _assessments(trace):
        metric = by_key.get(assessment.name)
        meta = assessment.metadata or {}
        if metric is None or getattr(assessment, "feedback", None) is None or getattr(assessment, "valid", True) is False:
            continue
        if meta.get("rag_eval.metric_version") != str(metric.version):
            continue
        wanted = fingerprint if metric.primitives else None
        if meta.get("rag_eval.judge_fingerprint") == wanted:
            done.add(metric.display_name)
    return done


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
    #: metric display names the trace carries our Feedback of
    done: set[str]


@dataclass
class _Reading:
    """What reading the experiment found: the candidates to score, the counts, the window."""

    candidates: list[_Candidate] = field(default_factory=list)
    read: int = 0
    skipped: Counter = field(default_factory=Counter)
    newest_ms: int | None = None
    #: the oldest trace still in progress: the checkpoint stays before it
    oldest_in_progress_ms: int | None = None


def _pages(client, experiment_id: str, filter_string: str | None, page_size: int) -> Iterator[list]:
    token = None
    while True:
        traces, token = _search_page(client, experiment_id, filter_string, token, page_size)
        yield traces
        if not token or not traces:
            return


def _read(client, experiment_id: str, filter_string: str | None, suite: Suite, fingerprint: str, *,
          sample: int | None, fraction: float | None, seed: int, page_size: int) -> _Reading:
    """Every matching trace, page by page, sampled and turned into a candidate or a counted skip."""
    reading, heap = _Reading(), []  # heap: the ``sample`` candidates with the smallest keys, negated
    for traces in _pages(client, experiment_id, filter_string, page_size):
        for trace in traces:
            reading.read += 1
            ts = int(trace.info.request_time)
            if _is_in_progress(trace):
                reading.skipped["still in progress"] += 1
                reading.oldest_in_progress_ms = min(ts, reading.oldest_in_progress_ms or ts)
                continue
            reading.newest_ms = max(ts, reading.newest_ms or ts)
            if ROW_METADATA in (trace.info.trace_metadata or {}):
                reading.skipped["a row trace of an evaluation run"] += 1
                continue
            key = _sample_key(trace.info.trace_id, seed)
            if fraction is not None and key >= fraction:
                reading.skipped["not in the sample"] += 1
                continue
            try:
                record = record_from_trace(trace)
            except UnreadableTrace as exc:
                reading.skipped[f"unreadable: {exc.reason}"] += 1
                continue
            root = _root_span(trace)
            candidate = _Candidate(trace.info.trace_id, ts, record, root.span_id,
                                   _scored_before(trace, suite, fingerprint))
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


def _new_checkpoint(reading: _Reading, unscored: Sequence[_Candidate], old: int | None) -> int | None:
    """The newest trace time the run dealt with: before the first trace it left unscored (the
    budget) and before any still in progress; never earlier than the last checkpoint."""
    limits = [reading.newest_ms]
    if unscored:
        limits.append(unscored[0].timestamp_ms - 1)
    if reading.oldest_in_progress_ms is not None:
        limits.append(reading.oldest_in_progress_ms - 1)
    limits = [x for x in limits if x is not None]
    new = min(limits) if limits else None
    return max(x for x in (new, old) if x is not None) if (new is not None or old is not None) else None


def _combined_filter(filter_string: str | None, since_ms: int | None) -> str | None:
    parts = [f"({filter_string})" if filter_string else None, f"timestamp_ms > {since_ms}" if since_ms is not None else None]
    parts = [p for p in parts if p]
    return " AND ".join(parts) if parts else None


# --------------------------------------------------------------------------- scoring in place


class _Scorer:
    """Scores the candidates a share at a time, each trace by the metrics it lacks, and puts
    every verdict on its trace at once (what was scored stays scored if the run stops)."""

    def __init__(self, suite: Suite, budget: Budget, client, run_id: str, progress: bool):
        self.suite, self.budget, self.client, self.run_id, self.progress = suite, budget, client, run_id, progress
        self.rows: dict[str, list[RowResult]] = {m.display_name: [] for m in suite.metrics}
        self.scored: list[_Candidate] = []
        self.timings: dict[str, float] = {m.display_name: 0.0 for m in suite.metrics}

    def score(self, candidates: Sequence[_Candidate], row_costs: Sequence[float], share: int) -> list[_Candidate]:
        """Score every share the budget allows; returns the candidates left unscored."""
        for start in range(0, len(candidates), share):
            chunk = candidates[start : start + share]
            if not self.budget.allows(sum(row_costs[start : start + share]), len(candidates) - start):
                return list(candidates[start:])
            self._score_share(chunk)
        return []

    def _score_share(self, chunk: Sequence[_Candidate]) -> None:
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
        feedback = []
        for metric in self.suite.metrics:
            result = _metric_result(metric, [r or RowResult.not_applicable(ALREADY_SCORED) for r in rows[metric.display_name]])
            self.rows[metric.display_name] += result.rows
            for c, row in zip(chunk, result.rows):
                made = row_feedback(result, row, judge=info if metric.primitives else None, trace_id=c.trace_id,
                                    span_id=c.span_id, run_id=self.run_id)
                if made is not None:  # None: not applicable (or scored before)
                    feedback.append(made)
        log_assessments(self.client, feedback)
        self.scored += chunk


def _metric_result(metric: Metric, rows: Sequence[RowResult]) -> MetricResult:
    return MetricResult(name=metric.display_name, spec=metric.spec(), rows=tuple(rows),
                        greater_is_better=metric.greater_is_better, judged=bool(metric.primitives), seed=SEED)


# --------------------------------------------------------------------------- the route


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

    def summary_text(self) -> str:
        lines = [f"traces: {self.read} read, {len(self.scored)} scored in place"
                 + (f" (run {self.run_id})" if self.run_id else " (no run: nothing to score)")]
        for reason, n in sorted(self.skipped.items(), key=lambda kv: -kv[1]):
            lines.append(f"  {n:>6} not scored: {reason}")
        if self.budget.stopped:
            lines.append(f"  stopped: {self.budget.stopped}")
        return "\n".join(lines)


def _experiment_id(client, experiment: str) -> str:
    found = client.get_experiment_by_name(experiment)
    if found is not None:
        return found.experiment_id
    if str(experiment).isdigit():
        return client.get_experiment(str(experiment)).experiment_id
    raise ValueError(f"no experiment named {experiment!r} (give its name or id)")


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
    sample: int | None = None,
    sample_fraction: float | None = None,
    max_cost: float | None = None,
    slice_by: Sequence[str] = (),
    run_name: str | None = None,
    page_size: int = PAGE_SIZE,
    progress: bool | None = None,
    seed: int = 0,
    client: MlflowClient | None = None,
) -> TracesEvaluation:
    """Score the traces of ``experiment`` (a name or id) in place (see the module docstring).

    Args:
        metrics: metric names (default: the suite the traces can feed, expectations included).
        judge: a judge name or object (default ``local:minilm-l6``).
        filter_string: a ``search_traces`` filter, e.g. ``"tags.env = 'prod'"``.
        since: only traces started after this (epoch ms, ISO 8601, or ``24h``-like durations).
        since_last: only traces after the checkpoint of the last run with the same filter,
            metrics and judge (all of them when there is none); exclusive with ``since``.
        sample, sample_fraction: score at most ``sample`` traces, or this share of them,
            chosen by a hash of the trace id (a rerun draws the same ones).
        max_cost: US dollars the judge may cost at most (:mod:`mlflow_rag_eval.evaluation.budget`).
        slice_by: trace tags to report every metric per value of.
    """
    client = client or MlflowClient()
    _check_arguments(since, since_last, sample, sample_fraction, page_size)
    slice_by = check_slice_by(list(slice_by) or None, "slice_by")
    experiment_id = _experiment_id(client, experiment)
    suite = prepare_suite(metrics, judge, set(ALL_FIELDS))
    info = suite.judge.info() if suite.judge is not None else no_judge()
    tag = checkpoint_tag(filter_string, metrics, info)
    old = _read_checkpoint(client, experiment_id, tag)
    since_ms = old if since_last else parse_since(since)
    reading = _read(client, experiment_id, _combined_filter(filter_string, since_ms), suite, info.fingerprint,
                    sample=sample, fraction=sample_fraction, seed=seed, page_size=page_size)
    todo, done = _prepare(suite, reading, slice_by)
    for metric in suite.metrics:
        metric.validate([c.record for c in todo], ColumnMapping())
    budget = Budget(max_cost)
    estimate = estimate_cost(suite.metrics, [c.record for c in todo], suite.judge, done=done)
    budget.check(estimate, judge=suite.judge)  # BudgetExceeded: before any judge call, nothing written
    outcome = TracesEvaluation(experiment_id, None, reading.read, [], dict(reading.skipped), estimate, budget, tag,
                               old, since_ms)
    if todo:
        _score_into_run(outcome, client, suite, todo, reading, slice_by, run_name, page_size, progress,
                        filter_string=filter_string)
    outcome.checkpoint_ms = _new_checkpoint(reading, todo[len(outcome.scored):], old)
    if outcome.checkpoint_ms is not None and outcome.checkpoint_ms != old:
        client.set_experiment_tag(experiment_id, tag, str(outcome.checkpoint_ms))
    print(outcome.summary_text(), file=sys.stderr)
    return outcome


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
                    slice_by, run_name, page_size: int, progress, *, filter_string) -> None:
    """Start the evaluation run, score the candidates into it, log what was scored."""
    from mlflow_rag_eval._util.progress import progress_wanted

    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M")
    run = client.create_run(outcome.experiment_id, run_name=run_name or f"traces {stamp}")
    run_id = outcome.run_id = run.info.run_id
    try:
        scorer = _Scorer(suite, outcome.budget, client, run_id, progress_wanted(progress))
        unscored = scorer.score(todo, outcome.estimate.row_costs, page_size)
        if unscored:
            outcome.skipped["not scored: the budget was reached"] = len(unscored)
        outcome.scored = [c.trace_id for c in scorer.scored]
        outcome.result = _result(suite, scorer)
        _log_run(outcome, client, filter_string, slice_by, reading)
        link_traces(client, outcome.scored, run_id)
        announce(outcome.result)
    except BaseException:
        client.set_terminated(run_id, RunStatus.to_string(RunStatus.FAILED))
        raise
    client.set_terminated(run_id)


def _result(suite: Suite, scorer: _Scorer) -> EvaluationResult:
    records = [c.record for c in scorer.scored]
    judge = suite.judge
    return EvaluationResult(
        records=records,
        metrics=[_metric_result(m, scorer.rows[m.display_name]) for m in suite.metrics],
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


def _log_run(outcome: TracesEvaluation, client, filter_string, slice_by, reading: _Reading) -> None:
    params = {"rag_eval.traces.experiment_id": outcome.experiment_id,
              "rag_eval.traces.filter": filter_string or "",
              "rag_eval.traces.since_ms": "" if outcome.since_ms is None else str(outcome.since_ms),
              "rag_eval.traces.n_scored": str(len(outcome.scored)),
              "rag_eval.traces.digest": traces_digest(outcome.scored),
              "rag_eval.traces.checkpoint_tag": outcome.checkpoint_tag}
    client.log_batch(outcome.run_id, params=[Param(k, v[:6000]) for k, v in params.items()])
    log_run_contents(outcome.result, outcome.run_id, client, trace_ids=outcome.scored, slice_by=slice_by,
                     tags={**outcome.budget.run_tags(), "rag_eval.route": "traces"})
    client.log_text(outcome.run_id, json.dumps({"trace_ids": outcome.scored, "read": reading.read,
                                                "skipped": outcome.skipped}, indent=1), TRACES_FILE)
