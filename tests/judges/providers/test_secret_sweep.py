"""Every judge provider against a server that echoes its credentials in every encoding: after a
whole evaluation, no spelling of any secret is in any sink (the store file, the artifacts, the
judge cache, stdout, stderr, the logs at DEBUG). Issue 38."""

from __future__ import annotations

import logging

import boto3
import mlflow
import pandas as pd
import pytest
from botocore.config import Config
from conftest import figures_of
from echoing_server import EchoingServer, secret_forms

from mlflow_rag_eval.judges import get_judge
from mlflow_rag_eval.judges.cache import JudgeCache
from mlflow_rag_eval.judges.providers.bedrock import BedrockBackend
from mlflow_rag_eval.judges.providers.openai import OpenAICompatBackend
from mlflow_rag_eval.judges.registry import llm_judge

API_KEY = "sk-live-SWEEP-api-key-3f9Q/x+7Zq"
AZURE_KEY = "azure-SWEEP-key-0b8f2a4c9d"  # in a variable named like no credential: known once sent
HEADER_SECRET = "hdr-SWEEP-custom-8Kp2+Lm/"
PASSWORD = "mlflow-SWEEP-pass-5Tz!w"
TOKEN = "dapi-SWEEP-token-77e1c0ffee"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/SWEEP+secretKEY"
AWS_TOKEN = "FwoGZXIvYXdzSWEEPsessionTOKEN//0123"
ALL_SECRETS = (API_KEY, AZURE_KEY, HEADER_SECRET, PASSWORD, f"gateway-user:{PASSWORD}", TOKEN, AWS_SECRET,
               AWS_TOKEN)
SETTINGS = {"max_retries": 0, "unreachable_after": 0, "timeout": 10}

ROWS = pd.DataFrame({
    "question": [f"How much does a bike ticket cost, case {i}?" for i in range(4)],
    "answer": [f"A bike ticket costs 5 euros, {i} times." for i in range(4)],  # no two prompts alike
    "contexts": [["Bikes travel for a flat fare of 5 euros."]] * 4,
})


def _openai_bearer(root, cache, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    return get_judge(f"openai:/gpt-4o-mini?base_url={root}/v1", cache=cache, **SETTINGS)


def _openai_azure(root, cache, monkeypatch):
    monkeypatch.setenv("SWEEP_AZURE_KEY", AZURE_KEY)
    return get_judge(f"openai:/dep?base_url={root}&azure_api_version=2024-10-21&api_key_env=SWEEP_AZURE_KEY",
                     cache=cache, **SETTINGS)


def _openai_custom_header(root, cache, monkeypatch):
    backend = OpenAICompatBackend("m", base_url=f"{root}/v1", api_key_env="SWEEP_UNSET",
                                  headers={"X-Custom-Auth": HEADER_SECRET})
    return llm_judge(backend, name="openai:/m", cache=cache, **SETTINGS)


def _endpoints_basic(root, cache, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "gateway-user")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", PASSWORD)
    return get_judge(f"endpoints:/chat?target_uri={root}", cache=cache, **SETTINGS)


def _endpoints_token(root, cache, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", TOKEN)
    return get_judge(f"endpoints:/chat?target_uri={root}", cache=cache, **SETTINGS)


def _bedrock(root, cache, monkeypatch):
    # Credentials given to the client only: the redactor learns them from what boto3 holds.
    client = boto3.client("bedrock-runtime", endpoint_url=root, region_name="us-east-1",
                          aws_access_key_id="AKIASWEEPTEST0000", aws_secret_access_key=AWS_SECRET,
                          aws_session_token=AWS_TOKEN, config=Config(retries={"total_max_attempts": 1}))
    return llm_judge(BedrockBackend("anthropic.claude-sweep", client=client), name="bedrock:/anthropic.claude-sweep",
                     cache=cache, **SETTINGS)


PROVIDERS = {
    "openai bearer": _openai_bearer, "openai azure api-key": _openai_azure,
    "openai custom header": _openai_custom_header, "endpoints basic auth": _endpoints_basic,
    "endpoints token": _endpoints_token, "bedrock": _bedrock,
}


@pytest.mark.parametrize("provider", sorted(PROVIDERS))
def test_no_spelling_of_any_secret_reaches_any_sink(provider, tracking_uri, tmp_path, monkeypatch, capfd, caplog):
    caplog.set_level(logging.DEBUG)
    # The AWS secret key never goes on the wire (SigV4 signs with it): the server "knows" it anyway.
    with EchoingServer(known=(AWS_SECRET,) if provider == "bedrock" else ()) as server:
        cache = JudgeCache(tmp_path / "judge_cache" / "cache.sqlite")
        judge = PROVIDERS[provider](server.root, cache, monkeypatch)
        with mlflow.start_run():
            result = mlflow.models.evaluate(data=ROWS, model_type="rag", evaluators="rag",
                                            evaluator_config={"judge": judge, "metrics": ["faithfulness"]})
        cache.close()
    # Every kind of answer came back (verdicts, 500s, 401s, replies that are no verdict)...
    assert len(server.requests) >= len(ROWS)
    assert 0 < figures_of(result)["faithfulness/n_error"] < len(ROWS)
    sent = [v for r in server.requests for k, v in r.items() if k in ("authorization", "api-key", "x-custom-auth",
                                                                      "x-amz-security-token")]
    assert sent, "the request carried no credential: nothing was tested"
    # ...and no spelling of a secret is anywhere the run wrote or said.
    out, err = capfd.readouterr()
    # Every log record at DEBUG, but botocore's own: at DEBUG it logs each request's headers (the
    # session token), as boto3's documentation warns; silencing it would change the caller's logging.
    logs = "\n".join(f"{r.name}: {r.getMessage()}" for r in caplog.records if not r.name.startswith("botocore"))
    sinks = {"stdout": out, "stderr": err, "logs": logs}
    for path in tmp_path.rglob("*"):
        if path.is_file():
            sinks[str(path.relative_to(tmp_path))] = path.read_bytes().decode("utf-8", "replace")
    assert any(p.endswith("eval_results_table.json") for p in sinks) and any("cache.sqlite" in p for p in sinks)
    found = [(secret, form, where) for secret in ALL_SECRETS for form, spelled in secret_forms(secret).items()
             for where, text in sinks.items() if spelled in text]
    assert not found, found[:10]
