"""The one structured-output path: every reply the judge must parse goes through :func:`ask`.

Our own templates (:meth:`LLMJudge._ask`) and other libraries' prompts (ragas, deepeval, via
:meth:`LLMJudge.complete_structured` and :meth:`LLMJudge.complete`) all come here, so a reply
costs the same everywhere:

1. a valid cached reply, if any (errors and refusals are never cached);
2. else one request through the judge's :class:`~.transport.Transport` (whose retries of
   timeouts, 429 and 5xx are transport, not corrective, retries);
3. the reply validated (:func:`.parsing.parse_reply` against a pydantic schema, with the texts
   under evaluation as ``data`` so JSON quoted from them is never taken), safe repairs
   included;
4. if invalid, **one** corrective retry that shows the model the validation error, never the
   reply (text the model echoed from the data must not come back outside the data tags);
5. still invalid: a named :class:`JudgeFailure` ``ParseError``.

So one structured reply costs at most two provider calls. Callers must not retry on top:
an adapter that re-asks after a ParseError, or a library's own re-parse loop, would multiply
that bound.

The cache is read inside the call's ``deadline``: a read waits for the cache file's lock at most
:data:`CACHE_LOCK_WAIT_S` or what is left of the deadline, whichever is smaller. A write waits
:data:`CACHE_LOCK_WAIT_S` whatever is left: the reply is paid for, and storing it is what spares
a rerun the call (after an outage waited out, every call's deadline has passed, and a whole
pool of replies arrives at once; bench/faults.py lost them to a zero wait).
A cache locked by another process then costs the reuse, never the row: the read is a miss, the
reply is used unstored, and the judge says so once (not once per row).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from pydantic import BaseModel

from mlflow_rag_eval.judges.base import JudgeFailure, JudgeUnreachable
from mlflow_rag_eval.judges.cache import JudgeCache, JudgeCacheLocked
from mlflow_rag_eval.judges.llm._parsing import ReplyParseError, parse_reply
from mlflow_rag_eval.judges.llm.chat import ChatReply, ChatRequest, PermanentError
from mlflow_rag_eval.judges.llm.transport import MESSAGE_CHARS, Transport

__all__ = ["CACHE_LOCK_WAIT_S", "ask", "corrective_request", "schema_validator"]

_logger = logging.getLogger(__name__)

#: The most seconds a cache read or write waits for the file's lock (less when the call's
#: deadline leaves less). Another process's one-row write holds it for milliseconds; a lock
#: held for seconds is a long transaction elsewhere (a vacuum, a sqlite browser, a stopped
#: process) that may last the whole run. Giving up costs at most one provider call (a miss now,
#: or a reply not reused later), so waiting longer than a call takes would cost more than it saves.
CACHE_LOCK_WAIT_S = 2.0

#: What the one corrective retry says: the validation error, never the reply itself.
CORRECTION = "Your reply was not valid: {reason}. Reply again with only the JSON object that matches the schema."


def schema_validator(schema: type[BaseModel], data: tuple[str, ...] = (),
                     check: Callable[[Any], None] | None = None) -> Callable[[str], Any]:
    """``text -> schema instance``; raises ReplyParseError (from parsing or from ``check``).

    ``data``: the texts under evaluation; JSON quoted from them is never the reply's.
    """

    def validate(text: str) -> Any:
        parsed = parse_reply(text, schema, data)
        if check is not None:
            check(parsed)
        return parsed

    return validate


def corrective_request(request: ChatRequest, reply_text: str, error: ReplyParseError) -> ChatRequest:
    """``request`` again, with the invalid reply as the assistant's turn and the reason why."""
    return replace(request, messages=list(request.messages) + [
        {"role": "assistant", "content": reply_text},
        {"role": "user", "content": CORRECTION.format(reason=error.reason)},
    ])


