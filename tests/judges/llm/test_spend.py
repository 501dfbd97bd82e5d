"""The cap held call by call (``judges/llm/spend.py``): the ledger's reservations under real
threads, and a real ``LLMJudge`` metered by it against the fake priced judge server on loopback."""

from __future__ import annotations

import threading
import time

import pytest

from mlflow_rag_eval.judges.base import JudgeFailure, VerifyItem
from mlflow_rag_eval.judges.llm.judge import LLMJudge
from mlflow_rag_eval.judges.llm.spend import BudgetExhausted, CallCost, CostLedger
from mlflow_rag_eval.judges.providers.openai import OpenAICompatBackend
from mlflow_rag_eval.testing import FakeJudgeServer

#: a call held at $1 at most ($0.20 estimated): one prompt token at $0.20, up to 8 reply tokens at $0.10
DOLLAR = CallCost(tokens_in=1, tokens_out=0, max_tokens_out=8, price_in=0.2, price_out=0.1)


def test_reservations_are_atomic_and_wait_for_room_held_by_calls_in_flight():
    ledger = CostLedger(max_cost=6.0)
    ledger.settle(ledger.reserve(DOLLAR), 1, 0)  # the first call: $0.20 spent
    held, failed = [], []

    def reserve() -> None:
        try:
            held.append(ledger.reserve(DOLLAR, deadline=time.monotonic() + 0.5))
        except JudgeFailure as exc:
            failed.append(exc.kind)

    threads = [threading.Thread(target=reserve) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # $5.80 of room, $1 a hold: five holds, whatever the interleaving; the others waited for
    # room the holds kept, and gave up at their deadline (nothing was refused: room may come).
    assert len(held) == 5 and failed == ["DeadlineExceeded"] * 11 and ledger.calls_refused == 0
    for hold in held:
        ledger.settle(hold, 1, 8)  # each cost its most: $1
    assert ledger.spent == pytest.approx(5.2)
    with pytest.raises(BudgetExhausted, match=r"max_cost=\$6 reached: \$5\.2000 spent, the next judge call may "
                                              r"cost up to \$1\.0000"):
        ledger.reserve(DOLLAR)  # nothing in flight, no room: refused, and the ledger stopped
    cheap = CallCost(tokens_in=1, tokens_out=0, max_tokens_out=0, price_in=0.01, price_out=0.0)
    with pytest.raises(BudgetExhausted):
        ledger.reserve(cheap)  # a stopped ledger refuses every later call, however cheap
    assert ledger.calls_refused == 2 and ledger.stopped.startswith("max_cost=$6 reached")


def test_the_first_call_goes_alone_and_what_it_reports_holds_the_next():
    ledger = CostLedger(max_cost=50.0)
    first = ledger.reserve(DOLLAR)
    second: list = []
    waiting = threading.Thread(target=lambda: second.append(ledger.reserve(DOLLAR)))
    waiting.start()
    waiting.join(0.3)
    assert waiting.is_alive()  # held back until the first call settles
    ledger.settle(first, 100, 0)  # the server counted 100 prompt tokens for an estimate of 1: $20
    waiting.join(5)
    assert second[0].usd == pytest.approx(100 * 0.2 + 8 * 0.1)  # the next is held at that rate
    with pytest.raises(JudgeFailure, match="DeadlineExceeded"):
        ledger.reserve(DOLLAR, deadline=time.monotonic() + 0.2)  # no room beside the second's hold
    ledger.settle(second[0], 100, 8)  # $20.80
    with pytest.raises(BudgetExhausted, match=r"\$40\.8000 spent, the next judge call may cost up to \$20\.8000"):
        ledger.reserve(DOLLAR)
    assert ledger.spent == pytest.approx(40.8)


def test_usage_settles_a_call_a_reply_without_usage_is_charged_at_its_estimate_an_error_at_nothing():
    ledger = CostLedger()  # no cap: spend is recorded, nothing refused
    assert ledger.settle(ledger.reserve(DOLLAR), 2, 3) == pytest.approx(2 * 0.2 + 3 * 0.1)
    assert ledger.settle(ledger.reserve(DOLLAR), None, None) == pytest.approx(DOLLAR.estimate_usd)
    assert ledger.settle(ledger.reserve(DOLLAR), 2, None) == pytest.approx(2 * 0.2)  # its reply part estimated: 0
    ledger.release(ledger.reserve(DOLLAR))  # a 429: no reply, not charged
    ledger.charge_estimate(ledger.reserve(DOLLAR))  # a timeout: charged at the estimate
    assert ledger.spent == pytest.approx(0.7 + 0.2 + 0.4 + 0.2)
    assert ledger.charged_at_estimate == 3 and ledger.calls_refused == 0


def _billed(server: FakeJudgeServer, price_in: float = 0.15, price_out: float = 0.60) -> float:
    """What the server's replies cost as it counted their usage (its generated completions are
    a function of the request), at gpt-4o-mini's list price."""
    total = 0
    for request in server.requests:
        usage = server._completion(request["body"])["usage"]
        total += usage["prompt_tokens"] * price_in + usage["completion_tokens"] * price_out
    return total / 1e6


def test_a_metered_judge_stops_at_the_cap_across_its_threads(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    items = [VerifyItem([f"Passage {i}: bikes cost {i} euros on line {i}."], [f"Bikes cost {i} euros."])
             for i in range(40)]
    with FakeJudgeServer(model="gpt-4o-mini", latency=0.02) as server:
        judge = LLMJudge(OpenAICompatBackend(model="gpt-4o-mini", base_url=server.base_url),
                         cache=False, concurrency=8)
        # Each call costs ~$0.00006 and is held at ~$0.00066 (max_tokens 1024) before it is sent:
        # the cap has room for a part of the 40 only.
        cap = 0.0015
        ledger = CostLedger(max_cost=cap)
        with judge.metered(ledger):
            out = judge.verify(items)
        with judge.metered(CostLedger()):
            assert judge._transport.ledger is not ledger
        assert judge._transport.ledger is None  # metering ends with the block
    refused = [o for o in out if isinstance(o, JudgeFailure)]
    assert refused and {o.kind for o in refused} == {"BudgetExhausted"}
    assert 0 < len(out) - len(refused) == server.calls == judge.usage_.provider_calls  # a refused call is never sent
    assert ledger.spent == pytest.approx(_billed(server)) and _billed(server) <= cap
    assert ledger.calls_refused == len(refused) and ledger.stopped.startswith(f"max_cost=${cap:g} reached")
    assert judge.usage_.errors["BudgetExhausted"] == len(refused)
