"""In-process judges from a GGUF file through llama-cpp-python: the judge name ``llamacpp:/<path>``.

No server, no network: the model runs in this process. ``llama_cpp`` is imported, and the model
loaded, on the first :meth:`LlamaCppBackend.complete`, never at package import.

Structured output: a request's JSON schema is sent as llama-cpp-python's own
``response_format={"type": "json_object", "schema": ...}``, which it compiles into a grammar,
so every reply is JSON of the schema's shape (it can still be cut off at ``max_tokens``, or
carry wrong indices; parsing and checks live in the layer above).

One attempt per :meth:`complete`, like every backend: a prompt longer than ``n_ctx`` raises
``PermanentError("ContextOverflow", ...)``; any other failure of llama.cpp raises
``PermanentError`` named after the exception type (a local model does not get better on retry).

Lineage: the model is identified by the sha256 of its GGUF file (computed once per file
path, size and mtime), not by its file name, so a re-quantised file with the same name is a
different judge and never reads another's cached verdicts.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from mlflow_rag_eval.judges.llm.chat import ChatReply, ChatRequest, PermanentError, TransientError
from mlflow_rag_eval.judges.local_model.model_files import files_sha256
from mlflow_rag_eval.judges.registry import as_int, register_judge_provider, split_judge_name

__all__ = ["LlamaCppBackend", "gguf_sha256", "parse_llamacpp_target"]

#: Generation parameters passed on to ``create_chat_completion`` besides the three it always gets.
_PASSED_PARAMS = ("top_p", "top_k", "min_p", "stop", "presence_penalty", "frequency_penalty", "repeat_penalty")


def gguf_sha256(path: str | Path) -> str:
    """sha256 of a model file, kept for the process (see :mod:`.model_files`)."""
    return files_sha256([Path(path).resolve()])


class LlamaCppBackend:
    """A judge backend running a GGUF model in this process.

    A llama.cpp context is not thread-safe: each instance serves one request at a time (a lock
    around generation), so concurrency above 1 only queues requests. Run a server
    (``python -m llama_cpp.server``) and the ``openai:/`` judge for parallel requests.

    Args:
        model_path: the ``.gguf`` file.
        n_ctx: context window in tokens; a longer prompt fails its row with ``ContextOverflow``.
        n_threads: CPU threads for llama.cpp, for prompts and generation alike (None: its
            defaults, half the cores to generate and all of them for prompts).
        seed: the sampling seed used when the request's parameters carry none.
        default_concurrency: what the layer above uses unless told otherwise.

    Generation cannot be interrupted once it has started: ``max_tokens`` bounds an attempt,
    and a request's ``timeout`` only bounds the wait for the lock.
    """

    provider = "llamacpp"
    base_url = None
    supports_schema = True

    def __init__(
        self,
        model_path: str,
        *,
        n_ctx: int = 4096,
        n_threads: int | None = None,
        seed: int = 0,
        default_concurrency: int = 1,
    ):
        path = Path(model_path).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"no GGUF model file at {str(path)!r}")
        self.path = path
        self.model = path.name
        self.n_ctx = n_ctx
        self.n_threads = n_threads
        self.seed = seed
        self.default_concurrency = default_concurrency
        self._llama = None
        self._load_error: PermanentError | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"LlamaCppBackend(model_path={str(self.path)!r}, n_ctx={self.n_ctx})"

    def identity(self) -> dict[str, Any]:
        # The seed changes replies at temperature > 0, so it belongs in the cache key too.
        return {"provider": self.provider, "model": self.model, "sha256": gguf_sha256(self.path),
                "n_ctx": self.n_ctx, "seed": self.seed}

    def _load(self):
        """The Llama instance, created once; call with the lock held."""
        if self._llama is not None:
            return self._llama
        if self._load_error is not None:  # a broken file or install fails every row at once
            raise self._load_error
        try:
            from llama_cpp import Llama
        except ImportError as exc:
            self._load_error = PermanentError(
                "ImportError",
                f"the llamacpp judge needs llama-cpp-python: pip install 'mlflow-rag-eval[llamacpp]' ({exc})",
            )
            raise self._load_error from None
        try:
            self._llama = Llama(
                model_path=str(self.path), n_ctx=self.n_ctx, n_threads=self.n_threads,
                n_threads_batch=self.n_threads, seed=self.seed, verbose=False,
            )
        except Exception as exc:
            self._load_error = PermanentError("ModelLoadError", f"{self.path.name}: {type(exc).__name__}: {exc}")
            raise self._load_error from None
        return self._llama

    def complete(self, request: ChatRequest) -> ChatReply:
        params = request.params
        kwargs: dict[str, Any] = {
            "messages": request.messages,
            "temperature": params.get("temperature", 0.0),
            "max_tokens": params.get("max_tokens"),
            "seed": params.get("seed", self.seed),
            **{k: params[k] for k in _PASSED_PARAMS if k in params},
        }
        if request.schema is not None:
            kwargs["response_format"] = {"type": "json_object", "schema": request.schema}
        if not self._lock.acquire(timeout=max(request.timeout, 0.0)):
            raise TransientError("Timeout", f"{self.model}: busy with another request for {request.timeout:g}s")
        try:
            llama = self._load()
            out = llama.create_chat_completion(**kwargs)
        except PermanentError:
            raise
        except ValueError as exc:
            if "exceed context window" in str(exc):
                raise PermanentError("ContextOverflow", f"{self.model}: {exc}") from None
            raise PermanentError("ValueError", f"{self.model}: {exc}") from None
        except Exception as exc:
            raise PermanentError(type(exc).__name__, f"{self.model}: {exc}") from None
        finally:
            self._lock.release()
        choice = (out.get("choices") or [{}])[0]
        usage = out.get("usage") or {}
        return ChatReply(
            text=(choice.get("message") or {}).get("content") or "",
            # llama-cpp-python reports the file path as the model; keep the name only.
            model=Path(str(out.get("model") or self.model)).name,
            tokens_in=usage.get("prompt_tokens"),
            tokens_out=usage.get("completion_tokens"),
        )


#: Options of a ``llamacpp:/`` judge name and their types (the seed may be 0).
_TARGET_OPTIONS = {"n_ctx": as_int, "n_threads": as_int, "seed": int}


@register_judge_provider("llamacpp", requires=("llama_cpp",))
def parse_llamacpp_target(spec: str) -> LlamaCppBackend:
    """A backend from a judge name: ``llamacpp:/<path.gguf>``, options as a query string.

    The one ``/`` after the scheme separates it from the path: ``llamacpp:/models/m.gguf`` is
    relative to the working directory, ``llamacpp://abs/m.gguf`` (or ``llamacpp:/`` followed
    by an absolute path) is absolute. Options: ``n_ctx``, ``n_threads``, ``seed``, e.g.
    ``llamacpp:/m.gguf?n_ctx=8192&n_threads=4``. Concurrency is not an option: one context
    serves one request at a time.
    """
    path, options = split_judge_name(spec, "llamacpp", _TARGET_OPTIONS)
    if not path:
        raise ValueError(f"no model file in judge name {spec.partition('?')[0]!r} (expected 'llamacpp:/<path.gguf>')")
    return LlamaCppBackend(path, **options)
