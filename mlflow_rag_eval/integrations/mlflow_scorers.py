"""Scorers for ``mlflow.genai.evaluate``: one per metric, the same names and values.

    mlflow.genai.evaluate(data=rows, predict_fn=my_rag, scorers=rag_scorers(["faithfulness",
                          "context_recall", "ndcg@10"], judge="local:minilm-l6"))

Each scorer reads ``inputs`` (``{"question": ...}``), ``outputs`` (a string answer, or
``{"answer": ..., "contexts": [...]}``) and ``expectations`` (``reference`` or
``expected_response``, ``relevant_ids``, ``answerable``, ``reference_contexts``). Contexts come
from ``outputs["contexts"]`` or, failing that, from the trace's RETRIEVER spans (their
documents' ``page_content`` and ``id`` / ``metadata.doc_uri``), in span order.

It returns a ``Feedback`` with the value, the justification as rationale, the evidence as
metadata, ``error`` when the judge could not decide, and an ``AssessmentSource`` of type
LLM_JUDGE (source id: the judge's fingerprint) — CODE for metrics that need no judge.
Aggregations match the ``rag`` evaluator's keys: ``<metric>/mean``, ``/median``, ``/p10``,
``/n_scored``, ``/ci_low``, ``/ci_high``. ``n_error`` cannot come from MLflow's aggregation
(it only sees values); the per-row errors are on the assessments.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
from mlflow.entities import AssessmentSource, AssessmentSourceType, Feedback
from mlflow.genai.scorers import Scorer
from pydantic import PrivateAttr

from mlflow_rag_eval.judges import Judge, get_judge
from mlflow_rag_eval.metrics import Metric, resolve_metric
from mlflow_rag_eval.records import ColumnMapping, records_from_frame
from mlflow_rag_eval.results import RowResult, summarize

__all__ = ["RagScorer", "rag_scorer", "rag_scorers", "contexts_from_trace"]


def _from_values(stat: str):
    def aggregate(values: list[float]) -> float | None:
        summary = summarize([RowResult.scored(v) for v in values])
        return getattr(summary, stat)

    aggregate.__name__ = stat
    return aggregate


#: the same statistics the rag evaluator logs (MLflow names each by the function's name)
AGGREGATIONS = [_from_values(s) for s in ("mean", "median", "p10", "n_scored", "ci_low", "ci_high")]


def contexts_from_trace(trace) -> list[dict[str, Any]]:
    """The documents of the trace's RETRIEVER spans, in order, as ``{"id", "text"}``."""
    if trace is None:
        return []
    from mlflow.entities import SpanType

    out = []
    for span in trace.search_spans(span_type=SpanType.RETRIEVER):
        for doc in span.outputs or []:
            if isinstance(doc, str):
                out.append({"text": doc})
                continue
            meta = doc.get("metadata") or {}
            text = doc.get("page_content", doc.get("text", doc.get("content", "")))
            doc_id = doc.get("id") or meta.get("doc_uri") or meta.get("id")
            out.append({"text": text, "id": doc_id} if doc_id is not None else {"text": text})
    return out


def _record_frame(inputs, outputs, expectations, trace):
    inputs = inputs if isinstance(inputs, Mapping) else {"question": inputs}
    question = inputs.get("question")
    if question is None and len(inputs) == 1:
        question = next(iter(inputs.values()))
    if isinstance(outputs, Mapping):
        answer = outputs.get("answer", outputs.get("response"))
        contexts = outputs.get("contexts")
    else:
        answer, contexts = outputs, None
    if contexts is None:
        contexts = contexts_from_trace(trace)
    expectations = dict(expectations or {})
    row = {"question": question, "answer": answer, "contexts": contexts}
    reference = expectations.get("reference", expectations.get("expected_response"))
    for key, value in (("reference", reference), ("relevant_ids", expectations.get("relevant_ids")),
                       ("answerable", expectations.get("answerable")),
                       ("reference_contexts", expectations.get("reference_contexts"))):
        if value is not None:
            row[key] = value
    import pandas as pd

    return pd.DataFrame([row])


class RagScorer(Scorer):
    """A genai Scorer computing one registered metric with one judge."""

    _metric: Metric = PrivateAttr()
    _judge: Judge | None = PrivateAttr(default=None)

    def __init__(self, metric: Metric, judge: Judge | None, **kwargs):
        super().__init__(name=metric.key, aggregations=AGGREGATIONS,
                         description=(type(metric).__doc__ or "").strip().split("\n")[0], **kwargs)
        self._metric = metric
        self._judge = judge

    def __call__(self, *, inputs=None, outputs=None, expectations=None, trace=None) -> Feedback:
        metric, judge = self._metric, self._judge
        if judge is not None:
            info = judge.info()
            source = AssessmentSource(source_type=AssessmentSourceType.LLM_JUDGE, source_id=info.fingerprint)
        else:
            source = AssessmentSource(source_type=AssessmentSourceType.CODE, source_id=f"mlflow_rag_eval:{metric.key}")
        try:
            frame = _record_frame(inputs, outputs, expectations, trace)
            records = records_from_frame(frame, ColumnMapping())
            present = {"answer", "contexts"} | {c for c in ("reference", "relevant_ids", "answerable",
                                                            "reference_contexts") if c in frame}
            missing = [f for f in metric.requires if f not in present]
            if missing:
                row = RowResult.not_applicable(f"no {missing[0]} in the expectations")
            else:
                if judge is not None:
                    judge.require(*metric.primitives, metric=metric.display_name)
                metric.validate(records, ColumnMapping())
                (row,) = metric.compute(records, judge)
        except Exception as exc:  # one row's bad input is that row's named error
            row = RowResult.failed(f"{type(exc).__name__}: {exc}")
        metadata = {"metric": metric.display_name, "metric_version": str(metric.version)}
        if row.details:
            metadata["details"] = json.dumps(row.details, default=_json_default)[:60000]
        return Feedback(
            name=metric.key,
            value=row.value,
            rationale=row.justification or None,
            error=row.error,
            source=source,
            metadata=metadata,
        )


def _json_default(value):
    if isinstance(value, np.generic):
        return value.item()
    return str(value)


def rag_scorer(metric: str | Metric, judge: str | Judge | None = None) -> RagScorer:
    """A genai scorer for any registered metric (``faithfulness``, ``ndcg@10``, a rubric...)."""
    resolved = resolve_metric(metric)
    return RagScorer(resolved, get_judge(judge) if resolved.primitives else None)


def rag_scorers(metrics: Iterable[str | Metric], judge: str | Judge | None = None) -> list[RagScorer]:
    """Scorers sharing one judge (one model load, one cache)."""
    resolved = [resolve_metric(m) for m in metrics]
    judge_obj = get_judge(judge) if any(m.primitives for m in resolved) else None
    return [RagScorer(m, judge_obj if m.primitives else None) for m in resolved]
