"""How an LLM judge reaches its backend: one reply per request, whatever the network does.

Below the structured-output path (:mod:`.structured`), once for every provider:

- **Faults.** Transient errors (timeouts, 429, 5xx, refused connections) are retried with
  exponential backoff and full jitter, honouring ``Retry-After``, under a total deadline per
  call that also caps each attempt's own wall-clock budget. Permanent errors and refusals
  fail the call at once. These transport retries are not corrective retries: a reply that
  arrived but does not parse is the structured path's business.
- **Fail-fast.** A provider that cannot be reached at all (``unreachable_after`` consecutive
  connection failures, across calls and threads) raises :class:`JudgeUnreachable`, which
  stops the evaluation instead of failing every row the same way; so does one that accepts
  connections but never answers (``unreachable_after_timeouts`` consecutive timeouts).
- **Outages.** A judge that answered before and then reaches a fail-fast count is waited for,
  up to ``outage_budget`` seconds: its calls pause (deadlines and retries with them) while one
  request at a time probes the server with growing gaps (a circuit that half-opens); the first
  answer closes it. Past the budget the judge stops asking (:meth:`Transport.stop`): every
  row it had not judged fails as ``JudgeStopped``, at once, and the evaluation ends with every
  verdict given kept (a rerun takes them from the cache and asks only for the rest).
- **Schema fallback.** A server that refuses the requested structured-output format
  (``SchemaUnsupported``) is asked the next way: ``json_schema``, then ``json_object`` where
  the backend has it, then prompt-and-parse. The switch is made once per judge, remembered
  for the process per (provider, base_url, model), logged, and counted in the usage.
- **Accounting.** Every attempt is counted: provider calls, retries, latency, tokens, cost
  where the price table knows the model, the model ids and system fingerprints reported.
- **The cap.** With a :class:`~.spend.CostLedger` (an evaluation's budget, :meth:`LLMJudge.metered`)
  every attempt at a priced model reserves what it may cost before it is sent, or is refused
  (:class:`~.spend.BudgetExhausted`, no request made), and settles with the reply's usage.
- **What answered.** Every reply used for a verdict is counted by the way it was asked for and
  the model its server reported (:meth:`Transport.note_reply`); the judge's fingerprint covers
  both, and a server that starts reporting another model within a run is logged.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from dataclasses import replace
from typing import TYPE_CHECKING

from mlflow_rag_eval._util.text import shorten
from mlflow_rag_eval.judges.base import JUDGE_STOPPED, JudgeFailure, JudgeUnreachable
from mlflow_rag_eval.judges.llm.chat import (
    CONNECTION_ERROR,
    RESPONSE_FORMATS,
    ChatBackend,
    ChatReply,
    ChatRequest,
    PermanentError,
    TransientError,
    redacted,
)
from mlflow_rag_eval.judges.llm.spend import IN_PROCESS_PROVIDERS, CallCost, CostLedger, Hold, request_tokens
from mlflow_rag_eval.judges.llm.usage import Usage, load_price_table, token_count

if TYPE_CHECKING:
    from mlflow_rag_eval.judges.llm._settings import LLMSettings

__all__ = ["MESSAGE_CHARS", "PROMPT", "SCHEMA", "UNREACHABLE_HOLD_S", "Transport", "preferred_format"]

_logger = logging.getLogger(__name__)

#: The mode label of a backend with a single way of asking for a schema.
SCHEMA = "schema"
#: The mode label of prompt-and-parse: no structured output asked, the prompt shows the schema.
PROMPT = "prompt"
#: Longest error text kept for a row whose reply broke something unexpected.
MESSAGE_CHARS = 300
#: Seconds a judge declared unreachable fails new calls at once, without a request: the rows
#: still queued when the evaluation stops cost nothing. After that quiet time one request
#: goes out again (a judge object reused once its server is back works without a restart).
UNREACHABLE_HOLD_S = 10.0
#: Seconds between probes of a judge in an outage: the first gap, and the most it grows to.
PROBE_FIRST_S, PROBE_MAX_S = 1.0, 15.0
#: Seconds a call waiting out an outage sleeps between looks at the circuit.
_OUTAGE_POLL_S = 0.05

# (provider, base_url, model) -> the format a server was last found to accept: a new judge on
# the same server starts there instead of repeating the call that failed.
_FORMAT_MEMORY: dict[tuple[str, str, str], str] = {}
_FORMAT_MEMORY_LOCK = threading.Lock()


def _remembered_format(backend: ChatBackend) -> str | None:
    base_url = getattr(backend, "base_url", None)
    if not base_url:  # in-process backends: nothing to remember a server by
        return None
    with _FORMAT_MEMORY_LOCK:
        return _FORMAT_MEMORY.get((backend.provider, base_url, backend.model))


def _remember_format(backend: ChatBackend, mode: str) -> None:
    base_url = getattr(backend, "base_url", None)
    if base_url:
        with _FORMAT_MEMORY_LOCK:
            _FORMAT_MEMORY[(backend.provider, base_url, backend.model)] = mode


def _attempts(n: int) -> str:
    return f"{n} attempt" if n == 1 else f"{n} attempts"


def format_ladder(backend: ChatBackend) -> tuple[str, ...]:
    """The ways to ask ``backend`` for a schema, in fallback order, ending with prompt-and-parse.

    A backend that lists ``response_formats`` (the OpenAI-compatible one: ``json_schema``,
    ``json_object``) starts at its configured ``response_format``; one with a single way is
    ``schema``; without schema support there is only ``prompt``.
    """
    if not getattr(backend, "supports_schema", False):
        return (PROMPT,)
    ways = tuple(getattr(backend, "response_formats", ()) or (SCHEMA,))
    configured = getattr(backend, "response_format", ways[0])
    if configured in ways:
        ways = ways[ways.index(configured):]
    return (*ways, PROMPT)


def preferred_format(backend: ChatBackend) -> str:
    """The way ``backend`` asks for a schema when nothing gets in the way: its configured
    ``response_format`` among its ways, else its only way (``schema``), *whether or not schema
    support is on*. A judge whose replies came any other way (prompt-and-parse because support
    is off, or after a fallback) decides differently, and its fingerprint says so; one whose
    replies came this way keeps the fingerprint it always had."""
    ways = tuple(getattr(backend, "response_formats", ()) or (SCHEMA,))
    configured = getattr(backend, "response_format", ways[0])
    return configured if configured in ways else ways[0]


def as_mode(request: ChatRequest, mode: str) -> ChatRequest:
    """``request`` as sent in ``mode``: the schema only when structured output is asked."""
    if mode == PROMPT or request.schema is None:
        return replace(request, schema=None, response_format=None)
    return replace(request, response_format=mode if mode in RESPONSE_FORMATS else None)


def mode_of(request: ChatRequest) -> str:
    if request.schema is None:
        return PROMPT
    return request.response_format or SCHEMA


class RateLimiter:
    """At most ``rate`` request starts per second, across threads: a request starts only once
    ``1 / rate`` s have passed since the previous start *as it happened* (not as scheduled:
    a thread that woke late pushes the next start back, so a late wake-up can never bunch two
    starts), hence any one-second window ``[t, t + 1)`` holds at most ``rate`` starts."""

    def __init__(self, rate: float):
        if not rate > 0:
            raise ValueError(f"rate_limit must be a positive number of requests per second, got {rate!r}")
        self.interval = 1.0 / rate
        self._next = 0.0
        self._lock = threading.Lock()

    def acquire(self, deadline: float) -> None:
        """Wait until this request may start; JudgeFailure ``DeadlineExceeded`` as soon as the
        earliest start would come after ``deadline``."""
        while True:
            with self._lock:
                now = time.monotonic()
                if now >= self._next:
                    self._next = now + self.interval
                    return
                wait = self._next - now
            if now + wait > deadline:
                raise JudgeFailure("DeadlineExceeded", f"the rate limit's next start is {wait:.1f} s away, "
                                                       "past the call's deadline")
            time.sleep(wait)


class Transport:
    """One judge's way to its backend: retries under the deadline, fail-fast, format fallback
    and accounting. Thread-safe; shared by every call of the judge."""

    def __init__(self, backend: ChatBackend, settings: LLMSettings, usage: Usage, *, name: str,
                 concurrency: int):
        self.backend = backend
        self.settings = settings
        self.usage = usage
        self.name = name
        self.concurrency = concurrency
        self._prices = load_price_table()
        self._ladder = format_ladder(backend)
        remembered = _remembered_format(backend)
        self._format = remembered if remembered in self._ladder else self._ladder[0]
        self._format_lock = threading.Lock()
        self._connection_failures = 0
        self._last_connection_failure: tuple[float, str] = (0.0, "")
        self._timeouts = 0  # consecutive attempts that got no answer within their budget
        self._last_timeout = 0.0
        self._longest_timed_out = 0.0  # the longest budget among them, in seconds
        self._health_lock = threading.Lock()
        self._answers = 0  # the server's answers so far (any: an outage can end, not a never-reachable judge)
        self._outage_declared = False  # a call spent its retries while the server answered no one
        self._streak_since = 0.0  # when the current run of failures began (its first failure)
        self._next_probe = 0.0  # when a call waiting out an outage may send the next probe
        self._probe_gap = PROBE_FIRST_S
        self._noticed: set[str] = set()
        self._noticed_lock = threading.Lock()
        rate = settings.rate_limit or getattr(backend, "default_rate_limit", None)
        self.rate_limit = float(rate) if rate else None
        self._limiter = RateLimiter(self.rate_limit) if self.rate_limit else None
        self._reported: list[str] = []  # the models replies reported, in the order first seen
        self._reported_lock = threading.Lock()
        #: a cache probe (:meth:`LLMJudge.cache_probe`): a reply not in the cache is not asked for
        self.cache_only = False
        #: why the judge stopped asking (an outage past its budget), None while it asks: from
        #: then on a reply not in the cache is a row's ``JudgeStopped`` failure, asked of no one
        self.stopped: str | None = None
        #: the evaluation's spend ledger while one is metering this judge (:meth:`LLMJudge.metered`)
        self.ledger: CostLedger | None = None

    @property
    def response_format(self) -> str:
        """How a schema is asked for now: ``json_schema``, ``json_object``, ``schema`` (the
        backend's only way) or ``prompt`` (prompt-and-parse, after a fallback)."""
        return self._format

    @property
    def use_schema(self) -> bool:
        """Whether structured output is asked for now."""
        return self._format != PROMPT

    # -- one reply ------------------------------------------------------------------------------
    def reply(self, request: ChatRequest, deadline: float) -> tuple[ChatReply, str]:
        """A reply asked the way the judge asks now, falling back to the next way (once per
        judge) when the server refuses it as ``SchemaUnsupported``, and the way it was asked
        (what its cache key and the fingerprint name). A refusal is a JudgeFailure
        ``Refusal``."""
        mode = self._format
        while True:
            try:
                reply = self.send(as_mode(request, mode), deadline)
                break
            except PermanentError as exc:
                if exc.kind != "SchemaUnsupported" or mode == PROMPT or request.schema is None:
                    raise
                mode = self._fall_back(mode, exc)
        if reply.refusal:
            raise JudgeFailure("Refusal", reply.refusal[:MESSAGE_CHARS])
        return reply, mode

    def note_reply(self, model: object, mode: str) -> None:
        """Count a reply used for a verdict (fresh or cached): the way it was asked and the model
        its server reported. A model other than those reported before in this judge's life is
        logged: the server changed what answers, and the fingerprint names every model."""
        reported = model if isinstance(model, str) and model else None
        self.usage.add(reply_formats=mode, reported_models=reported)
        if reported is None:
            return
        with self._reported_lock:
            if reported in self._reported:
                return
            before = list(self._reported)
            self._reported.append(reported)
        if before:
            _logger.warning("judge %s: the server now reports model %r, after %s; the judge fingerprint covers "
                            "every model reported, so this run pairs only with runs answered by the same models",
                            self.name, reported, ", ".join(map(repr, before)))

    def send(self, request: ChatRequest, deadline: float) -> ChatReply:
        """One reply, retrying transient errors with backoff under the deadline.

        Each attempt gets ``min(timeout, time left)`` as its total budget, so no attempt can
        outlive the call's deadline. Raises JudgeFailure (retries spent, deadline passed, the judge stopped),
        PermanentError, or JudgeUnreachable from the fail-fast count.
        """
        s = self.settings
        attempt = 0
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise JudgeFailure("DeadlineExceeded", f"no reply within {s.deadline:g} s")
            if self.stopped is not None:  # stopped while this call waited (a retry, the rate limit)
                raise self.stopped_failure()
            self.check_reachable()
            waited = self._wait_out_outage()
            if waited:  # the outage's time is not the call's: its deadline and retries start again
                deadline += waited
                attempt = 0
            if self._limiter is not None:
                self._limiter.acquire(deadline)
                remaining = deadline - time.monotonic()
            ledger = self.ledger
            hold = None
            if ledger is not None:  # BudgetExhausted: not sent; it may wait for calls in flight to settle
                hold = self._reserve(ledger, request, deadline)
                remaining = deadline - time.monotonic()
            started, answers_then = time.monotonic(), self._answers  # the server's answers before this attempt
            budget = min(s.timeout, remaining)
            charge = "release"  # what the hold becomes if the attempt gets no reply
            try:
                self.usage.add(provider_calls=1, response_formats=mode_of(request))
                reply = self.backend.complete(replace(request, timeout=budget))
            except TransientError as exc:
                charge = "estimate" if exc.kind == "Timeout" else "release"  # a timed-out call may be billed
                self._note_transient(exc, budget)
                if (exc.kind == CONNECTION_ERROR and attempt >= s.max_retries and answers_then == self._answers > 0
                        and s.outage_budget > 0):
                    # retries spent, the last while the server answered no one: an outage, not this row's fault
                    with self._health_lock:
                        self._outage_declared = True
                if self._in_outage():  # no retry of its own, and the probe's time is the outage's
                    deadline += time.monotonic() - started
                    continue
                attempt += 1
                self._back_off(exc, attempt, deadline)
                continue
            except PermanentError:
                self._note_answer()  # the server answered: it is reachable
                raise
            except Exception as exc:  # a provider bug fails the row, not the run
                charge = "estimate"  # something came back that could not be read: it may be billed
                raise JudgeFailure(type(exc).__name__, str(exc)[:MESSAGE_CHARS]) from None
            else:
                charge = "estimate"  # a reply came: charged at the estimate unless its usage settles it
                self._note_answer()
                reply = redacted(reply)
                tokens_in, tokens_out, prices = self._account(reply, request)
                if hold is not None:
                    ledger.settle(hold, tokens_in, tokens_out, prices)
                charge = "settled"
                return reply
            finally:
                self.usage.add(latency_s=time.monotonic() - started)
                if hold is not None and charge == "estimate":
                    ledger.charge_estimate(hold)
                elif hold is not None and charge == "release":
                    ledger.release(hold)

    def _back_off(self, exc: TransientError, attempt: int, deadline: float) -> None:
        """Sleep before retry ``attempt``, or raise JudgeFailure when retries are spent or the
        wait would pass the deadline."""
        s = self.settings
        if attempt > s.max_retries:
            raise JudgeFailure(exc.kind, f"{exc.message} (gave up after {_attempts(attempt)})") from None
        if exc.retry_after is not None:
            delay = exc.retry_after
        else:  # exponential backoff, full jitter
            delay = random.uniform(0, min(s.backoff_max, s.backoff_base * 2 ** (attempt - 1)))
        if time.monotonic() + delay >= deadline:
            raise JudgeFailure(exc.kind, f"{exc.message} (retry would pass the deadline)") from None
        self.usage.add(retries=1)
        time.sleep(delay)

    # -- fail-fast ------------------------------------------------------------------------------
    def unreachable_limit(self) -> int:
        if self.settings.unreachable_after is not None:
            return max(0, self.settings.unreachable_after)
        return max(8, 2 * self.concurrency)

    def timeout_limit(self) -> int:
        """Consecutive timeouts that declare the judge unreachable: ``unreachable_after_timeouts``,
        else the connection-failure limit (so ``unreachable_after=0`` turns both off)."""
        if self.settings.unreachable_after_timeouts is not None:
            return max(0, self.settings.unreachable_after_timeouts)
        return self.unreachable_limit()

    def _note_transient(self, exc: TransientError, budget: float) -> None:
        """Count a connection failure or a timeout (an attempt of ``budget`` s that got no
        answer), raising JudgeUnreachable at its limit; an HTTP answer (429, 5xx) resets both
        counts. Each count leaves the other as it is."""
        now = time.monotonic()
        with self._health_lock:
            if exc.kind in (CONNECTION_ERROR, "Timeout") and not (self._connection_failures or self._timeouts):
                self._streak_since = now
            if exc.kind == CONNECTION_ERROR:
                self._connection_failures += 1
                self._last_connection_failure = (now, exc.message)
            elif exc.kind == "Timeout":
                self._timeouts += 1
                self._last_timeout = now
                self._longest_timed_out = max(self._longest_timed_out, budget)
        if exc.kind not in (CONNECTION_ERROR, "Timeout"):
            self._note_answer()
            return
        self.check_reachable()

    def check_reachable(self) -> None:
        """Raise JudgeUnreachable while the judge is declared unreachable (a limit reached, the
        last failure it counts less than UNREACHABLE_HOLD_S ago)."""
        limit, timeout_limit, now = self.unreachable_limit(), self.timeout_limit(), time.monotonic()
        with self._health_lock:
            count = self._connection_failures
            when, last = self._last_connection_failure
            timeouts, timed_out_at, longest = self._timeouts, self._last_timeout, self._longest_timed_out
            outage, since = self._outage_locked(limit, timeout_limit), self._streak_since
        budget = self.settings.outage_budget
        if outage:
            if now - since <= budget:
                return  # an outage, waited out (_wait_out_outage)
            self.stop(f"judge {self.name!r} stopped answering: no answer for {budget:g} s after it had answered "
                      f"before ({count} connection failures, {timeouts} timeouts in a row; the last: "
                      f"{last or 'a timeout'}), past LLMSettings.outage_budget={budget:g} s")
            raise self.stopped_failure()
        if limit and count >= limit and now - when < UNREACHABLE_HOLD_S:
            raise JudgeUnreachable(
                f"judge {self.name!r} is unreachable: {count} consecutive connection failures, "
                f"the last: {last}. Check that the server is running and its address; the "
                f"evaluation stopped before logging anything (LLMSettings.unreachable_after={limit})"
            )
        if timeout_limit and timeouts >= timeout_limit and now - timed_out_at < UNREACHABLE_HOLD_S:
            raise JudgeUnreachable(
                f"judge {self.name!r} is unreachable: {timeouts} consecutive timeouts: the server accepts "
                f"connections but does not answer within {longest:.3g} s. Check that it is not hung or "
                f"overloaded, or raise LLMSettings.timeout; the evaluation stopped before logging anything "
                f"(LLMSettings.unreachable_after_timeouts={timeout_limit})"
            )

    def stop(self, reason: str) -> None:
        """Ask no more (the first reason holds): every later call the cache cannot answer is
        :meth:`stopped_failure`, at once. The rows judged so far keep their verdicts."""
        with self._health_lock:
            if self.stopped is not None:
                return
            self.stopped = reason
        _logger.warning("%s: the rows not judged yet fail as JudgeStopped; a rerun asks only for them (the "
                        "judge cache holds every reply given)", reason)

    def stopped_failure(self) -> JudgeFailure:
        """A row's failure once the judge has stopped asking: what happened and how to finish."""
        return JudgeFailure(JUDGE_STOPPED, f"not judged: {self.stopped}. Run the evaluation again once the "
                                           "provider answers: the rows judged come from the judge cache")

    def restart(self) -> None:
        """Ask again (a new evaluation): the stop and the outage behind it are forgotten, so the
        first call probes the server and a never-answering one fails fast as for a new judge."""
        with self._health_lock:
            self.stopped = None
            self._answers = 0
            self._outage_declared = False
            self._connection_failures = self._timeouts = 0
            self._next_probe, self._probe_gap = 0.0, PROBE_FIRST_S

    def _in_outage(self) -> bool:
        """Whether the judge answered before and has now reached a fail-fast count (within the
        outage budget: past it, :meth:`check_reachable` raises)."""
        limit, timeout_limit = self.unreachable_limit(), self.timeout_limit()
        with self._health_lock:
            return self._outage_locked(limit, timeout_limit)

    def _outage_locked(self, limit: int, timeout_limit: int) -> bool:
        """:meth:`_in_outage`, with ``_health_lock`` held by the caller."""
        return bool(self._answers and self.settings.outage_budget > 0 and (
            self._outage_declared or (limit and self._connection_failures >= limit)
            or (timeout_limit and self._timeouts >= timeout_limit)))

    def _wait_out_outage(self) -> float:
        """Wait while the judge is in an outage until this call may probe (one call per gap,
        the gap doubling from PROBE_FIRST_S to PROBE_MAX_S) or an answer ends the outage;
        returns the seconds waited. JudgeUnreachable once the outage outlasts its budget."""
        if not self._in_outage():
            return 0.0
        started = time.monotonic()
        while self._in_outage():
            self.check_reachable()
            now = time.monotonic()
            with self._health_lock:
                if now >= self._next_probe:  # this call is the probe
                    self._next_probe = now + self._probe_gap
                    self._probe_gap = min(PROBE_MAX_S, 2 * self._probe_gap)
                    if self.first_notice(f"outage-{self._streak_since}"):
                        _logger.warning("judge %s: no answer from the server (%d connection failures, %d timeouts "
                                        "in a row); waiting up to %g s for it, probing (outage_budget)", self.name,
                                        self._connection_failures, self._timeouts, self.settings.outage_budget)
                    break
            time.sleep(_OUTAGE_POLL_S)
        return time.monotonic() - started

    def _note_answer(self) -> None:
        with self._health_lock:
            self._outage_declared = False
            self._answers += 1
            self._next_probe, self._probe_gap = 0.0, PROBE_FIRST_S
            self._connection_failures = 0
            self._timeouts = 0
            self._longest_timed_out = 0.0

    def first_notice(self, topic: str) -> bool:
        """True the first time ``topic`` comes up in this judge's life: a condition every row
        meets (its cache locked by another process) is said once, not once per row."""
        with self._noticed_lock:
            if topic in self._noticed:
                return False
            self._noticed.add(topic)
            return True

    # -- accounting -----------------------------------------------------------------------------
    def _price(self, model: str | None) -> tuple[float, float] | None:
        """USD per (prompt, reply) token of ``model`` (else the model asked), None without a price."""
        models = self._prices.get("models", {})
        price = models.get(model or self.backend.model) or models.get(self.backend.model)
        return (float(price["input"]) / 1e6, float(price["output"]) / 1e6) if price else None

    def _reserve(self, ledger: CostLedger, request: ChatRequest, deadline: float) -> Hold | None:
        """Reserve what ``request`` may cost on ``ledger``: BudgetExhausted when it does not fit;
        None for a call that costs nothing (an in-process backend, a model without a price)."""
        price = None if self.backend.provider in IN_PROCESS_PROVIDERS else self._price(None)
        if price is None:
            return None
        tokens_in, tokens_out = request_tokens(request.messages, request.template_id, request.variables,
                                               request.schema)
        max_out = token_count(request.params.get("max_tokens")) or self.settings.max_tokens
        return ledger.reserve(CallCost(tokens_in, tokens_out, max_out, *price), deadline)

    def _plausible(self, tokens: int | None, most: int | None, what: str) -> int | None:
        """``tokens`` as reported, or None (unknown: charged at the estimate) when it is more than
        the call could hold: a prompt of more tokens than it has bytes, a reply past ``max_tokens``.
        One server bug ("prompt_tokens": 10**12) must not stop a capped run at its first reply."""
        if tokens is None or most is None or tokens <= most:
            return tokens
        if self.first_notice(f"implausible-{what}"):
            _logger.warning("judge %s: the server reported %d %s tokens for a call that can hold at most %d; such "
                            "counts are charged at the estimate and counted in usage_unknown", self.name, tokens, what,
                            most)
        return None

    def _account(self, reply: ChatReply, request: ChatRequest | None = None
                 ) -> tuple[int | None, int | None, tuple[float, float] | None]:
        """Add a reply's tokens and cost to the usage; returns its (prompt, reply) tokens (None
        where unknown) and the prices they cost. Never raises: unreadable usage counts as
        unknown tokens (``usage_unknown``), not as the row's failure; so does a count more than
        the call could hold (:meth:`_plausible`)."""
        try:
            tin, tout = token_count(reply.tokens_in), token_count(reply.tokens_out)
            if request is not None:
                sent = sum(len(str(m.get("content", "")).encode()) + 16 for m in request.messages)
                sent += len(json.dumps(request.schema).encode()) if request.schema else 0
                tin = self._plausible(tin, sent + 64, "prompt")
                tout = self._plausible(tout, token_count(request.params.get("max_tokens")) or self.settings.max_tokens,
                                       "reply")
            model = reply.model if isinstance(reply.model, str) and reply.model else None
            fingerprint = reply.system_fingerprint if isinstance(reply.system_fingerprint, str) else None
            price = self._price(model)
            cost = (tin or 0) * price[0] + (tout or 0) * price[1] if price else 0.0
            self.usage.add(tokens_in=tin or 0, tokens_out=tout or 0, cost_usd=float(cost), models=model,
                           system_fingerprints=fingerprint or None,
                           usage_unknown=int(tin is None or tout is None))
            return tin, tout, price
        except Exception as exc:  # noqa: BLE001 - accounting must never cost a verdict
            _logger.warning("judge %s: reply usage not counted (%s: %s)", self.name, type(exc).__name__, exc)
            self.usage.add(usage_unknown=1)
            return None, None, None

    # -- structured-output fallback -------------------------------------------------------------
    def _fall_back(self, refused: str, exc: PermanentError) -> str:
        """Move the judge past ``refused`` (only forward, once however many rows hit it at the
        same time), remember it for the server, and say so; returns the way to ask next."""
        ladder = self._ladder
        wanted = ladder[min(ladder.index(refused) + 1, len(ladder) - 1)]
        with self._format_lock:
            switched = ladder.index(self._format) < ladder.index(wanted)
            if switched:
                self._format = wanted
            current = self._format
        if switched:
            self.usage.add(schema_fallbacks=f"{refused}->{wanted}")
            _remember_format(self.backend, wanted)
            _logger.warning("judge %s: the server refused response format %s (%s); asking with %s from now on",
                            self.name, refused, shorten(exc.message), wanted)
        return current
