"""What one judge call is estimated to cost, what it may cost at most, and the ledger that holds
a cap across every call of an evaluation.

**Estimate.** One rule for the estimate printed before a run and for each call's: prompt tokens
as OpenAI's rule of thumb counts them (one per four characters of the rendered messages, the
output schema included), reply tokens guessed per template (a fixed part and a part per claim,
passage, question or step), priced from the shipped table. No tokenizer is loaded.

**The cap** (:class:`CostLedger`). Before each provider call (every attempt, the corrective
retry included) the transport reserves what the call may cost *at most*: its prompt tokens
(scaled by the highest ratio of reported to estimated prompt tokens seen so far, at least 1)
plus ``max_tokens`` reply tokens (or the longest reply seen, from a server that writes past
``max_tokens``). A call whose reservation, beside what was spent and what the calls in flight
hold, would pass the cap waits for those calls to settle, and is refused
(:class:`BudgetExhausted`, a named :class:`~mlflow_rag_eval.judges.base.JudgeFailure`: the
row's error, never a score) when what was spent leaves no room for it. Once a call is refused
the ledger is stopped and refuses every later one. The first call of a capped run goes alone:
what a server reports (a prompt counted 300 times its length) is known before the others start.

After the reply the reservation is settled with the reply's usage. A reply without usage is
charged at the call's estimate (never at 0); an attempt that got no reply (a 429, a 5xx, a
refused connection, a 4xx) is not charged; one that timed out is charged at its estimate (the
provider may have answered after we stopped waiting).

So spend stays at or under the cap whenever the provider bills no more than ``max_tokens`` reply
tokens and no more prompt tokens than the highest ratio seen: what a provider that honours
``max_tokens`` does after the first call.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mlflow_rag_eval._util.text import split_sentences
from mlflow_rag_eval.judges.base import JudgeFailure
from mlflow_rag_eval.judges.prompts import PROMPTS

__all__ = ["CHARS_PER_TOKEN", "IN_PROCESS_PROVIDERS", "BudgetExhausted", "CallCost", "CostLedger",
           "prompt_tokens", "reply_tokens", "request_tokens", "text_tokens"]

#: characters per token, OpenAI's rule of thumb for English text
CHARS_PER_TOKEN = 4
#: backends that run in this process: their calls cost nothing
IN_PROCESS_PROVIDERS = frozenset({"scripted", "llamacpp"})
#: guessed reply tokens: fixed part, and per claim / passage / question / step
REPLY_TOKENS = {"claims_verdicts": (10, 45), "extract_claims": (8, 15), "verify": (10, 25),
                "rate_relevance": (10, 25), "generate_questions": (15, 15), "is_abstention": (25, 0),
                "grade": (40, 30)}
#: reply tokens guessed for a prompt outside the templates (another library's)
OTHER_REPLY_TOKENS = 256


def text_tokens(text: str) -> int:
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def prompt_tokens(messages: Sequence[Mapping[str, str]], schema: Mapping[str, Any] | None) -> int:
    """The prompt tokens of ``messages`` asked with ``schema``."""
    text = "".join(str(m.get("content", "")) for m in messages)
    return text_tokens(text) + (text_tokens(json.dumps(schema)) if schema else 0)


def reply_tokens(template_id: str, n_items: int) -> int:
    """The reply tokens guessed for ``template_id`` on ``n_items`` claims, passages, questions or steps."""
    if template_id not in REPLY_TOKENS:
        return OTHER_REPLY_TOKENS
    fixed, per_item = REPLY_TOKENS[template_id]
    return fixed + per_item * max(n_items, 1)


def _items(template_id: str, variables: Mapping[str, Any]) -> int:
    """How many claims, passages, questions or steps a call's reply covers, from its variables."""
    if template_id in ("claims_verdicts", "extract_claims"):
        return len(split_sentences(str(variables.get("text") or "")))
    if template_id == "verify":
        return len(variables.get("claims") or ())
    if template_id == "rate_relevance":
        return len(variables.get("passages") or ())
    if template_id == "generate_questions":
        n = variables.get("n")
        return n if isinstance(n, int) else 1
    if template_id == "grade":
        return len(variables.get("steps") or ())
    return 0


def request_tokens(messages: Sequence[Mapping[str, str]], template_id: str, variables: Mapping[str, Any],
                   schema: Mapping[str, Any] | None) -> tuple[int, int]:
    """(prompt, reply) tokens estimated for one call. A template's schema is counted as the
    estimate before the run counts it (the template's own JSON schema)."""
    template = PROMPTS.get(template_id)
    if template is not None:
        schema = template.json_schema
    return prompt_tokens(messages, schema), reply_tokens(template_id, _items(template_id, variables))


class BudgetExhausted(JudgeFailure):
    """A judge call refused before it was sent: what it may cost does not fit under the cap."""

    def __init__(self, message: str):
        super().__init__("BudgetExhausted", message)


@dataclass(frozen=True)
class CallCost:
    """One call's tokens, estimated and at most, and its prices (USD per token)."""

    tokens_in: int
    tokens_out: int
    #: the most reply tokens the call may be billed (its ``max_tokens``)
    max_tokens_out: int
    price_in: float
    price_out: float

    @property
    def estimate_usd(self) -> float:
        return self.tokens_in * self.price_in + self.tokens_out * self.price_out


@dataclass(frozen=True)
class Hold:
    """A reservation made by :meth:`CostLedger.reserve`, settled or released once."""

    call: CallCost
    usd: float


