"""Fail-fast for a server that accepts connections but never answers: consecutive timeouts,
across calls and threads and reset by any answer, declare the judge unreachable, so the
evaluation stops after about the limit's calls instead of rows x attempts x timeout."""

from __future__ import annotations

import re

import pandas as pd
import pytest

from mlflow_rag_eval.evaluation.engine import evaluate_records
from mlflow_rag_eval.judges.base import ClaimsItem, JudgeUnreachable
from mlflow_rag_eval.judges.llm import transport as transport_module
from mlflow_rag_eval.judges.llm.judge import LLMJudge
from mlflow_rag_eval.judges.providers.openai import OpenAICompatBackend
from mlflow_rag_eval.judges.providers.scripted import ScriptedBackend
from mlflow_rag_eval.records import records_from_frame
from mlflow_rag_eval.testing import FakeJudgeServer, Reply

PASSAGES = ["Bikes travel for a flat fare of 5 euros per journey."]
TIMEOUT = 0.2
#: Longer than TIMEOUT: no answer within an attempt.
SILENT = Reply(delay=5.0)


@pytest.fixture(autouse=True)
def fresh_format_memory(monkeypatch):
    """Schema fallbacks are remembered per server for the process; ports get reused."""
    monkeypatch.setattr(transport_module, "_FORMAT_MEMORY", {})


def judge_for(server: FakeJudgeServer, **settings) -> LLMJudge:
    # A tiny backoff: the test is about counts, not about waiting between retries.
    settings = {"timeout": TIMEOUT, "backoff_base": 0.01, **settings}
    return LLMJudge(OpenAICompatBackend("m", base_url=server.base_url), cache=False, **settings)


def test_a_server_that_never_answers_stops_the_evaluation_after_about_the_limit():
    n = 24
    frame = pd.DataFrame({"question": [f"Question {i}?" for i in range(n)],
                          "answer": [f"Row {i}: bikes cost 7 euros." for i in range(n)],
                          "contexts": [PASSAGES] * n})
    with FakeJudgeServer(reply=SILENT) as server:
        judge = judge_for(server, concurrency=4)
        limit = judge._unreachable_limit()  # the default: as for connection failures
        with pytest.raises(JudgeUnreachable) as caught:
            evaluate_records(records_from_frame(frame), metrics=["faithfulness"], judge=judge)
        calls = server.calls
    assert limit == judge._transport.timeout_limit() == 8
    # The count said is the one its thread saw: the limit, or more when requests in flight timed
    # out at the same moment.
    message = re.fullmatch(
        re.escape(f"judge {judge.name!r} is unreachable: ") + r"(\d+)" + re.escape(
            f" consecutive timeouts: the server accepts connections but does not answer within {TIMEOUT:g} s. "
            "Check that it is not hung or overloaded, or raise LLMSettings.timeout; the evaluation stopped "
            f"before logging anything (LLMSettings.unreachable_after_timeouts={limit})"),
        str(caught.value))
    assert message and limit <= int(message.group(1)) <= limit + judge.concurrency, str(caught.value)
    # The limit, plus the requests already in flight when it was reached; not 24 rows x 5 attempts.
    assert limit <= calls <= limit + judge.concurrency, calls
    assert limit <= judge.usage()["provider_calls"] <= limit + judge.concurrency


def test_any_answer_resets_the_count_so_a_slow_server_is_not_declared():
    """One row at a time, each timing out once and then answered: six timeouts in all, never two
    in a row, so a limit of 3 is not reached; then the server goes silent and the third
    consecutive timeout stops it (9 calls, not 5, which counting every timeout would give)."""
    with FakeJudgeServer(reply=SILENT) as server:
        server.script(*[SILENT, Reply()] * 3)  # Reply(): the generated, valid completion
        # A timeout a loaded machine cannot miss for an answer that comes at once.
        # outage_budget=0: the count alone decides (a judge that answered before and then goes
        # silent is otherwise waited for, test_faults.py's outage tests)
        judge = judge_for(server, concurrency=1, max_retries=1, unreachable_after=3, timeout=1.0, outage_budget=0)
        items = [ClaimsItem(f"Row {i}: bikes cost 7 euros.", PASSAGES) for i in range(6)]
        with pytest.raises(JudgeUnreachable, match="3 consecutive timeouts"):
            judge.extract_and_verify(items)
        assert server.calls == 9
    usage = judge.usage()
    assert usage["provider_calls"] == 9 and usage["retries"] == 4  # rows 0-2 and 3 retried once


def test_the_timeout_limit_follows_unreachable_after_unless_set():
    def limit(**settings) -> int:
        return LLMJudge(ScriptedBackend(), cache=False, **settings)._transport.timeout_limit()

    concurrency = ScriptedBackend.default_concurrency
    assert limit() == max(8, 2 * concurrency)
    assert limit(unreachable_after=5) == 5
    assert limit(unreachable_after=0) == 0  # fail-fast off: both counts
    assert limit(unreachable_after=0, unreachable_after_timeouts=3) == 3
    assert limit(unreachable_after_timeouts=0) == 0  # timeouts off, connection failures still counted
    assert LLMJudge(ScriptedBackend(), cache=False, unreachable_after_timeouts=0)._unreachable_limit() > 0
