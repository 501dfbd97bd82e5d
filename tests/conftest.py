"""Shared fixtures. Telemetry and model hubs are off for every test (also set by the Makefile,
repeated here so a bare `pytest` behaves the same)."""

from __future__ import annotations

import contextlib
import os

for _key, _value in {
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DO_NOT_TRACK": "true",
    "RAGAS_DO_NOT_TRACK": "true",
    "DEEPEVAL_TELEMETRY_OPT_OUT": "1",
    "DEEPEVAL_FILE_SYSTEM": "READ_ONLY",
    "DEEPEVAL_DISABLE_DOTENV": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}.items():
    os.environ.setdefault(_key, _value)

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import mlflow  # noqa: E402
import pytest  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "rag_pipeline"))

from llama_server import llama_server  # noqa: E402, F401  (a session fixture, for every test module)

#: The judge prompts' version as data format 2 renders them (tests/judges/test_prompt_injection.py,
#: tests/golden/test_golden.py). A failing test means a template, a schema or the data format
#: changed: bump the template's version (or DATA_FORMAT_VERSION), then update this value. Judges'
#: fingerprints and cache keys move with it, so scores never drift unnoticed.
PINNED_PROMPTS_VERSION = "prompts-393952dfd1ad"


@pytest.fixture(autouse=True, scope="session")
def _judge_cache_dir(tmp_path_factory):
    """LLM-judge replies are cached in a session temp dir, never in the user's cache."""
    os.environ["MLFLOW_RAG_EVAL_CACHE_DIR"] = str(tmp_path_factory.mktemp("judge_cache"))


@pytest.fixture
def tracking_uri(tmp_path, monkeypatch):
    """A fresh sqlite tracking store (and artifact root) under the test's temp dir."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    # set_experiment exports MLFLOW_EXPERIMENT_ID; monkeypatch restores it after the test.
    monkeypatch.setenv("MLFLOW_EXPERIMENT_ID", "")
    monkeypatch.delenv("MLFLOW_EXPERIMENT_ID")
    monkeypatch.chdir(tmp_path)  # the default artifact root ./mlruns lands in tmp_path too
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment("tests")
    yield uri
    if mlflow.active_run():
        mlflow.end_run()
    mlflow.set_tracking_uri(None)


@pytest.fixture(scope="session")
def local_judge():
    """One embedded MiniLM judge for the session: loading the model costs seconds."""
    from mlflow_rag_eval.judges.providers.local import LocalJudge

    return LocalJudge()


@pytest.fixture(scope="session")
def demo(tmp_path_factory):
    """What ``make demo`` leaves behind, made once per session: the quickstart run into a sqlite
    store of its own. Tests read it (and serve it to a browser); none may change it."""
    import contextlib
    import importlib.util
    import io
    from types import SimpleNamespace

    home = tmp_path_factory.mktemp("demo")
    uri = f"sqlite:///{home / 'mlflow.db'}"
    spec = importlib.util.spec_from_file_location("quickstart", ROOT / "examples" / "quickstart.py")
    quickstart = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(quickstart)
    saved_experiment = os.environ.pop("MLFLOW_EXPERIMENT_ID", None)
    cwd = os.getcwd()
    out = io.StringIO()
    try:
        os.chdir(home)  # the store's default artifact root, ./mlruns, lands beside it
        with contextlib.redirect_stdout(out):
            runs, decisions = quickstart.main(["--tracking-uri", uri, "--experiment", "rag-quickstart"])
    finally:
        os.chdir(cwd)
        mlflow.set_tracking_uri(None)
        os.environ.pop("MLFLOW_EXPERIMENT_ID", None)
        if saved_experiment is not None:
            os.environ["MLFLOW_EXPERIMENT_ID"] = saved_experiment
    client = mlflow.MlflowClient(uri)
    experiment_id = client.get_experiment_by_name("rag-quickstart").experiment_id
    from mlflow.genai.datasets import search_datasets

    mlflow.set_tracking_uri(uri)
    try:
        (golden,) = search_datasets(experiment_ids=[experiment_id], filter_string="name = 'northwind-generated'")
    finally:
        mlflow.set_tracking_uri(None)
    return SimpleNamespace(home=home, uri=uri, runs=runs, decisions=decisions, out=out.getvalue(),
                           experiment_id=experiment_id, golden=golden,
                           n_rows=int(golden.tags["rag_eval.golden_set_rows"]))


def figures_of(source) -> dict[str, float]:
    """An evaluation run's figures: its metrics (the means) with every statistic of each metric
    (``/n_scored``, ``/n_error``, ``/p10``...) recomputed from its rows table, as the gate and
    ``compare`` read them. ``source``: a run id, or what ``mlflow.evaluate`` returned."""
    from mlflow_rag_eval.compare import load_evaluation

    return load_evaluation(source if isinstance(source, str) else source.run_id).figures()


def refusing_judge(word: str):
    """The scripted LLM judge, refusing to verify any text containing ``word``: a named
    ``Refusal`` error on that row, the default lexical verdicts on the others."""
    from mlflow_rag_eval.judges.llm.chat import PermanentError
    from mlflow_rag_eval.judges.llm.judge import LLMJudge
    from mlflow_rag_eval.judges.providers.scripted import ScriptedBackend, _default

    def claims(variables):
        if word in variables["text"]:
            return PermanentError("Refusal", "the model declined to judge this text")
        return _default("claims_verdicts", variables)

    return LLMJudge(ScriptedBackend({"claims_verdicts": claims}), cache=False)


@contextlib.contextmanager
def _experiment_id_env_kept():
    """MLFLOW_EXPERIMENT_ID as it was on entry, restored on exit (set, changed or removed within)."""
    before = os.environ.get("MLFLOW_EXPERIMENT_ID")
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("MLFLOW_EXPERIMENT_ID", None)
        else:
            os.environ["MLFLOW_EXPERIMENT_ID"] = before


@pytest.fixture(autouse=True)
def _experiment_id_env_restored():
    """mlflow.set_experiment exports MLFLOW_EXPERIMENT_ID; a test that calls it outside a fixture
    that restores it would hand its experiment id to every later test's subprocesses (a store
    where that id does not exist then refuses them). Restored after every test."""
    with _experiment_id_env_kept():
        yield


@pytest.fixture(scope="module", autouse=True)
def _experiment_id_env_restored_after_the_module():
    """The same for a module-scoped fixture that calls mlflow.set_experiment: it runs before any
    function-scoped fixture, so only a fixture of its own scope, set up before it (autouse comes
    first) and torn down after it, sees the value from before the module."""
    with _experiment_id_env_kept():
        yield


def pytest_terminal_summary(terminalreporter):
    """The documentation tests' summary: how many doc examples ran, and every skipped one with its
    reason, at the end of the session (here, not in tests/docs/conftest.py: a second module named
    ``conftest`` would shadow this one for the tests that import from it)."""
    module = sys.modules.get("test_doc_examples")
    if module is None or not module.EXECUTED:
        return
    skipped = [b for found in module.BLOCKS.values() for b in found if b.skip is not None]
    terminalreporter.write_line(
        f"doc examples: {sum(module.EXECUTED.values())} executed on {len(module.EXECUTED)} pages, "
        f"{len(skipped)} skipped with a reason, {sum(1 for b in skipped if not b.skip)} without")
    for block in skipped:
        terminalreporter.write_line(f"  skipped {block.where}: {block.skip or '(no reason!)'}")
