"""llama.cpp judges: the in-process ``llamacpp:/`` backend, and a model served by
``llama_cpp.server`` driven through the ``openai:/`` provider.

SmolLM2-135M judges at chance level: these tests check wire paths (requests, structured output,
parsing, named failures, cache, accounting), never the quality of a verdict. Token budgets are
small because the model rarely stops before ``max_tokens`` and the test machine has 2 cores.
"""

from __future__ import annotations

import hashlib
import re

import pandas as pd
import pytest
from llama_server import free_port, gguf_path, need_llama_cpp

from mlflow_rag_eval.evaluation.engine import evaluate_records
from mlflow_rag_eval.judges import ClaimsItem, JudgeFailure, RelevanceItem, Verdict, VerifyItem, get_judge
from mlflow_rag_eval.judges.cache import JudgeCache
from mlflow_rag_eval.judges.llm.chat import ChatBackend, ChatRequest, PermanentError
from mlflow_rag_eval.judges.llm.judge import LLMJudge
from mlflow_rag_eval.judges.providers.llamacpp import LlamaCppBackend
from mlflow_rag_eval.records import records_from_frame

PASSAGES = ["Bikes travel for a flat fare of 5 euros per journey.", "Dogs travel free on all trains."]
#: "Kind: message", the shape of every named row error and JudgeFailure
NAMED_ERROR = re.compile(r"^[A-Z][A-Za-z]+: ")
METRICS = ["faithfulness", "context_relevance", "context_recall"]
#: small enough to keep a call near 2 s on 2 cores; SmolLM2 fills whatever it is given
IN_PROCESS_MAX_TOKENS = 48
SERVED_MAX_TOKENS = 64


def served_rows():
    return records_from_frame(pd.DataFrame({
        "question": ["How much is a bike ticket?", "Can dogs travel?", "When does the last train leave?"],
        "answer": ["A bike ticket costs 5 euros.", "Dogs travel free.", "The last train leaves at 23:40."],
        "contexts": [[PASSAGES[0]], [PASSAGES[1]], ["The last train departs at 23:40 from platform 2."]],
        "reference": ["Bikes cost 5 euros per journey.", "Dogs travel free.", "The last train leaves at 23:40."],
    }))


def is_named_failure(outcome) -> bool:
    return isinstance(outcome, JudgeFailure) and NAMED_ERROR.match(str(outcome)) is not None


def assert_rows_scored_or_named(result, log: str = "") -> None:
    for metric in result.metrics:
        errors = 0
        for row in metric.rows:
            if row.status == "error":
                errors += 1
                assert NAMED_ERROR.match(row.error), (metric.name, row.error, log)
            else:
                assert row.status == "scored" and 0.0 <= row.value <= 1.0, (metric.name, row, log)
        assert metric.summary.n_error == errors and metric.summary.n_scored == len(metric.rows) - errors


@pytest.fixture(scope="module")
def gguf():
    need_llama_cpp()
    return gguf_path()


# -- in process ------------------------------------------------------------------------------

def test_backend_is_identified_by_the_gguf_hash_and_loads_lazily(gguf):
    backend = LlamaCppBackend(str(gguf))
    assert isinstance(backend, ChatBackend)
    assert (backend.provider, backend.model, backend.base_url, backend.supports_schema) == (
        "llamacpp", gguf.name, None, True)
    identity = backend.identity()
    assert identity["sha256"] == hashlib.sha256(gguf.read_bytes()).hexdigest()
    assert identity["n_ctx"] == 4096 and identity["model"] == gguf.name
    assert backend._llama is None  # identity hashes the file; only complete() loads the model
    with pytest.raises(FileNotFoundError, match="no GGUF"):
        LlamaCppBackend(str(gguf.with_name("missing.gguf")))


def test_in_process_judge_gives_schema_valid_verdicts_or_named_failures(gguf):
    judge = get_judge(f"llamacpp:/{gguf}", cache=False, max_tokens=IN_PROCESS_MAX_TOKENS)
    assert isinstance(judge.backend, LlamaCppBackend) and judge.backend.path == gguf
    judge.backend.n_threads = 1  # read at load; on 2 busy cores one thread is several times faster
    fused = judge.extract_and_verify([ClaimsItem("Bikes cost 5 euros. Cats fly.", PASSAGES),
                                      ClaimsItem("Dogs travel free.", PASSAGES)])
    relevance = judge.rate_relevance([RelevanceItem("How much is a bike ticket?", PASSAGES),
                                      RelevanceItem("Can dogs travel?", PASSAGES[1:])])
    claims = [["Bikes cost 5 euros.", "Cats fly."], ["Dogs travel free."]]
    verified = judge.verify([VerifyItem(PASSAGES, claims[0]), VerifyItem(PASSAGES, claims[1])])
    judge.close()

    assert len(fused) == len(relevance) == len(verified) == 2
    for outcome in fused:
        assert is_named_failure(outcome) or all(
            isinstance(c, str) and c.strip() and isinstance(v.value, bool) for c, v in outcome), outcome
    for outcome, n in zip(relevance, (2, 1)):
        assert is_named_failure(outcome) or (
            len(outcome) == n and all(isinstance(v, Verdict) and isinstance(v.value, bool) for v in outcome)), outcome
    for outcome, row in zip(verified, claims):
        assert is_named_failure(outcome) or (
            len(outcome) == len(row) and all(isinstance(v.value, bool) for v in outcome)), outcome

    assert judge.info().model_files_sha256 == hashlib.sha256(gguf.read_bytes()).hexdigest()
    usage = judge.usage()
    assert usage["provider_calls"] >= 6 and usage["tokens_in"] > 0 and usage["tokens_out"] > 0
    assert set(usage["models"]) == {gguf.name}  # the file name, never the local path


