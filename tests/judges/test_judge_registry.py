"""Judge names -> judges through the provider registry: every provider, its options, laziness,
missing extras and third-party providers from the entry-point group."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import ROOT  # noqa: E402

from mlflow_rag_eval.judges import Judge, MissingJudgeDependency, get_judge, known_schemes, registry
from mlflow_rag_eval.judges.llm.judge import LLMJudge, LLMSettings
from mlflow_rag_eval.judges.local_model.support_model import default_model_path
from mlflow_rag_eval.judges.providers.local import LocalJudge, LocalJudgeSettings

BEDROCK_MODEL = "anthropic.claude-3-5-haiku-20241022-v1:0"
BUILTIN = ["bedrock", "endpoints", "llamacpp", "local", "openai", "panel", "scripted"]


@pytest.fixture(autouse=True)
def isolated_registry(monkeypatch):
    """What a test registers leaves with it. Built-in providers stay: their modules stay
    imported, and a module imported once does not register again."""
    before = set(registry._PROVIDERS)
    monkeypatch.setattr(registry, "_INSTALL_HINTS", dict(registry._INSTALL_HINTS))
    monkeypatch.setattr(registry, "BUILTIN", dict(registry.BUILTIN))
    yield
    for scheme in set(registry._PROVIDERS) - before - set(registry.BUILTIN):
        del registry._PROVIDERS[scheme]


@pytest.fixture(autouse=True)
def no_aws(monkeypatch, tmp_path):
    """No real AWS configuration can leak into (or be read by) these tests."""
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "aws_config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "aws_credentials"))
    for name in ("AWS_PROFILE", "AWS_DEFAULT_REGION", "AWS_REGION"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def gguf(tmp_path) -> Path:
    """A file where a GGUF model would be (the backend loads it only on the first call)."""
    path = tmp_path / "tiny.gguf"
    path.write_bytes(b"GGUF not a real model")
    return path


# -- the two reproduced bugs --------------------------------------------------------------------
def test_bedrock_region_comes_from_the_name_not_the_model_id():
    judge = get_judge(f"bedrock:/{BEDROCK_MODEL}?region_name=us-west-2&profile_name=eval")
    assert isinstance(judge, LLMJudge)
    assert judge.backend.model == BEDROCK_MODEL  # no "?region_name=..." left in the model id
    assert (judge.backend.region_name, judge.backend.profile_name) == ("us-west-2", "eval")
    assert judge.backend.identity()["region"] == "us-west-2"
    assert judge.name == f"bedrock:/{BEDROCK_MODEL}"


def test_endpoints_target_uri_comes_from_the_name(monkeypatch):
    monkeypatch.setenv("MLFLOW_DEPLOYMENTS_TARGET", "http://127.0.0.1:5999")
    judge = get_judge("endpoints:/chat?target_uri=http://127.0.0.1:5001/")
    assert (judge.backend.model, judge.backend.base_url) == ("chat", "http://127.0.0.1:5001")
    assert judge.backend.identity()["base_url"] == "http://127.0.0.1:5001"
    # Without target_uri, the MLflow deployments target.
    assert get_judge("endpoints:/chat").backend.base_url == "http://127.0.0.1:5999"


# -- each provider's name options ---------------------------------------------------------------
def test_local_names_and_thresholds():
    default = get_judge()
    assert isinstance(default, LocalJudge) and default.settings == LocalJudgeSettings()
    named = get_judge("local:minilm-l6?support_threshold=0.7&relevance_threshold=0.4")
    assert (named.settings.support_threshold, named.settings.relevance_threshold) == (0.7, 0.4)
    assert named.info().fingerprint != default.info().fingerprint
    keyword = get_judge("local:minilm-l6?support_threshold=0.7", abstention_threshold=0.8)
    assert (keyword.settings.support_threshold, keyword.settings.abstention_threshold) == (0.7, 0.8)
    # A folder path is kept as written (absolute paths keep their slash).
    assert get_judge("local:/models/my-st-model").settings.model == "/models/my-st-model"
    assert get_judge("local").settings.model == "minilm-l6"


def test_local_refuses_llm_settings_and_unknown_options():
    with pytest.raises(ValueError, match=r"\['timeout'\].*allowed: \['abstention_threshold'"):
        get_judge("local:minilm-l6", timeout=30)
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['temperature'\].*support_threshold"):
        get_judge("local:minilm-l6?temperature=0")
    with pytest.raises(ValueError, match="support_threshold"):
        get_judge("local:minilm-l6?support_threshold=high")


def test_openai_options():
    judge = get_judge(
        "openai:/llama3.1:8b?base_url=http://127.0.0.1:11434/v1&response_format=json_object&concurrency=1"
        "&supports_schema=true&api_key_env=MY_KEY&azure_api_version=2024-10-21",
        timeout=180, deadline=400,
    )
    backend = judge.backend
    assert (backend.model, backend.base_url) == ("llama3.1:8b", "http://127.0.0.1:11434/v1")
    assert (backend.response_format, backend.default_concurrency, backend.supports_schema) == ("json_object", 1, True)
    assert (backend.api_key_env, backend.azure_api_version) == ("MY_KEY", "2024-10-21")
    assert (judge.settings.timeout, judge.settings.deadline) == (180, 400)
    assert judge.name == "openai:/llama3.1:8b"


def test_bedrock_options():
    judge = get_judge(f"bedrock:/{BEDROCK_MODEL}?region_name=eu-central-1&supports_schema=true&concurrency=2")
    assert (judge.backend.region_name, judge.backend.supports_schema) == ("eu-central-1", True)
    assert judge.backend.default_concurrency == 2
    # The model id keeps its own ":" and the scheme's one "/" is not part of it.
    assert get_judge(f"bedrock:{BEDROCK_MODEL}").backend.model == BEDROCK_MODEL


def test_endpoints_options():
    judge = get_judge("endpoints:/chat?target_uri=databricks&supports_schema=true&concurrency=3")
    assert (judge.backend.base_url, judge.backend.supports_schema) == ("databricks", True)
    assert judge.backend.default_concurrency == 3


def test_llamacpp_options(gguf):
    judge = get_judge(f"llamacpp:/{gguf}?n_ctx=2048&n_threads=2&seed=0", max_tokens=64)
    backend = judge.backend
    assert (backend.path, backend.n_ctx, backend.n_threads, backend.seed) == (gguf, 2048, 2, 0)
    assert judge.settings.max_tokens == 64
    with pytest.raises(FileNotFoundError):
        get_judge(f"llamacpp:/{gguf.parent / 'missing.gguf'}")


def test_scripted_takes_no_target_and_no_option():
    judge = get_judge("scripted", cache=False)
    assert judge.name == "scripted" and judge.backend.model == "scripted-rules-v1"
    with pytest.raises(ValueError, match="takes no model"):
        get_judge("scripted:/gpt-4o")
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['seed'\].*allowed: none"):
        get_judge("scripted?seed=1")


LLM_NAMES = {
    "openai": "openai:/gpt-4o-mini",
    "bedrock": f"bedrock:/{BEDROCK_MODEL}?region_name=us-east-1",
    "endpoints": "endpoints:/chat?target_uri=http://127.0.0.1:5001",
    "llamacpp": None,  # filled with the fixture's file
    "scripted": "scripted",
}


@pytest.mark.parametrize("scheme", sorted(LLM_NAMES))
def test_llm_settings_reach_every_llm_provider(scheme, gguf):
    """The settings the docs' judge reference shows are accepted by every LLM provider's judge."""
    name = LLM_NAMES[scheme] or f"llamacpp:/{gguf}"
    judge = get_judge(name, timeout=180, deadline=400, max_retries=1, unreachable_after=0,
                      temperature=0.2, concurrency=2, cache=False)
    assert isinstance(judge, LLMJudge) and judge.backend.provider == scheme
    s = judge.settings
    assert (s.timeout, s.deadline, s.max_retries, s.unreachable_after, s.temperature, s.concurrency) == (
        180, 400, 1, 0, 0.2, 2
    )
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['tmeout'\].*allowed: .*'timeout'"):
        get_judge(name, tmeout=180)


@pytest.mark.parametrize(("name", "options", "hint"), [
    ("openai:/m?base_ur=http://h", {}, "(did you mean 'base_url'?)"),
    ("local:minilm-l6?support_treshold=0.5", {}, "(did you mean 'support_threshold'"),
    ("local:minilm-l6", {"support_treshold": 0.5}, "(did you mean 'support_threshold'"),
    ("openai:/m", {"tmeout": 5, "concurency": 2}, "(did you mean 'concurrency' for 'concurency', 'timeout' for 'tmeout'?)"),
])
def test_a_misspelled_judge_option_gets_the_closest_option(name, options, hint):
    with pytest.raises(ValueError, match="unknown option") as raised:
        get_judge(name, **options)
    assert hint in str(raised.value)


@pytest.mark.parametrize(
    "name, allowed",
    [
        ("openai:/m?region_name=x", "base_url"),
        (f"bedrock:/{BEDROCK_MODEL}?region=us-west-2", "region_name"),
        ("endpoints:/chat?target=http://h", "target_uri"),
        ("llamacpp:/m.gguf?n_gpu_layers=10", "n_ctx"),
        ("local:minilm-l6?threshold=0.1", "support_threshold"),
    ],
)
def test_unknown_options_are_refused_naming_the_allowed_ones(name, allowed):
    with pytest.raises(ValueError, match=rf"unknown option.*allowed: .*'{allowed}'"):
        get_judge(name)


@pytest.mark.parametrize(
    "name",
    [
        "openai:/m?api_key=sk-do-not-log-me",
        f"bedrock:/{BEDROCK_MODEL}?aws_secret_access_key=do-not-log-me",
        "endpoints:/chat?token=do-not-log-me",
        "endpoints:/chat?target_uri=http://user:do-not-log-me@127.0.0.1:5000",
        "openai:/m?base_url=http://user:do-not-log-me@127.0.0.1:8000/v1",
    ],
)
def test_secrets_are_never_accepted_in_a_name(name):
    with pytest.raises(ValueError) as info:
        get_judge(name)
    assert "do-not-log-me" not in str(info.value)


def test_an_option_given_twice_is_refused():
    with pytest.raises(ValueError, match="given twice"):
        get_judge(f"bedrock:/{BEDROCK_MODEL}?region_name=us-east-1&region_name=us-west-2")


def test_unknown_scheme_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown judge scheme 'anthropic'; known: " + ", ".join(BUILTIN)):
        get_judge("anthropic:/claude")
    assert known_schemes() == BUILTIN


def test_a_ready_judge_is_returned_as_is_and_takes_no_options(local_judge):
    assert get_judge(local_judge) is local_judge
    with pytest.raises(ValueError, match="ready Judge"):
        get_judge(local_judge, timeout=3)


def test_judge_names_in_the_docs_all_resolve(gguf):
    """Every judge name the docs' judge pages show builds a judge (placeholders filled in)."""
    section = "\n".join((ROOT / "docs" / page).read_text() for page in (
        "reference/judges.md", "concepts/judges.md", "concepts/local-judge.md", "how-to/panels.md"))
    names = {
        n for n in re.findall(r"`([^`]+)`", section)
        if re.match(rf"({'|'.join(BUILTIN)})(:|\?|$)", n) and not n.endswith((":", ":/"))
    }
    assert {re.match(r"[a-z]+", n).group(0) for n in names} == set(BUILTIN)  # every provider shown
    fill = {
        "<model id>": BEDROCK_MODEL, "<region>": "us-west-2", "<name>": "chat",
        "<gateway url>": "http://127.0.0.1:5000", "<path.gguf>": str(gguf), "<model>": "m",
        "<any name>": "any", "<model alias>": "smollm2", "<model.json>": str(default_model_path()),
    }
    for shown in sorted(names):
        name = shown
        for placeholder, value in fill.items():
            name = name.replace(placeholder, value)
        assert "<" not in name, f"no value for a placeholder of the docs' judge name {shown!r}"
        assert isinstance(get_judge(name), Judge), shown


