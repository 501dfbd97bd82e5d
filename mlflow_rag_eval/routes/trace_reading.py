"""A production trace as a :class:`~mlflow_rag_eval.records.RagRecord`, and what it was judged
on before (the reading half of :mod:`~mlflow_rag_eval.routes.production_traces`).

- question and answer from the root span's inputs and outputs, in their common shapes (a
  string; ``{"question"|"query"|"input"|"prompt": ...}``; chat ``{"messages": [...]}``, the last
  user message; outputs ``{"answer"|"output"|"response"|"result"|"text"|"content": ...}`` or
  OpenAI's ``{"choices": [{"message": {"content"}}]}``);
- the contexts from one RETRIEVER span, by this rule: among the RETRIEVER spans that have no
  RETRIEVER span above them (an outer retriever's output is what it made of the inner ones: a
  hybrid retriever's merge, a reranker wrapping its base), the last to end (a reranker run
  after a retriever, as its sibling: its order is the ranking the generator was given). Its
  outputs are MLflow ``Document``\\ s, ``page_content`` the text and ``metadata.doc_uri`` (else
  the document's ``id``) the id, ``metadata.parent_id`` the parent;
- expectations from the trace's valid ``Expectation`` assessments (the newest of each name),
  checked by the same reader as the data route's columns
  (:func:`~mlflow_rag_eval.records.expectation_fields`): a bad one makes the trace unreadable,
  with the reason;
- the trace's own tags (not ``mlflow.*``) as the record's metadata, for ``slice_by``.

What a trace was judged on before (:func:`prior_verdicts`): a metric is done on a trace that
carries a valid Feedback of it by the same judge fingerprint and metric version, or one a person
gave (source HUMAN) or an override of it by anyone but this package (``mlflow.override_feedback``):
a reviewer's correction is never scored over. A Feedback with an error is not done: the trace
is scored again, the new Feedback overriding the failed one (which MLflow then marks invalid).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mlflow.entities import AssessmentSourceType, SpanType

from mlflow_rag_eval.evaluation.suite import Suite
from mlflow_rag_eval.records import Context, RagRecord, RecordError, expectation_fields

__all__ = ["Prior", "UnreadableTrace", "prior_verdicts", "record_from_trace", "root_span"]


class UnreadableTrace(ValueError):
    """A trace that is no RAG request this module can read; ``reason`` is what is counted.
    ``retry``: the trace may read differently later (its Expectations can be corrected), so a
    run reads it again rather than leaving it behind its checkpoint."""

    def __init__(self, reason: str, *, retry: bool = False):
        self.reason = reason
        self.retry = retry
        super().__init__(reason)


def root_span(trace):
    return next((s for s in trace.data.spans if s.parent_id is None), None)


def _assessments(trace) -> list:
    return list(trace.info.assessments or [])


def _feeding_retriever(trace):
    """The RETRIEVER span whose documents the answer was given (see the module docstring)."""
    spans = {s.span_id: s for s in trace.data.spans}

    def under_a_retriever(span) -> bool:
        parent, seen = spans.get(span.parent_id), set()
        while parent is not None and parent.span_id not in seen:
            if parent.span_type == SpanType.RETRIEVER:
                return True
            seen.add(parent.span_id)
            parent = spans.get(parent.parent_id)
        return False

    outer = [s for s in spans.values() if s.span_type == SpanType.RETRIEVER and not under_a_retriever(s)]
    return max(outer, key=lambda s: (s.end_time_ns or 0, s.start_time_ns or 0), default=None)


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


def _expectations(trace) -> dict[str, Any]:
    """The record fields the trace's valid Expectations give (the newest of each name), read
    by the data route's rules; :class:`UnreadableTrace` (to retry) naming the bad one."""
    newest: dict[str, Any] = {}
    expectations = [a for a in _assessments(trace)
                    if getattr(a, "expectation", None) is not None and getattr(a, "valid", True) is not False]
    for assessment in sorted(expectations, key=lambda a: (a.create_time_ms or 0, a.assessment_id or "")):
        newest[assessment.name] = assessment.value
    try:
        return expectation_fields(newest)
    except RecordError as exc:
        raise UnreadableTrace(f"its Expectation {exc.column!r} is invalid: {exc.reason}", retry=True) from None


def record_from_trace(trace) -> RagRecord:
    """The record a trace holds (see the module docstring); :class:`UnreadableTrace` naming
    why when it holds none."""
    root = root_span(trace)
    if root is None:  # its spans may not have landed yet: read it again next time
        raise UnreadableTrace("no root span", retry=True)
    question, answer = _question(root.inputs), _answer(root.outputs)
    if not question or not question.strip():
        raise UnreadableTrace("no question in the root span's inputs")
    if answer is None:
        raise UnreadableTrace("no answer in the root span's outputs")
    retriever = _feeding_retriever(trace)
    if retriever is None:
        raise UnreadableTrace("no RETRIEVER span")
    documents = retriever.outputs
    if documents is None:
        documents = []
    if not isinstance(documents, list):
        raise UnreadableTrace("the RETRIEVER span's outputs are not a list of documents")
    tags = {k: v for k, v in (trace.info.tags or {}).items() if not k.startswith("mlflow.")}
    return RagRecord(question=question, answer=answer, contexts=tuple(_context(d) for d in documents),
                     metadata=tags, **_expectations(trace))


@dataclass
class Prior:
    """What a trace was judged on before, per metric (display names)."""

    #: metrics not to score again: our valid Feedback, or a person's verdict
    done: set[str] = field(default_factory=set)
    #: of those, the ones a person decided (HUMAN Feedback or an override)
    by_person: set[str] = field(default_factory=set)
    #: metric -> the id of our failed Feedback, which the new one overrides
    failed: dict[str, str] = field(default_factory=dict)


def _ours(assessment) -> bool:
    return "rag_eval.metric" in (assessment.metadata or {})


def prior_verdicts(trace, suite: Suite, fingerprint: str) -> Prior:
    """What ``trace`` was judged on before by the suite's metrics (see the module docstring)."""
    by_key = {m.key: m for m in suite.metrics}
    by_name = {m.display_name: m for m in suite.metrics}
    prior = Prior()
    for assessment in _assessments(trace):
        # Ours name their metric in metadata: under ``<key>/<judge name>`` too (a second judge's).
        metric = by_name.get((assessment.metadata or {}).get("rag_eval.metric")) if _ours(assessment) \
            else by_key.get(assessment.name)
        if metric is None or getattr(assessment, "feedback", None) is None:
            continue
        name = metric.display_name
        source = getattr(assessment.source, "source_type", None)
        if not _ours(assessment):
            if source == AssessmentSourceType.HUMAN or getattr(assessment, "overrides", None):
                prior.done.add(name)
                prior.by_person.add(name)
            continue
        if getattr(assessment, "valid", True) is False:
            continue
        meta = assessment.metadata or {}
        if meta.get("rag_eval.metric_version") != str(metric.version):
            continue
        wanted = fingerprint if metric.primitives else None
        if meta.get("rag_eval.judge_fingerprint") != wanted:
            continue
        if assessment.feedback.error is not None:
            prior.failed.setdefault(name, assessment.assessment_id)
        else:
            prior.done.add(name)
    for name in prior.done:
        prior.failed.pop(name, None)
    return prior