def test_a_prompt_longer_than_the_context_is_a_permanent_context_overflow(gguf):
    backend = LlamaCppBackend(str(gguf), n_ctx=64)
    request = ChatRequest(messages=[{"role": "user", "content": "Dogs travel free on all trains. " * 40}],
                          params={"max_tokens": 4})
    with pytest.raises(PermanentError) as caught:
        backend.complete(request)
    assert caught.value.kind == "ContextOverflow"
    judge = LLMJudge(backend, cache=False, max_tokens=4)
    (outcome,) = judge.verify([VerifyItem(["Dogs travel free on all trains. " * 40], ["Dogs travel."])])
    assert isinstance(outcome, JudgeFailure) and outcome.kind == "ContextOverflow"
    assert judge.usage()["provider_calls"] == 1  # permanent: not retried


# -- served by llama_cpp.server, through the openai provider ----------------------------------

def test_llama_server_takes_a_schema_as_json_object_not_json_schema(llama_server):
    """Pins what llama-cpp-python's server accepts: hence ``response_format=json_object``."""
    import requests

    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    body = {"model": "smollm2", "max_tokens": 12, "temperature": 0,
            "messages": [{"role": "user", "content": "Is water wet? Answer in JSON."}]}
    url = f"{llama_server.base_url}/chat/completions"
    openai_form = {"type": "json_schema", "json_schema": {"name": "r", "schema": schema, "strict": True}}
    rejected = requests.post(url, json={**body, "response_format": openai_form}, timeout=30)
    assert rejected.status_code == 500 and "json_object" in rejected.text, rejected.text
    accepted = requests.post(url, json={**body, "response_format": {"type": "json_object", "schema": schema}},
                             timeout=30)
    assert accepted.status_code == 200, accepted.text
    assert accepted.json()["choices"][0]["message"]["content"].replace(" ", "") in ('{"ok":true}', '{"ok":false}')


def _served_judge(server, cache: JudgeCache, **overrides) -> LLMJudge:
    settings = {"cache": cache, "max_tokens": SERVED_MAX_TOKENS, "max_retries": 1,
                "backoff_base": 0.01, "backoff_max": 0.05, **overrides}
    # The openai provider as shipped, told to send the schema the way this server takes it.
    return get_judge(server.judge_name(concurrency="1") + "&response_format=json_object", **settings)


def test_served_model_evaluates_end_to_end_and_reruns_from_the_cache(llama_server, tmp_path):
    records = served_rows()
    cache_path = tmp_path / "cache.sqlite"
    first = _served_judge(llama_server, JudgeCache(cache_path))
    result = evaluate_records(records, METRICS, first)
    first.close()
    assert_rows_scored_or_named(result, llama_server.log_tail())
    usage = first.usage()
    assert usage["provider_calls"] > 0 and usage["models"], (usage, llama_server.log_tail())

    # The rerun replays the cache only: with no time left (deadline 0) an ask that is not cached
    # fails at once as DeadlineExceeded instead of asking the model again. The deadline is not
    # part of the cache key, so every reply that parsed the first time must be a hit.
    second = _served_judge(llama_server, JudgeCache(cache_path), deadline=0.0)
    again = evaluate_records(records, METRICS, second)
    second.close()
    replay = second.usage()
    asks = sum(usage["templates"].values())
    failed_asks = sum(usage["errors"].values())  # failures are never cached
    assert failed_asks < asks, f"no reply parsed, nothing to replay: raise SERVED_MAX_TOKENS ({usage})"
    assert replay["provider_calls"] == 0
    assert replay["cache_hits"] == asks - failed_asks
    assert replay["errors"] == ({"DeadlineExceeded": failed_asks} if failed_asks else {})
    for before, after in zip(result.metrics, again.metrics):
        assert [r.value for r in after.rows] == [r.value for r in before.rows]
        assert [r.status for r in after.rows] == [r.status for r in before.rows]


def test_connection_refused_is_a_named_row_error_not_an_exception():
    port = free_port()  # nothing listens there
    judge = get_judge(f"openai:/smollm2?base_url=http://127.0.0.1:{port}/v1", cache=False,
                      max_retries=1, backoff_base=0.01, backoff_max=0.02)
    result = evaluate_records(served_rows()[:1], ["faithfulness"], judge)
    (row,) = result.metrics[0].rows
    assert row.error.startswith("ConnectionError: ") and result.metrics[0].summary.n_error == 1
    assert judge.usage()["provider_calls"] == 2 and judge.usage()["retries"] == 1
