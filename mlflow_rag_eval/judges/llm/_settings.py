"""An LLM judge's settings: generation (part of its fingerprint) and fault handling."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["LLMSettings"]


@dataclass(frozen=True)
class LLMSettings:
    """Generation and fault-handling settings; generation ones are part of the fingerprint.

    Fault defaults, and why:

    - ``timeout`` 60 s is the *total* wall-clock time of one attempt (connect, wait, read),
      enforced while the reply streams by HTTP backends. A hosted model answers a judge prompt
      (at most ``max_tokens`` 1024 out) well within 30 s; 60 s leaves room for a slow moment.
      A CPU-only local server or a reasoning model needs more: raise it.
    - ``deadline`` 120 s bounds one judge call, retries and backoff included, and caps every
      attempt's budget: a row never waits longer than this on its judge (two full attempts,
      or many quick ones), so a server that hangs costs each row two minutes, not more.
    - ``max_retries`` 4 (five attempts): with ``backoff_base`` 0.5 s the waits grow 0.5, 1, 2,
      4 s (full jitter), enough to ride out a burst of 429s or a restart; a limit that
      persists past that is not a burst, and ``Retry-After`` is honoured within the deadline.
    - ``unreachable_after`` (fail-fast): after that many *consecutive connection failures*
      (refused, reset, host not found, no connection within the connect timeout), counted
      across all calls and threads of the judge and reset by any answer from the server, the
      judge raises :class:`JudgeUnreachable` and the evaluation stops with one error before
      anything is logged. None (the default) means twice the judge's concurrency, at least 8:
      the requests in flight can all fail together in one blip (a pooled connection dropped,
      a restart), so the count must also span their retries, i.e. the server stayed down
      through a round of backoff; a dead server is then declared in about a second and a few
      dozen calls. 0 turns fail-fast off. 5xx answers do not count: the server answered, and
      may be failing on one row only; they stay bounded per row by ``max_retries`` and
      ``deadline``. An HTTP answer of any status resets the count (the server is reachable);
      a timeout neither counts nor resets it (it has a count of its own, below).
    - ``unreachable_after_timeouts`` (fail-fast for a server that accepts connections but
      never answers): after that many *consecutive timeouts* (an attempt with no answer
      within its budget, ``timeout`` or what the deadline left), across all calls and threads,
      the judge raises :class:`JudgeUnreachable` too; otherwise such a server costs every row
      its whole deadline (100 rows x 4 metrics at CLI defaults: over an hour). A separate
      setting because timeouts, unlike refused connections, also come from a working server
      that is slow: a reasoning model or a CPU-only server on long prompts may time out often,
      and is set higher here, or 0 (off), without losing the connection fail-fast. None (the
      default) takes the ``unreachable_after`` limit (twice the concurrency, at least 8; 0
      turns both off). The count is safe for a slow server at high concurrency because it is
      of *consecutive* timeouts, reset by any HTTP answer: a server that answers even one
      request per round of ``concurrency`` timeouts never reaches twice that; only one that
      answered nothing through a round of requests and their retries (about ``2 x timeout``)
      is declared.
    - ``outage_budget`` 300 s (riding out an outage): a judge that *has answered* in this
      judge's life and then reaches either fail-fast count is in an outage, not unreachable:
      a provider that drops every connection for 20 s after 200 good calls (a deploy, a
      network blip) would otherwise cost the night's evaluation. Its calls then wait (their
      own deadlines and retries paused) while one request at a time probes the server, 1 s
      apart growing to 15 s; the first answer ends the outage and every call goes on. Only an
      outage longer than ``outage_budget``, counted from its first failure, stops the judge
      asking for the rest of the evaluation: the rows it had not judged fail as
      ``JudgeStopped`` at once and the run ends with every verdict given, marked stopped (a
      rerun takes those from the cache and asks only for the rest). A judge that never
      answered still fails fast (:class:`JudgeUnreachable`, nothing logged); 0 turns the wait
      off (fail fast always, as before).
    - ``rate_limit`` (requests per second): a provider's quota is per time, not per
      connection, and ``concurrency`` alone lets fast replies exceed it (then every request
      pays 429s and backoff). Each request, first attempt or retry, takes the next free slot
      ``1 / rate_limit`` s after the previous one, so no second-long window holds more than
      ``rate_limit`` requests; a slot past the call's deadline fails the row
      (``DeadlineExceeded``) instead of waiting.
    """

    temperature: float = 0.0
    max_tokens: int = 1024
    seed: int | None = None
    #: total seconds for one attempt (wall clock, reply read in full)
    timeout: float = 60.0
    #: seconds for one judge call, all retries and backoff included
    deadline: float = 120.0
    max_retries: int = 4
    backoff_base: float = 0.5
    backoff_max: float = 30.0
    #: consecutive connection failures before JudgeUnreachable; None: 2 x concurrency, >= 8
    unreachable_after: int | None = None
    #: consecutive timeouts before JudgeUnreachable; None: as ``unreachable_after``; 0: off
    unreachable_after_timeouts: int | None = None
    #: seconds a judge that answered before is waited for when it stops answering; 0: fail fast
    outage_budget: float = 300.0
    #: concurrent requests; None takes the provider's default
    concurrency: int | None = None
    #: requests per second sent to the provider by this judge, every thread and retry
    #: counted; None takes the provider's default (none: no limit). Not part of the
    #: fingerprint: it changes when a reply comes, never what it says
    rate_limit: float | None = None
    #: fuse extract + verify into one call
    fuse: bool = True
    #: embedding model for similarity (answer relevancy); never sent to the provider
    embedding_model: str = "minilm-l6"

    def generation_params(self) -> dict[str, Any]:
        params: dict[str, Any] = {"temperature": self.temperature, "max_tokens": self.max_tokens}
        if self.seed is not None:
            params["seed"] = self.seed
        return params
