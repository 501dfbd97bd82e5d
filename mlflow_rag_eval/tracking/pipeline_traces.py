"""The traces a RAG pipeline makes itself (``@mlflow.trace``, autologging), found and matched
to the evaluated rows, so that they become the rows' traces instead of synthetic duplicates.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from mlflow.tracing.constant import TraceTagKey

from mlflow_rag_eval._util.mlflow_compat import search_traces

__all__ = ["match_pipeline_traces", "predict_with_traces"]

_logger = logging.getLogger(__name__)


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _strings(v)


def match_pipeline_traces(traces: Sequence, questions: Sequence[str]) -> list[str | None]:
    """Which trace the pipeline produced for which row.

    A trace belongs to a row when exactly one of the evaluated questions appears, as a whole
    string, among its root span's inputs; rows with the same question take such traces in
    the order they were made. A trace of the whole batch (its inputs hold every question)
    belongs to no row, and a row without a trace of its own gets a new one.
    """
    wanted = set(questions)
    rows_by_question: dict[str, list[int]] = {}
    for i, question in enumerate(questions):
        rows_by_question.setdefault(question, []).append(i)
    out: list[str | None] = [None] * len(questions)
    for trace in sorted(traces, key=lambda t: (t.info.request_time, t.info.trace_id)):
        root = trace.data._get_root_span()
        if root is None:
            continue
        found = {s for s in _strings(root.inputs) if s in wanted}
        if len(found) != 1:
            continue
        (question,) = found
        free = rows_by_question[question]
        if free:
            out[free.pop(0)] = trace.info.trace_id
    return out


def predict_with_traces(model, inputs, questions: Sequence[str], experiment_id: str):
    """``model.predict(inputs)``, and per row the trace the pipeline made for it (or None).

    The call runs in an MLflow evaluation prediction context, as ``mlflow.genai.evaluate``
    runs a ``predict_fn``: traces are written synchronously and tagged with a request id
    that finds exactly the traces this call produced.
    """
    from mlflow import MlflowClient
    from mlflow.pyfunc.context import Context, set_prediction_context

    request_id = f"rag_eval-{uuid.uuid4().hex}"
    with set_prediction_context(Context(request_id=request_id, is_evaluate=True)):
        output = model.predict(inputs)
    client = MlflowClient()
    traces, token = [], None
    while True:
        page = search_traces(
            client, experiment_id, filter_string=f"tag.`{TraceTagKey.EVAL_REQUEST_ID}` = '{request_id}'",
            max_results=500, page_token=token, include_spans=True,
        )
        traces += list(page)
        token = page.token
        if not token:
            break
    if not traces:
        return output, None
    matched = match_pipeline_traces(traces, questions)
    n_matched = sum(t is not None for t in matched)
    if n_matched < len(questions):
        _logger.info(
            "the pipeline made %d trace(s) for %d rows; %d row(s) matched one trace each, the others get "
            "their own trace (a trace of several questions at once stays as the pipeline made it)",
            len(traces), len(questions), n_matched,
        )
    return output, matched