class CostLedger:
    """The spend of an evaluation's judge calls against its cap (None: no cap, spend recorded);
    thread-safe: every call of every judge thread reserves and settles here, atomically."""

    def __init__(self, max_cost: float | None = None):
        self.max_cost = max_cost
        self._cond = threading.Condition()
        self._spent = 0.0
        self._reserved = 0.0
        self._in_flight = 0
        self._settled = 0
        self._estimated_settled = 0.0
        self._charged_at_estimate = 0
        self._refused = 0
        self._ratio_in = 1.0  # the highest reported / estimated prompt tokens seen
        self._longest_out = 0  # the most reply tokens a reply reported
        self.stopped: str | None = None

    # -- what it holds ------------------------------------------------------------------------
    @property
    def spent(self) -> float:
        """US dollars settled: replies' usage, and the estimate of each reply that gave none."""
        with self._cond:
            return self._spent

    @property
    def calls_refused(self) -> int:
        with self._cond:
            return self._refused

    @property
    def charged_at_estimate(self) -> int:
        """Calls charged at their estimate: a reply without usage, a timed-out attempt."""
        with self._cond:
            return self._charged_at_estimate

    def dearer(self) -> float:
        """How much dearer than estimated the settled calls were, together (at least 1)."""
        with self._cond:
            return max(1.0, self._spent / self._estimated_settled) if self._estimated_settled > 0 else 1.0

    def fits(self, estimate_usd: float) -> bool:
        """Whether work estimated at ``estimate_usd`` (scaled by :meth:`dearer`) fits under the
        cap beside what was spent and what is held: a share of rows is not started otherwise."""
        if self.max_cost is None:
            return True
        scale = self.dearer()
        with self._cond:
            return self.stopped is None and self._spent + self._reserved + estimate_usd * scale <= self.max_cost

    def stop(self, reason: str) -> None:
        """Stop the ledger (the first reason is kept): every later call is refused."""
        with self._cond:
            if self.stopped is None:
                self.stopped = reason
            self._cond.notify_all()

    # -- one call -----------------------------------------------------------------------------
    def _most(self, call: CallCost) -> float:
        out = max(call.max_tokens_out, self._longest_out)
        return call.tokens_in * self._ratio_in * call.price_in + out * call.price_out

    def reserve(self, call: CallCost, deadline: float | None = None) -> Hold:
        """Hold what ``call`` may cost at most, or raise :class:`BudgetExhausted` (counted, the
        ledger stopped); waits while calls in flight hold the room it needs (and, under a cap,
        while the run's first call is in flight), raising JudgeFailure ``DeadlineExceeded`` if
        that outlasts ``deadline`` (``time.monotonic()``)."""
        with self._cond:
            while True:
                if self.stopped is not None:
                    self._refused += 1
                    raise BudgetExhausted(f"not sent: {self.stopped}")
                most = self._most(call)
                first_in_flight = self.max_cost is not None and self._settled == 0 and self._in_flight > 0
                if self.max_cost is None or (not first_in_flight
                                             and self._spent + self._reserved + most <= self.max_cost):
                    self._reserved += most
                    self._in_flight += 1
                    return Hold(call, most)
                if not first_in_flight and self._in_flight == 0:  # nothing will free room: the cap is reached
                    self._refused += 1
                    self.stopped = (f"max_cost=${self.max_cost:g} reached: ${self._spent:.4f} spent, the next "
                                    f"judge call may cost up to ${most:.4f}")
                    self._cond.notify_all()
                    raise BudgetExhausted(f"not sent: {self.stopped}")
                wait = None if deadline is None else deadline - time.monotonic()
                if wait is not None and wait <= 0:
                    raise JudgeFailure("DeadlineExceeded", "no room under max_cost before the call's deadline "
                                                           "(the calls in flight hold it)")
                self._cond.wait(wait)

    def settle(self, hold: Hold, tokens_in: int | None, tokens_out: int | None,
               prices: tuple[float, float] | None = None) -> float:
        """Charge a call that got a reply: its usage at ``prices`` (USD per token; the hold's
        by default), each count the reply did not give at the estimate; returns the charge."""
        price_in, price_out = prices or (hold.call.price_in, hold.call.price_out)
        known = tokens_in is not None and tokens_out is not None
        charge = ((tokens_in if tokens_in is not None else hold.call.tokens_in) * price_in
                  + (tokens_out if tokens_out is not None else hold.call.tokens_out) * price_out)
        with self._cond:
            if tokens_in is not None and hold.call.tokens_in > 0:
                self._ratio_in = max(self._ratio_in, tokens_in / hold.call.tokens_in)
            if tokens_out is not None:
                self._longest_out = max(self._longest_out, tokens_out)
            self._charged_at_estimate += int(not known)
            self._close(hold, charge)
        return charge

    def charge_estimate(self, hold: Hold) -> None:
        """Charge an attempt whose reply never came back readable (a timeout) at its estimate."""
        with self._cond:
            self._charged_at_estimate += 1
            self._close(hold, hold.call.estimate_usd)

    def release(self, hold: Hold) -> None:
        """Give back a hold whose attempt cost nothing (an error answer, no connection)."""
        with self._cond:
            self._close(hold, None)

    def _close(self, hold: Hold, charge: float | None) -> None:
        self._reserved = max(0.0, self._reserved - hold.usd)
        self._in_flight -= 1
        self._settled += 1
        if charge is not None:
            self._spent += charge
            self._estimated_settled += hold.call.estimate_usd
        self._cond.notify_all()
