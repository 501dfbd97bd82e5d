"""Judge options by allow-list: each provider takes the options it documents and no other, a URL
option takes no query string or userinfo, and a bad value is named by option and type, never
echoed (issue 38)."""

from __future__ import annotations

import re
from urllib.parse import quote

import pytest

from mlflow_rag_eval.judges import get_judge
from mlflow_rag_eval.judges.providers import bedrock, endpoints, llamacpp, openai
from mlflow_rag_eval.judges.providers.endpoints import MlflowEndpointsBackend
from mlflow_rag_eval.judges.providers.openai import OpenAICompatBackend

SECRET = "sk-live-OPTIONS-leak-9Xq2"


def _no_secret_in(message: str) -> None:
    assert SECRET not in message and SECRET.lower() not in message.lower() and quote(SECRET) not in message


@pytest.mark.parametrize("query", [f"bearer={SECRET}", f"hmac={SECRET}", f"apisig={SECRET}", f"pw={SECRET}",
                                   f"x=1;api-key={SECRET}", f"x=1&y={SECRET}"])
@pytest.mark.parametrize("scheme", ["openai", "endpoints"])
def test_a_url_option_with_a_query_string_is_refused_without_echo(scheme, query):
    url = f"http://127.0.0.1:8000/v1?{query}"
    option = "base_url" if scheme == "openai" else "target_uri"
    with pytest.raises(ValueError) as refused:
        get_judge(f"{scheme}:/m?{option}={quote(url, safe='')}")
    _no_secret_in(str(refused.value))
    with pytest.raises(ValueError) as direct:
        OpenAICompatBackend("m", base_url=url) if scheme == "openai" else MlflowEndpointsBackend("m", target_uri=url)
    _no_secret_in(str(direct.value))


@pytest.mark.parametrize("url", [f"http://user:{SECRET}@127.0.0.1:8000/v1", f"http://{SECRET}@127.0.0.1/v1",
                                 f"http://127.0.0.1:8000/v1;key={SECRET}"])
def test_userinfo_and_path_parameters_are_refused_on_every_way_in(url, monkeypatch):
    for build in (lambda: OpenAICompatBackend("m", base_url=url),
                  lambda: get_judge(f"openai:/m?base_url={quote(url, safe='')}"),
                  lambda: MlflowEndpointsBackend("m", target_uri=url)):
        with pytest.raises(ValueError) as refused:
            build()
        _no_secret_in(str(refused.value))
    monkeypatch.setenv("OPENAI_BASE_URL", url)
    with pytest.raises(ValueError) as from_env:
        OpenAICompatBackend("m")
    _no_secret_in(str(from_env.value))


@pytest.mark.parametrize("name, option, expected", [
    (f"openai:/m?concurrency={SECRET}", "concurrency", "positive integer"),
    (f"openai:/m?rate_limit={SECRET}", "rate_limit", "positive number"),
    (f"openai:/m?supports_schema={SECRET}", "supports_schema", "true or false"),
    (f"endpoints:/chat?target_uri=databricks&concurrency={SECRET}", "concurrency", "positive integer"),
    (f"bedrock:/m?concurrency={SECRET}", "concurrency", "positive integer"),
    (f"llamacpp:/m.gguf?seed={SECRET}", "seed", "integer"),
    (f"local:minilm-l6?support_threshold={SECRET}", "support_threshold", "number"),
])
def test_a_bad_option_value_is_named_by_option_and_type_never_echoed(name, option, expected):
    with pytest.raises(ValueError, match=rf"option {option} .*expected (an? )?{expected}") as bad:
        get_judge(name)
    _no_secret_in(str(bad.value))


def test_a_bad_value_given_to_the_class_is_named_by_type():
    with pytest.raises(ValueError, match="default_concurrency must be a positive integer, got a str") as bad:
        OpenAICompatBackend("m", base_url="http://127.0.0.1:8000/v1", default_concurrency=SECRET)
    _no_secret_in(str(bad.value))
    with pytest.raises(ValueError, match="response_format must be one of") as fmt:
        OpenAICompatBackend("m", base_url="http://127.0.0.1:8000/v1", response_format=SECRET)
    _no_secret_in(str(fmt.value))


@pytest.mark.parametrize("module, parser", [(openai, "parse_openai_target"), (endpoints, "parse_endpoints_target"),
                                            (bedrock, "parse_bedrock_target"), (llamacpp, "parse_llamacpp_target")])
def test_each_provider_accepts_exactly_the_options_it_documents(module, parser):
    documented = set(re.findall(r"``(\w+)``", getattr(module, parser).__doc__ or ""))
    accepted = set(module._TARGET_OPTIONS)
    assert accepted <= documented, f"accepted but not documented: {sorted(accepted - documented)}"
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['undocumented'\]"):
        get_judge(f"{module.__name__.rsplit('.', 1)[1]}:/m?undocumented=1")
