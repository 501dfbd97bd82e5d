"""One sentence-embedding model per path per process, whoever asks and however many copies.

MLflow copies scorers (and with them their judge) and calls them from many threads at once; a
model loaded per copy or per thread cost seconds and hundreds of MB each time. Loads are
counted with a stand-in for the encoder classes (fast, and it can be slowed down to widen the
race), then once with the real MiniLM on the numpy encoder.
"""

from __future__ import annotations

import copy
import os
import pickle
import threading
import time

import numpy as np
import pytest

from mlflow_rag_eval.judges.llm.judge import LLMJudge
from mlflow_rag_eval.judges.local_model import embedding
from mlflow_rag_eval.judges.local_model.embedding import Embedder, load_model, resolve_model_path
from mlflow_rag_eval.judges.local_model.encoder import BertEncoder
from mlflow_rag_eval.judges.providers.local import LocalJudge
from mlflow_rag_eval.judges.providers.scripted import ScriptedBackend

MINILM = os.path.realpath(resolve_model_path("minilm-l6"))  # models are keyed by their folder


class _Counting:
    """Stands in for both encoders: counts constructions, embeds by character counts."""

    engine = "counting"
    loads: list[str] = []
    delay = 0.0
    fail_next = False

    def __init__(self, path, problem=None):
        time.sleep(self.delay)  # a slow load: every thread asking meanwhile must wait for it
        if _Counting.fail_next:
            _Counting.fail_next = False
            raise OSError(f"cannot load {path}")
        _Counting.loads.append(path)

    def encode(self, texts, batch_size=64):
        vectors = np.array([[t.count(c) + 1.0 for c in "aeiou"] for t in texts], dtype=np.float32)
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


@pytest.fixture
def counting(monkeypatch):
    """A fresh per-process model cache, and the stand-in in place of both encoders."""
    monkeypatch.setattr(embedding, "_MODELS", {})
    monkeypatch.setattr(embedding, "_LOADING", {})
    monkeypatch.setattr(embedding, "BertEncoder", _Counting)
    monkeypatch.setattr(embedding, "SentenceTransformerEncoder", _Counting)
    monkeypatch.setattr(_Counting, "loads", [])
    monkeypatch.setattr(_Counting, "delay", 0.0)
    return _Counting


def test_two_judges_and_their_copies_load_the_model_once(counting):
    first, second = LocalJudge(), LocalJudge(support_threshold=0.7)
    copied = copy.deepcopy(first)
    llm = LLMJudge(ScriptedBackend(), cache=False)
    pairs = [("bikes on trains", "bicycles travel by rail")]
    scores = [j.similarity(pairs) for j in (first, second, copied, llm)]
    assert counting.loads == [MINILM]
    assert scores[0] == scores[1] == scores[2] == scores[3]
    assert copied is not first and copied.embedder is first.embedder  # a copy shares the embedder
    assert copied.info().fingerprint == first.info().fingerprint


def test_threads_asking_during_a_slow_load_wait_for_it(counting):
    counting.delay = 0.3
    judges = [copy.deepcopy(LocalJudge()) for _ in range(6)] + [LLMJudge(ScriptedBackend(), cache=False)]
    start = threading.Barrier(len(judges))
    errors = []

    def ask(judge):
        try:
            start.wait(10)
            judge.similarity([("a question", "an answer")])
        except Exception as exc:  # reported below, with the load count
            errors.append(exc)

    threads = [threading.Thread(target=ask, args=(j,)) for j in judges]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors and len(counting.loads) == 1


def test_a_failed_load_is_not_cached(counting):
    counting.fail_next = True
    with pytest.raises(OSError, match="cannot load"):
        load_model("some/model")
    assert load_model("some/model") is load_model("some/model")
    assert counting.loads == ["some/model"]


def test_a_folder_is_one_model_however_its_path_is_spelled(counting, tmp_path):
    (tmp_path / "m").mkdir()
    assert load_model(str(tmp_path / "m")) is load_model(f"{tmp_path}/./m/")
    assert len(counting.loads) == 1


def test_a_pickled_judge_loads_nothing_more_in_the_same_process(counting):
    judge = LocalJudge()
    judge.similarity([("x", "y")])
    restored = pickle.loads(pickle.dumps(judge))
    assert restored.embedder is not judge.embedder and restored.embedder.path == judge.embedder.path
    assert restored.similarity([("x", "y")]) == judge.similarity([("x", "y")])
    assert len(counting.loads) == 1


def test_the_real_minilm_is_loaded_once_for_every_judge(monkeypatch):
    """The same, with the shipped model on the real (numpy) encoder."""
    loads = []

    class Spy(BertEncoder):
        def __init__(self, path):
            loads.append(path)
            super().__init__(path)

    monkeypatch.setattr(embedding, "_MODELS", {})
    monkeypatch.setattr(embedding, "_LOADING", {})
    monkeypatch.setattr(embedding, "BertEncoder", Spy)
    local = LocalJudge()
    judges = [local, copy.deepcopy(local), LocalJudge(), LLMJudge(ScriptedBackend(), cache=False)]
    pairs = [("How much does a bike ticket cost?", "Bicycles travel for a flat fare of 5 euros.")]
    scores = [j.similarity(pairs)[0] for j in judges]
    assert loads == [MINILM]
    assert isinstance(embedding.loaded_models()[MINILM], Spy)
    assert 0.3 < scores[0] < 1 and scores == [scores[0]] * len(judges)
    assert Embedder().encode(["x"]).shape == (1, 384)
    assert loads == [MINILM]
