"""Evaluated rows as MLflow traces with assessments: what MLflow 3's evaluation UI reads.

Per row, one trace linked to the evaluation run (trace metadata ``mlflow.sourceRun`` and a run
link) and, when a logged model was evaluated, to that model (``mlflow.modelId``):

- a root span ``rag_pipeline`` (inputs ``{"question"}``, outputs ``{"answer"}``) with a child
  RETRIEVER span ``retrieve`` whose outputs are the contexts as MLflow ``Document``\\ s
  (``page_content``, ``metadata.doc_uri`` = the context id, ``metadata.rank``), the shape
  MLflow's own RAG scorers read;
- per metric, a ``Feedback`` on the root span: name = the metric key (``ndcg_at_10``, as in the
  metric keys; ``<key>/<judge name>`` on a trace another judge scored already,
  :func:`feedback_name`), value = the row's score, rationale = the justification, compact evidence in
  metadata, ``error`` (and no value) when the judge could not decide, source LLM_JUDGE (the
  judge's name; its fingerprint in metadata) or CODE for metrics that need no judge. A row a
  metric does not apply to gets no Feedback for it: MLflow's UI shows a valueless Feedback as
  a red "Error", and "not applicable" is not an error;
- the expectations (``reference``, ``relevant_ids``, ``answerable``, ``reference_contexts``)
  as ``Expectation``\\ s.

Every text a row's trace carries (span inputs and outputs, hence the request and response
previews; rationales, evidence, expectations) goes through the one redactor
(:mod:`mlflow_rag_eval._util.redaction`), as the rows table does: a key pasted into a question
is ``***`` in the store, not only in the table.

Writing: MLflow has no batch call for trace infos, so each new trace is one ``start_trace``
call that carries all of its assessments (not one call per assessment, as
``mlflow.log_feedback`` would need); spans go through ``log_spans`` a thousand rows at a time,
and run links in batches of 100 (MLflow's limit). Traces the pipeline itself produced (``@mlflow.trace``,
autologging) are the rows' traces instead of synthetic ones: their assessments are added with
``create_assessment`` (no batch call exists for an existing trace). The plugin route writes a
batch's new traces while the engine judges the next batches (:class:`RowTraceStream`).
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from mlflow.entities import (
    AssessmentError,
    AssessmentSource,
    AssessmentSourceType,
    Expectation,
    Feedback,
    SpanType,
    TraceInfo,
    TraceLocation,
    TraceState,
)
from mlflow.entities.span import Span
from mlflow.entities.trace_data import TraceData
from mlflow.tracing.constant import (
    TRACE_SCHEMA_VERSION,
    TRACE_SCHEMA_VERSION_KEY,
    AssessmentMetadataKey,
    SpanAttributeKey,
    TraceMetadataKey,
    TraceTagKey,
)
from mlflow.tracing.utils import TraceJSONEncoder, generate_mlflow_trace_id_from_otel_trace_id
from mlflow.tracing.utils.truncation import set_request_response_preview
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanContext, Status, StatusCode, TraceFlags

from mlflow_rag_eval._util.mlflow_compat import batch_get_traces, log_spans
from mlflow_rag_eval._util.progress import Progress
from mlflow_rag_eval._util.redaction import redact, redact_json_text, redact_strings
from mlflow_rag_eval._util.writer import InOrderWriter
from mlflow_rag_eval.evaluation.engine import no_judge
from mlflow_rag_eval.judges import JudgeInfo
from mlflow_rag_eval.records import RagRecord
from mlflow_rag_eval.results import MetricResult, RowResult, error_kind
from mlflow_rag_eval.stats import SEED

__all__ = [
    "EXPECTATION_FIELDS",
    "ROOT_SPAN",
    "RETRIEVER_SPAN",
    "ROW_METADATA",
    "RowTraceStream",
    "assessment_source",
    "compact_evidence",
    "feedback_name",
    "link_traces",
    "log_assessments",
    "log_assessments_on_live_traces",
    "log_row_traces",
    "row_expectations",
    "row_feedback",
]

ROOT_SPAN = "rag_pipeline"
RETRIEVER_SPAN = "retrieve"
#: trace metadata key holding the row's 0-based position in the evaluated data
ROW_METADATA = "rag_eval.row"
#: record fields logged as Expectations, when the data provided them
EXPECTATION_FIELDS = ("reference", "relevant_ids", "answerable", "reference_contexts")
#: MLflow refuses more run links per call
LINKS_PER_CALL = 100
#: rows whose traces are built and written together (one log_spans call: two spans a row)
ROWS_PER_CHUNK = 1000
SPANS_PER_CALL = 2 * ROWS_PER_CHUNK
#: finished batches a RowTraceStream holds for its writer before the engine waits for it: room
#: for the writer to lag a little behind the judge, never the whole run in memory
BATCHES_QUEUED = 4
#: evidence kept in a Feedback's metadata (the full evidence is in the table artifact)
EVIDENCE_CHARS = 4000
_TEXT_CHARS = 300


# --------------------------------------------------------------------------- assessments


def assessment_source(judge: JudgeInfo | None) -> AssessmentSource:
    """LLM_JUDGE named by the judge for judged metrics; CODE for metrics that need no judge."""
    if judge is None or judge.kind == "none":
        return AssessmentSource(source_type=AssessmentSourceType.CODE, source_id="mlflow_rag_eval")
    return AssessmentSource(source_type=AssessmentSourceType.LLM_JUDGE, source_id=judge.name)


def _short(value: Any) -> Any:
    if isinstance(value, str) and len(value) > _TEXT_CHARS:
        return value[: _TEXT_CHARS - 1] + "…"
    return value


def _json_default(value: Any) -> Any:
    item = getattr(value, "item", None)  # numpy scalars
    return item() if callable(item) else str(value)


def compact_evidence(details: Mapping[str, Any], limit: int = EVIDENCE_CHARS) -> str | None:
    """The row's evidence as JSON of at most ``limit`` characters: texts shortened, and the
    list items that do not fit dropped from the end, their number in ``<list>_more``. The
    full evidence stays in the run's table artifact."""
    if not details:
        return None
    compact: dict[str, Any] = {}
    for key, value in details.items():
        if isinstance(value, list):
            compact[key] = [
                {k: _short(v) for k, v in item.items()} if isinstance(item, Mapping) else _short(item)
                for item in value
            ]
        else:
            compact[key] = _short(value)
    text = json.dumps(compact, default=_json_default, ensure_ascii=False)
    if len(text) <= limit:
        return text
    for key in [k for k, v in compact.items() if isinstance(v, list)]:
        items = compact[key]
        while items and len(text) > limit:
            items.pop()
            compact[f"{key}_more"] = compact.get(f"{key}_more", 0) + 1
            text = json.dumps(compact, default=_json_default, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _error(row: RowResult) -> AssessmentError:
    return AssessmentError(error_code=error_kind(row.error), error_message=row.error or "unknown error")


def feedback_name(metric_key: str, judge: JudgeInfo | None, assessments: Iterable = ()) -> str:
    """The name of a metric's Feedback on a trace already carrying ``assessments``: the metric
    key, unless another judge's Feedback of this package sits under that name (a trace scored
    again with another judge): then ``<metric key>/<judge name>``, so that MLflow's UI, which
    averages the Feedback of one name, keeps each judge's values apart. Metrics that need no
    judge are the same whoever scores them: always the key."""
    if judge is None or judge.kind == "none":
        return metric_key
    for assessment in assessments:
        metadata = getattr(assessment, "metadata", None) or {}
        if (getattr(assessment, "name", None) == metric_key and "rag_eval.metric" in metadata
                and getattr(assessment, "valid", True) is not False
                and metadata.get("rag_eval.judge_fingerprint") not in (None, judge.fingerprint)):
            return f"{metric_key}/{judge.name}"
    return metric_key


def row_feedback(
    metric: MetricResult,
    row: RowResult,
    *,
    judge: JudgeInfo | None,
    trace_id: str | None = None,
    span_id: str | None = None,
    run_id: str | None = None,
    name: str | None = None,
) -> Feedback | None:
    """The Feedback for one metric on one row; None when the metric does not apply to it.

    Every route builds its Feedback here, so the same row gives the same assessment whether
    the rag evaluator, a genai scorer or the CLI computed it. ``name``: the Feedback's name
    when not the metric key (:func:`feedback_name`, on a trace another judge scored).
    """
    if row.status == "skipped":
        return None
    needs_judge = judge is not None and judge.kind != "none"
    metadata = {
        "rag_eval.metric": metric.name,
        "rag_eval.metric_version": str(metric.spec.get("version", "")),
    }
    if needs_judge:
        metadata["rag_eval.judge_fingerprint"] = judge.fingerprint
        metadata["rag_eval.prompts_version"] = judge.prompts_version
    evidence = compact_evidence(row.details)
    if evidence:
        metadata["rag_eval.evidence"] = redact(evidence)
    if row.details.get("support") is not None:
        metadata["rag_eval.support"] = repr(float(row.details["support"]))
    if run_id is not None:
        metadata[AssessmentMetadataKey.SOURCE_RUN_ID] = run_id
    failed = row.status == "error"
    return Feedback(
        name=name or metric.key,
        value=None if failed else row.value,
        error=_error(row) if failed else None,
        rationale=redact(row.justification or "") or None if not failed else None,
        source=assessment_source(judge if needs_judge else None),
        trace_id=trace_id,
        span_id=span_id,
        metadata=metadata,
    )


def _expectation_value(record: RagRecord, field: str) -> Any:
    value = getattr(record, field)
    if field == "relevant_ids" and value is not None:
        return {str(k): (int(v) if float(v).is_integer() else float(v)) for k, v in value.items()}
    if field == "reference_contexts" and value is not None:
        return list(value)
    return value


def row_expectations(
    record: RagRecord,
    fields: Iterable[str],
    *,
    dataset_digest: str,
    trace_id: str | None = None,
    run_id: str | None = None,
) -> list[Expectation]:
    """The row's expectations from the golden data: HUMAN-sourced, named after the field."""
    source = AssessmentSource(source_type=AssessmentSourceType.HUMAN, source_id=f"dataset:{dataset_digest}")
    metadata = {AssessmentMetadataKey.SOURCE_RUN_ID: run_id} if run_id else None
    out = []
    for field in EXPECTATION_FIELDS:
        if field not in fields:
            continue
        value = _expectation_value(record, field)
        if value is None:
            continue
        out.append(Expectation(name=field, value=redact_strings(value), source=source, trace_id=trace_id, metadata=metadata))
    return out


# --------------------------------------------------------------------------- spans


def _context(trace_id: int, span_id: int) -> SpanContext:
    return SpanContext(trace_id=trace_id, span_id=span_id, is_remote=False, trace_flags=TraceFlags(1))


def _span(trace_id: str, otel_trace_id: int, span_id: int, parent_id: int | None, name: str, span_type: str,
          inputs: Any, outputs: Any, start_ns: int, end_ns: int) -> Span:
    # An MLflow Span is an immutable OpenTelemetry span whose attributes are JSON strings
    # (MLflow's own Span.from_dict builds it the same way).
    attributes = {
        SpanAttributeKey.REQUEST_ID: json.dumps(trace_id),
        SpanAttributeKey.SPAN_TYPE: json.dumps(span_type),
        # Through the redactor, as the rows table: the trace's previews are made from these.
        SpanAttributeKey.INPUTS: redact_json_text(json.dumps(inputs, cls=TraceJSONEncoder, ensure_ascii=False)),
        SpanAttributeKey.OUTPUTS: redact_json_text(json.dumps(outputs, cls=TraceJSONEncoder, ensure_ascii=False)),
    }
    otel = ReadableSpan(
        name=name,
        context=_context(otel_trace_id, span_id),
        parent=_context(otel_trace_id, parent_id) if parent_id is not None else None,
        attributes=attributes,
        start_time=start_ns,
        end_time=end_ns,
        status=Status(StatusCode.OK),
        # Without one, OpenTelemetry detects a resource per span, on a thread pool: 1 ms a span.
        resource=Resource.get_empty(),
    )
    return Span(otel)


def _documents(record: RagRecord) -> list[dict[str, Any]]:
    """The contexts as MLflow ``Document`` dicts (what ``Document.to_dict`` gives, built directly:
    ``dataclasses.asdict`` costs a third of a trace's build time)."""
    docs = []
    for rank, context in enumerate(record.contexts, start=1):
        metadata: dict[str, Any] = {"rank": rank}
        if context.id is not None:
            metadata["doc_uri"] = context.id
        docs.append({"page_content": context.text, "metadata": metadata, "id": context.id})
    return docs


def _row_trace(
    record: RagRecord, row: int, *, experiment_id: str, run_id: str, model_id: str | None, now_ns: int
) -> tuple[TraceInfo, list[Span]]:
    otel_trace_id = secrets.randbits(128) or 1
    trace_id = generate_mlflow_trace_id_from_otel_trace_id(otel_trace_id)
    root_id, retriever_id = secrets.randbits(64) or 1, secrets.randbits(64) or 2
    inputs, outputs = {"question": record.question}, {"answer": record.answer}
    # The row's duration is the pipeline's, when the data says it (record.latency_ms): the root
    # span lasts that long, ending now. Else (a batch prediction times no row) every span carries
    # the same instant rather than an invented duration. How the retrieval's share of it went is
    # unknown either way: its span is the root's first instant.
    duration_ns = round(record.latency_ms * 1_000_000) if record.latency_ms is not None else 0
    start_ns = now_ns - duration_ns
    root = _span(trace_id, otel_trace_id, root_id, None, ROOT_SPAN, SpanType.CHAIN, inputs, outputs, start_ns, now_ns)
    retriever = _span(trace_id, otel_trace_id, retriever_id, root_id, RETRIEVER_SPAN, SpanType.RETRIEVER,
                      {"query": record.question}, _documents(record), start_ns, start_ns)
    metadata = {
        TRACE_SCHEMA_VERSION_KEY: str(TRACE_SCHEMA_VERSION),
        TraceMetadataKey.SOURCE_RUN: run_id,
        ROW_METADATA: str(row),
    }
    if model_id:
        metadata[TraceMetadataKey.MODEL_ID] = model_id
    info = TraceInfo(
        trace_id=trace_id,
        trace_location=TraceLocation.from_experiment_id(experiment_id),
        request_time=start_ns // 1_000_000,
        state=TraceState.OK,
        execution_duration=duration_ns // 1_000_000,
        trace_metadata=metadata,
        tags={TraceTagKey.TRACE_NAME: ROOT_SPAN},
    )
    set_request_response_preview(info, TraceData(spans=[root, retriever]))
    return info, [root, retriever]


# --------------------------------------------------------------------------- writing


def _row_assessments(result, i: int, *, trace_id: str, span_id: str | None, run_id: str,
                     existing: Iterable = ()) -> list:
    """Row ``i``'s Feedbacks (one per metric that applies) and Expectations; ``existing``: the
    assessments the trace carries already (a pipeline's trace evaluated before)."""
    out: list = []
    existing = list(existing)
    for metric in result.metrics:
        judge = result.judge if metric.judged else None
        feedback = row_feedback(metric, metric.rows[i], judge=judge, trace_id=trace_id, span_id=span_id,
                                run_id=run_id, name=feedback_name(metric.key, judge, existing))
        if feedback is not None:
            out.append(feedback)
    out += row_expectations(result.records[i], result.fields, dataset_digest=result.dataset_digest,
                            trace_id=trace_id, run_id=run_id)
    return out


def _is_rest(tracing_client) -> bool:
    from mlflow.store.tracking.rest_store import RestStore

    return isinstance(tracing_client.store, RestStore)


def log_row_traces(
    result,
    run_id: str,
    client,
    *,
    experiment_id: str,
    model_id: str | None = None,
    existing: Sequence[str | None] | None = None,
    progress: bool = False,
    written: Mapping[int, str] | None = None,
) -> list[str]:
    """Log one trace per row of ``result`` (an engine EvaluationResult) with its assessments.

    Args:
        existing: per row, the id of a trace the pipeline already produced for it (its
            assessments are added to that trace), or None for a trace written here.
        progress: a bar on stderr, a step per trace written (cleared when done).
        written: the rows whose traces a :class:`RowTraceStream` wrote during the scoring,
            by row: their trace ids are taken as they are (and linked to the run here).

    Returns:
        The trace id of every row, in row order.
    """
    tracing = client._tracing_client  # MlflowClient's own tracing client: same store, same URI
    n = len(result.records)
    existing = list(existing) if existing is not None else [None] * n
    written = written or {}
    now_ns = time.time_ns()
    trace_ids: list[str] = [written.get(i, "") for i in range(n)]
    new_rows = [i for i in range(n) if not existing[i] and i not in written]
    bar = Progress(len(new_rows), shown=progress, description="rag eval traces", unit="trace")
    try:
        _write_row_traces(result, new_rows, trace_ids, tracing, bar, experiment_id=experiment_id, run_id=run_id,
                          model_id=model_id, now_ns=now_ns)
    finally:
        bar.close()  # gone before the summary
    pipeline_rows = [i for i in range(n) if existing[i]]
    if pipeline_rows:
        _assess_pipeline_traces(result, pipeline_rows, existing, tracing, run_id)
        for i in pipeline_rows:
            trace_ids[i] = existing[i]
    _link(client, trace_ids, run_id)
    return trace_ids


def _write_row_traces(result, new_rows: list[int], trace_ids: list[str], tracing, bar: Progress, *,
                      experiment_id: str, run_id: str, model_id: str | None, now_ns: int, first: int = 0) -> None:
    # In chunks of rows, so memory stays bounded whatever the row count: build the chunk's
    # traces, write their infos (one call each, carrying the assessments), then their spans.
    # ``first``: the row of the data that is ``result``'s row 0 (a batch of a streamed run).
    for start in range(0, len(new_rows), ROWS_PER_CHUNK):
        infos: list[TraceInfo] = []
        spans: list[Span] = []
        for i in new_rows[start : start + ROWS_PER_CHUNK]:
            info, row_spans = _row_trace(result.records[i - first], i, experiment_id=experiment_id, run_id=run_id,
                                         model_id=model_id, now_ns=now_ns)
            info.assessments = _row_assessments(result, i - first, trace_id=info.trace_id,
                                                span_id=row_spans[0].span_id, run_id=run_id)
            trace_ids[i] = info.trace_id
            infos.append(info)
            spans += row_spans
        # Over HTTP the calls overlap; a local store (sqlite) serialises writes, so threads
        # would only contend for its lock.
        if _is_rest(tracing):
            with ThreadPoolExecutor(max_workers=8, thread_name_prefix="rag_eval_traces") as pool:
                for _ in pool.map(tracing.start_trace, infos):
                    bar.advance(1)
        else:
            for info in infos:
                tracing.start_trace(info)
                bar.advance(1)
        _log_spans(tracing, experiment_id, spans, infos)


@dataclass(frozen=True)
class _Batch:
    """A finished batch of a run still being scored, read as :func:`_row_assessments` reads a result."""

    records: Sequence[RagRecord]
    metrics: list[MetricResult]
    judge: JudgeInfo
    fields: frozenset[str]
    dataset_digest: str


def _feedback_judge(judge: JudgeInfo | None) -> tuple | None:
    """What of the judge a Feedback carries (:func:`row_feedback`, :func:`assessment_source`)."""
    return None if judge is None else (judge.kind, judge.name, judge.fingerprint, judge.prompts_version)


class RowTraceStream:
    """The rows' traces written batch by batch while the engine judges the next batches (the
    engine's ``on_batch``): with an LLM judge, writing a row's trace (one ``start_trace`` a
    row, about 10 ms on sqlite; 10 s of a 1,000-row evaluation's 31 s) overlaps the judge's
    calls instead of following them. The batches queue for one writer thread, in row order
    (:class:`~mlflow_rag_eval._util.writer.InOrderWriter`); the engine waits only while
    :data:`BATCHES_QUEUED` batches are (the writer then sets the pace, and what waits in memory
    stays bounded: a cached rerun judges faster than sqlite writes). What is written is what
    :func:`log_row_traces` would write for those rows after the run.

    A Feedback carries the judge's fingerprint, which an LLM judge settles only with its last
    reply (a server answering as another model, a fallback to prompt-and-parse). So
    :meth:`finish` compares each batch's judge with the run's: if one differs, the streamed
    traces are deleted and every row is written after the run, as without a stream. Rows whose
    pipeline traced them (``existing``) get their assessments after the run, as before.

    Use as a context manager around the scoring (leaving it waits for the write in flight),
    then :meth:`finish` with the result: the rows written, by row, for ``log_row_traces``.
    """

    def __init__(self, records: Sequence[RagRecord], suite, run_id: str, client, *, experiment_id: str,
                 fields: Iterable[str], dataset_digest: str, model_id: str | None = None,
                 existing: Sequence[str | None] | None = None):
        self.records, self.suite, self.run_id, self.client = records, suite, run_id, client
        self.experiment_id, self.model_id = experiment_id, model_id
        self.fields, self.dataset_digest = frozenset(fields), dataset_digest
        self.existing = list(existing) if existing is not None else [None] * len(records)
        self.trace_ids: list[str] = [""] * len(records)
        self._now_ns = time.time_ns()
        self._judges: list[tuple | None] = []
        self._writer = InOrderWriter("rag_eval_traces", in_flight=BATCHES_QUEUED)

    def __enter__(self) -> RowTraceStream:
        self._writer.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._writer.__exit__(*exc)

    def __call__(self, start: int, rows: Mapping[str, Sequence[RowResult]]) -> None:
        """The engine's ``on_batch``: hand the batch's traces to the writer thread."""
        judge = self.suite.judge.info() if self.suite.judge is not None else no_judge()
        metrics = [MetricResult(name=m.display_name, spec=m.spec(), rows=tuple(rows[m.display_name]),
                                greater_is_better=m.greater_is_better, judged=bool(m.primitives), seed=SEED)
                   for m in self.suite.metrics]
        size = len(metrics[0].rows) if metrics else 0
        batch = _Batch(self.records[start : start + size], metrics, judge, self.fields, self.dataset_digest)
        self._judges.append(_feedback_judge(judge))
        new_rows = [i for i in range(start, start + size) if not self.existing[i]]
        self._writer.submit(_write_row_traces, batch, new_rows, self.trace_ids, self.client._tracing_client,
                            Progress(0, shown=False), experiment_id=self.experiment_id, run_id=self.run_id,
                            model_id=self.model_id, now_ns=self._now_ns, first=start)

    def finish(self, result) -> dict[int, str]:
        """The rows written, by row (call after leaving the block); none when a batch's judge
        is not the run's (those traces deleted: the run writes them all)."""
        written = {i: t for i, t in enumerate(self.trace_ids) if t}
        final = _feedback_judge(result.judge)
        if all(j == final for j in self._judges):
            return written
        ids = list(written.values())
        for start in range(0, len(ids), LINKS_PER_CALL):
            self.client.delete_traces(self.experiment_id, trace_ids=ids[start : start + LINKS_PER_CALL])
        return {}


def _log_spans(tracing, experiment_id: str, spans: list[Span], infos: list[TraceInfo]) -> None:
    try:
        log_spans(tracing, experiment_id, spans)
    except NotImplementedError:
        # A store without span logging (the file store) keeps each trace's spans as an artifact.
        by_trace: dict[str, list[Span]] = {}
        for span in spans:
            by_trace.setdefault(span.trace_id, []).append(span)
        for info in infos:
            tracing._upload_trace_data(info, TraceData(spans=by_trace[info.trace_id]))


def _assess_pipeline_traces(result, rows: list[int], existing, tracing, run_id: str) -> None:
    traces = {t.info.trace_id: t for t in _get_traces(tracing, [existing[i] for i in rows])}
    assessments = []
    for i in rows:
        trace = traces.get(existing[i])
        root = trace.data._get_root_span() if trace is not None else None
        assessments += _row_assessments(result, i, trace_id=existing[i], span_id=root.span_id if root else None,
                                        run_id=run_id, existing=(trace.info.assessments or []) if trace else [])
    def log(assessment) -> None:
        tracing.log_assessment(assessment.trace_id, assessment)

    if _is_rest(tracing):  # over HTTP the calls overlap
        with ThreadPoolExecutor(max_workers=8, thread_name_prefix="rag_eval_assessments") as pool:
            list(pool.map(log, assessments))
    else:
        for assessment in assessments:
            log(assessment)


def log_assessments(client, assessments: Sequence) -> None:
    """Add ``assessments`` (each naming its ``trace_id``) to traces that exist already: one
    ``create_assessment`` call each (MLflow has no batch call), overlapping over HTTP."""
    tracing = client._tracing_client  # MlflowClient's own tracing client: same store, same URI

    def log(assessment) -> None:
        tracing.log_assessment(assessment.trace_id, assessment)

    if _is_rest(tracing) and len(assessments) > 1:
        with ThreadPoolExecutor(max_workers=8, thread_name_prefix="rag_eval_assessments") as pool:
            list(pool.map(log, assessments))
    else:
        for assessment in assessments:
            log(assessment)


def link_traces(client, trace_ids: Sequence[str], run_id: str) -> None:
    """Link traces to a run, in batches of MLflow's limit (a store that cannot link is left
    as it is: the traces' assessments still name the run)."""
    _link(client, list(trace_ids), run_id)


def _get_traces(tracing, trace_ids: list[str]) -> list:
    out = []
    for start in range(0, len(trace_ids), 100):
        out += batch_get_traces(tracing, trace_ids[start : start + 100])
    return out


def _link(client, trace_ids: list[str], run_id: str) -> None:
    for start in range(0, len(trace_ids), LINKS_PER_CALL):
        batch = trace_ids[start : start + LINKS_PER_CALL]
        try:
            client.link_traces_to_run(batch, run_id=run_id)
        except Exception as exc:  # the file store cannot link; mlflow.sourceRun still does
            if "not supported" in str(exc):
                return
            raise


def _trace_exists(tracing, trace_id: str) -> bool:
    try:
        tracing.get_trace_info(trace_id)
    except Exception:  # noqa: BLE001 - RESOURCE_DOES_NOT_EXIST on every store, worded differently
        return False
    return True


def log_assessments_on_live_traces(client, by_trace: Mapping[str, Sequence]) -> set[str]:
    """Add each trace's assessments to it (as :func:`log_assessments`), and return the traces
    that were deleted before theirs were written: a trace deleted meanwhile (a retention job)
    is skipped, never the run's failure. A write that fails on a trace that still exists raises."""
    tracing = client._tracing_client

    def write(item) -> str | None:
        trace_id, assessments = item
        for assessment in assessments:
            try:
                tracing.log_assessment(trace_id, assessment)
            except Exception:
                if _trace_exists(tracing, trace_id):
                    raise
                return trace_id
        return None

    items = [(t, a) for t, a in by_trace.items() if a]
    if _is_rest(tracing) and len(items) > 1:
        with ThreadPoolExecutor(max_workers=8, thread_name_prefix="rag_eval_assessments") as pool:
            gone = list(pool.map(write, items))
    else:
        gone = [write(item) for item in items]
    return {t for t in gone if t is not None}
