"""An experiment's traces read page by page by start time, the way a job that runs for hours
while traces are written and deleted must read them.

- **Paged by time, not by offset**: each page is a new search ``<filter> AND timestamp_ms >=
  <the last page's newest start>`` (oldest first), the traces of that millisecond already read
  left out. A retention job deleting old traces between two pages moves no offset, so it skips
  nothing. (Only a millisecond holding more traces than a page goes on with MLflow's page
  token.)
- **A trace that cannot be decoded costs itself, not its page**: a page is the trace infos
  (a search with spans drops, without a word, a trace whose spans have not landed yet), then
  their traces in one batch; one span whose stored content is not JSON fails the batch, which is
  then fetched one trace at a time: the ones that cannot be decoded are given as
  :class:`Undecodable` (trace id and error), the others as traces.
- The filter is MLflow's trace filter grammar, as ``search_traces`` takes it: comparisons joined
  by ``AND``, no parentheses and no ``OR`` (:func:`combined_filter` adds the time window
  the same way).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from mlflow_rag_eval._util.mlflow_compat import batch_get_traces, search_traces

__all__ = ["Undecodable", "combined_filter", "pages_by_time", "trace_end_ms"]


@dataclass(frozen=True)
class Undecodable:
    """A trace MLflow could not decode: its info (id, times, state) and why."""

    info: object
    error: str


def combined_filter(filter_string: str | None, *clauses: str) -> str | None:
    """``filter_string`` and ``clauses`` in MLflow's grammar: AND-joined, never parenthesized
    (the trace search refuses parentheses)."""
    parts = [p.strip() for p in (filter_string, *clauses) if p and p.strip()]
    return " AND ".join(parts) if parts else None


def trace_end_ms(info) -> int:
    """When a trace ended (its start plus its duration; the start when it has none yet)."""
    return int(info.request_time) + int(info.execution_duration or 0)


def _one(client, info):
    try:
        return client.get_trace(info.trace_id)
    except Exception as exc:  # noqa: BLE001 - whatever MLflow raises decoding it: this trace's reason
        return Undecodable(info, f"{type(exc).__name__}: {str(exc)[:200]}")


def _read_page(client, experiment_id: str, filter_string: str | None, page_size: int, token: str | None):
    """One page: the trace infos (what the paging goes by: a search with spans leaves out, without
    a word, a trace whose spans have not landed), then their traces in one batch; a batch that
    fails to decode, or lacks a trace, is fetched one trace at a time."""
    page = search_traces(client, experiment_id, filter_string=filter_string, max_results=page_size,
                         order_by=["timestamp_ms ASC"], page_token=token, include_spans=False)
    infos = [t.info for t in page]
    try:
        got = {t.info.trace_id: t for t in batch_get_traces(client._tracing_client, [i.trace_id for i in infos])}
    except Exception:  # noqa: BLE001 - one trace that does not decode fails the batch: each alone
        got = {}
    return [got.get(info.trace_id) or _one(client, info) for info in infos], page.token


def pages_by_time(client, experiment_id: str, filter_string: str | None, *, after_ms: int | None,
                  page_size: int) -> Iterator[list]:
    """Pages of the traces matching ``filter_string`` that started after ``after_ms`` (all when
    None), oldest first: traces with spans and assessments, or :class:`Undecodable`."""
    bound = None if after_ms is None else f"timestamp_ms > {int(after_ms)}"
    seen_at_bound: set[str] = set()
    bound_ms, token = None, None
    while True:
        items, next_token = _read_page(client, experiment_id, combined_filter(filter_string, bound) if bound
                                       else filter_string, page_size, token)
        fresh = [i for i in items if i.info.trace_id not in seen_at_bound]
        if fresh:
            yield fresh
        if not next_token or not items:  # the query's last page (a short page need not be the last)
            return
        newest = max(int(i.info.request_time) for i in items)
        if newest == bound_ms:  # a full page within one millisecond: MLflow's token goes on in it
            seen_at_bound |= {i.info.trace_id for i in items}
            if not next_token:
                return
            token = next_token
            continue
        bound_ms, token = newest, None
        bound = f"timestamp_ms >= {newest}"
        seen_at_bound = {i.info.trace_id for i in items if int(i.info.request_time) == newest}