# -- missing optional dependencies ----------------------------------------------------------------
def test_a_missing_sdk_names_the_extra(monkeypatch, gguf):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # as if llama-cpp-python were not installed
    with pytest.raises(MissingJudgeDependency, match=re.escape("pip install 'mlflow-rag-eval[llamacpp]'")) as info:
        get_judge(f"llamacpp:/{gguf}")
    assert isinstance(info.value, ImportError) and info.value.name == "llama_cpp"


def test_a_provider_module_that_cannot_be_imported_names_the_extra(monkeypatch, tmp_path):
    """The provider module itself fails to import (its SDK imported at the top, not installed)."""
    (tmp_path / "broken_llamacpp_provider.py").write_text("import llama_cpp_sdk_not_installed\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(registry.BUILTIN, "llamacpp", ("broken_llamacpp_provider", "llamacpp"))
    monkeypatch.delitem(registry._PROVIDERS, "llamacpp", raising=False)
    with pytest.raises(MissingJudgeDependency) as info:
        get_judge("llamacpp:/m.gguf")
    message = str(info.value)
    assert "'llama_cpp_sdk_not_installed'" in message
    assert "pip install 'mlflow-rag-eval[llamacpp]'" in message
    assert isinstance(info.value.__cause__, ModuleNotFoundError)


# -- laziness -------------------------------------------------------------------------------------
def test_provider_modules_are_imported_when_their_scheme_is_first_used():
    code = textwrap.dedent(
        """
        import sys
        providers = ["local", "openai", "bedrock", "endpoints", "llamacpp", "scripted"]
        loaded = lambda: [p for p in providers if "mlflow_rag_eval.judges.providers." + p in sys.modules]
        from mlflow_rag_eval.judges import get_judge
        assert loaded() == [], loaded()
        get_judge("scripted")
        assert loaded() == ["scripted"], loaded()
        get_judge("bedrock:/m?region_name=us-east-1")
        assert loaded() == ["bedrock", "scripted"], loaded()
        assert "boto3" not in sys.modules and "llama_cpp" not in sys.modules
        print("OK")
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-2000:]


# -- third-party providers ------------------------------------------------------------------------
ACME = textwrap.dedent(
    """
    from mlflow_rag_eval.judges.registry import JudgeProvider, llm_judge, register_judge_provider, split_judge_name
    from mlflow_rag_eval.judges.providers.scripted import ScriptedBackend


    @register_judge_provider("acme")
    def parse_acme(spec):
        model, options = split_judge_name(spec, "acme", {"flavour": str})
        backend = ScriptedBackend(model=model or "acme-default")
        backend.flavour = options.get("flavour")
        return backend


    def parse_other(spec):
        split_judge_name(spec, "acme-object", {})
        return ScriptedBackend(model="acme-object")


    # An entry point may also name a provider object instead of a decorated parser.
    OBJECT = JudgeProvider("acme-object", parse_other, llm_judge)


    def nothing(spec):
        return None
    """
)


@pytest.fixture
def acme(monkeypatch, tmp_path):
    """A third-party package ``acme_judges`` whose providers are declared as entry points."""
    module = f"acme_judges_{tmp_path.name.replace('-', '_')}"  # a fresh module per test
    (tmp_path / f"{module}.py").write_text(ACME)
    monkeypatch.syspath_prepend(str(tmp_path))
    declared = [
        importlib.metadata.EntryPoint("acme", f"{module}:parse_acme", registry.ENTRY_POINT_GROUP),
        importlib.metadata.EntryPoint("acme-object", f"{module}:OBJECT", registry.ENTRY_POINT_GROUP),
        importlib.metadata.EntryPoint("acme-nothing", f"{module}:nothing", registry.ENTRY_POINT_GROUP),
        importlib.metadata.EntryPoint("acme-broken", "acme_missing_sdk_module:x", registry.ENTRY_POINT_GROUP),
    ]
    real = importlib.metadata.entry_points

    def entry_points(**params):
        if params.get("group") == registry.ENTRY_POINT_GROUP:
            return importlib.metadata.EntryPoints(declared)
        return real(**params)

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    yield module
    sys.modules.pop(module, None)


def test_a_third_party_provider_from_the_entry_point_group(acme):
    assert {"acme", "acme-object"} <= set(known_schemes())
    assert acme not in sys.modules  # declared, not imported
    judge = get_judge("acme:/m1?flavour=strict", timeout=7, cache=False)
    assert acme in sys.modules
    assert isinstance(judge, LLMJudge) and judge.name == "acme:/m1"
    assert (judge.backend.model, judge.backend.flavour, judge.settings.timeout) == ("m1", "strict", 7)
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['colour'\].*allowed: \['flavour'\]"):
        get_judge("acme:/m1?colour=red")
    assert get_judge("acme-object").backend.model == "acme-object"


def test_an_entry_point_that_registers_nothing_or_cannot_load(acme):
    with pytest.raises(TypeError, match="registered no judge provider for scheme 'acme-nothing'"):
        get_judge("acme-nothing:/x")
    with pytest.raises(MissingJudgeDependency, match="'acme_missing_sdk_module'.*reinstall"):
        get_judge("acme-broken:/x")


def test_a_third_party_cannot_take_a_built_in_scheme():
    with pytest.raises(ValueError, match="built in"):
        registry.register_judge_provider("openai")(lambda spec: None)
    with pytest.raises(ValueError, match="invalid judge scheme"):
        registry.register_judge_provider("Not A Scheme")


def test_the_decorator_registers_a_provider_and_a_second_claim_is_refused():
    @registry.register_judge_provider("inhouse", build=lambda parsed, *, name, **options: (parsed, name, options))
    def parse(spec):
        return registry.split_judge_name(spec, "inhouse", {"size": registry.as_int})

    assert registry.build_judge("inhouse:/big?size=3", x=1) == (("big", {"size": 3}), "inhouse:/big", {"x": 1})
    with pytest.raises(ValueError, match="already registered"):
        registry.register_judge_provider("inhouse")(lambda spec: None)


def test_llm_settings_are_the_options_of_llm_judges():
    """The option list an LLM judge refuses with is LLMSettings' fields: one source of truth."""
    with pytest.raises(ValueError) as info:
        get_judge("scripted", nope=1)
    for field in LLMSettings.__dataclass_fields__:
        assert f"'{field}'" in str(info.value)