def ask(transport: Transport, cache: JudgeCache, key_for: Callable[[str], str], request: ChatRequest,
        validate: Callable[[str], Any]) -> Any:
    """``validate(reply text)`` for ``request``: cached, or asked with one corrective retry.

    ``key_for(mode)`` is the cache key of the reply asked in ``mode`` (the way the schema is
    asked for): a reply is looked up under the judge's way now and stored under the way it was
    actually asked, so a reply got by prompt-and-parse after a fallback is never read back as
    a schema-constrained one. Every reply used is counted by way and reported model
    (:meth:`Transport.note_reply`, which the fingerprint reads).

    Raises:
        JudgeFailure: ``ParseError`` after the corrective retry, a transport failure, a
            refusal, a permanent error, or anything ``validate`` breaks unexpectedly; counted
            in the usage's errors.
        JudgeUnreachable: the provider cannot be reached at all (the evaluation stops).
    """
    deadline = time.monotonic() + transport.settings.deadline
    mode = transport.response_format
    cached = _cached(transport, cache, key_for(mode), deadline)
    if cached is not None and isinstance(cached.get("text"), str):
        try:
            parsed = validate(cached["text"])
            transport.usage.add(cache_hits=1)
            transport.note_reply(cached.get("model"), mode)
            return parsed
        except ReplyParseError:
            pass  # a stale or foreign entry: ask again
    if transport.cache_only:
        raise JudgeFailure("NotCached", "no cached reply (a cache probe asks no provider)")
    try:
        if transport.stopped is not None:  # an outage outlasted its budget: nothing more is asked
            raise transport.stopped_failure()
        parsed, reply, mode = _validated_reply(transport, request, validate, deadline)
    except JudgeUnreachable:
        raise
    except PermanentError as exc:
        failure = JudgeFailure(exc.kind, exc.message)
    except JudgeFailure as exc:
        failure = exc
    except Exception as exc:  # noqa: BLE001 - e.g. a check that breaks: one row's named failure
        _logger.warning("judge %s: a reply failed: %s: %s", transport.name, type(exc).__name__, exc)
        failure = JudgeFailure(type(exc).__name__, str(exc)[:MESSAGE_CHARS])
    else:
        _store(transport, cache, key_for(mode), reply, deadline)
        transport.note_reply(reply.model, mode)
        return parsed
    transport.usage.add(errors=failure.kind)
    raise failure


def _validated_reply(transport: Transport, request: ChatRequest, validate: Callable[[str], Any],
                     deadline: float) -> tuple[Any, ChatReply, str]:
    """Send, validate; on an invalid reply one corrective retry; then ParseError. Returns the
    parsed reply, the reply and the way it was asked."""
    reply, mode = transport.reply(request, deadline)
    try:
        return validate(reply.text), reply, mode
    except ReplyParseError as first:
        transport.usage.add(repair_retries=1)
        reply, mode = transport.reply(corrective_request(request, reply.text, first), deadline)
    try:
        return validate(reply.text), reply, mode
    except ReplyParseError as second:
        raise JudgeFailure("ParseError", f"{second} (after one corrective retry)") from None


def _lock_wait(deadline: float) -> float:
    return max(0.0, min(CACHE_LOCK_WAIT_S, deadline - time.monotonic()))


def _cache_locked(transport: Transport, exc: JudgeCacheLocked) -> None:
    """Say once per judge that its cache is locked: every row meets it while the lock lasts."""
    if transport.first_notice("cache-locked"):
        _logger.warning("judge %s: the cache file %s is locked by another writer (another process, or this "
                        "run's other threads; no lock within %.2g s); "
                        "rows go on uncached (replies are used, neither read back nor stored) while it stays "
                        "locked", transport.name, exc.path, exc.wait)


def _cached(transport: Transport, cache: JudgeCache, key: str, deadline: float) -> dict | None:
    """The cached entry under ``key``; a cache locked past the wait is a miss."""
    try:
        return cache.get(key, wait=_lock_wait(deadline))
    except JudgeCacheLocked as exc:
        _cache_locked(transport, exc)
        return None


def _store(transport: Transport, cache: JudgeCache, key: str, reply: ChatReply, deadline: float) -> None:
    """Cache a reply that parsed; a cache that cannot write costs the reuse, not the verdict."""
    entry = {"text": reply.text, "model": reply.model, "system_fingerprint": reply.system_fingerprint,
             "tokens_in": reply.tokens_in, "tokens_out": reply.tokens_out}
    try:
        cache.put(key, entry, wait=CACHE_LOCK_WAIT_S)
    except JudgeCacheLocked as exc:
        _cache_locked(transport, exc)
    except Exception as exc:  # noqa: BLE001
        _logger.warning("judge %s: reply not cached (%s: %s)", transport.name, type(exc).__name__, exc)
