"""The local judge's cross-encoder: does this premise window entail this claim? numpy only.

A bi-encoder compares two vectors made apart, so it cannot see that "fell" stands where the
context says "rose": the sentences stay close. A cross-encoder reads the claim and the premise
as one input, ``[CLS] claim [SEP] premise [SEP]``, and every layer attends across both. This
one is all-MiniLM-L6-v2 (the embedding model the judge already loads) with its top layers
fine-tuned on entailment data and a small head on ``[CLS]``: the bottom layers are the shipped
model's own, so the artifact holds only the top layers and the head
(``cross_encoder.safetensors``, float16, and ``cross_encoder.json``: how it was made).
:mod:`mlflow_rag_eval.judges.local_model.cross_training` rebuilds it (``make cross-encoder``).

Nothing is cut silently: a premise longer than :attr:`CrossEncoder.max_premise_tokens` is read
as overlapping windows (half a window apart) and a pair's probability is its best window's;
a claim longer than :attr:`CrossEncoder.max_claim_tokens` is read in windows the same way and
its probability is its *worst* window's (every part of a claim has to be entailed).
"""

from __future__ import annotations

import functools
import hashlib
import json
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from mlflow_rag_eval.judges.local_model.embedding import load_model, resolve_model_path
from mlflow_rag_eval.judges.local_model.encoder import (
    TOKENS_PER_STEP,
    BertEncoder,
    _Layer,
    plan_steps,
    read_safetensors,
    run_steps,
)
from mlflow_rag_eval.judges.local_model.model_files import files_sha256

__all__ = ["CrossEncoder", "cross_encoder_sha256", "default_cross_encoder_path", "load_cross_encoder", "pair_windows"]


def default_cross_encoder_path() -> Path:
    """The cross-encoder shipped with the package (its weights; the JSON lies beside them)."""
    return Path(__file__).with_name("cross_encoder.safetensors")


def _windows(ids: list[int], size: int) -> list[list[int]]:
    """``ids`` in windows of at most ``size`` tokens, half a window apart, the last one ending at
    the end (one window when it fits)."""
    if len(ids) <= size:
        return [ids]
    stride = max(1, size // 2)
    starts = list(range(0, len(ids) - size, stride)) + [len(ids) - size]
    return [ids[s:s + size] for s in starts]


def pair_windows(claim_ids: list[int], premise_ids: list[int], *, cls: int, sep: int, max_claim: int,
                 max_premise: int) -> list[list[tuple[list[int], list[int]]]]:
    """The model inputs (token ids, segment ids) of one pair: one list per claim window, each
    holding one input per premise window."""
    out = []
    for c in _windows(claim_ids, max_claim):
        row = []
        for p in _windows(premise_ids, max_premise):
            ids = [cls, *c, sep, *p, sep]
            row.append((ids, [0] * (len(c) + 2) + [1] * (len(p) + 1)))
        out.append(row)
    return out


def _head(x: np.ndarray, w: dict[str, np.ndarray]) -> np.ndarray:
    """The classifier on the ``[CLS]`` state: dense + tanh, then one logit."""
    pooled = np.tanh(x @ w["head.dense.weight"].T + w["head.dense.bias"])
    return pooled @ w["head.out.weight"][0] + w["head.out.bias"][0]


class CrossEncoder:
    """P(the premise entails the claim), for many (claim, premise) pairs at once."""

    def __init__(self, path: str | Path | None = None, model: str = "minilm-l6"):
        path = Path(path) if path else default_cross_encoder_path()
        meta_path = path.with_suffix(".json")
        if not path.is_file() or not meta_path.is_file():
            raise FileNotFoundError(f"no cross-encoder at {path} (with {meta_path.name} beside it); "
                                    "rebuild it with `make cross-encoder`")
        self.path = path
        self.meta = json.loads(meta_path.read_text())
        self.base_path = resolve_model_path(model)
        base = load_model(self.base_path)
        if not isinstance(base, BertEncoder):
            raise ValueError(f"the cross-encoder runs on the numpy encoder; {model!r} is not a model it runs")
        self.base = base
        weights = read_safetensors(path)
        self.frozen = int(self.meta["frozen_layers"])
        n_layers = len(base.layers)
        self.top = [_Layer(weights, f"encoder.layer.{i}.") for i in range(self.frozen, n_layers)]
        self.head = {k: v for k, v in weights.items() if k.startswith("head.")}
        self.max_claim_tokens = int(self.meta["max_claim_tokens"])
        self.max_premise_tokens = int(self.meta["max_premise_tokens"])
        self.cls = base.tokenizer.token_to_id("[CLS]")
        self.sep = base.tokenizer.token_to_id("[SEP]")
        # (claim, premise) digest -> P(entailed): metrics and training rounds ask for the same pairs again
        self._cache: dict[bytes, float] = {}
        self._lock = threading.Lock()
        self.max_cache = 200_000

    @functools.cached_property
    def sha256(self) -> str:
        """sha256 of the weights and the JSON beside them: part of the judge's fingerprint."""
        return cross_encoder_sha256(self.path)

    def __deepcopy__(self, memo: dict) -> CrossEncoder:
        """One per process: read-only weights, a thread-safe memo (a copied judge shares it)."""
        return self

    def _ids(self, texts: Sequence[str]) -> list[list[int]]:
        tokenizer = self.base.tokenizer
        lower = self.base.lower_case
        return [tokenizer.encode(t.lower() if lower else t, add_special_tokens=False).ids for t in texts]

    def inputs(self, pairs: Sequence[tuple[str, str]]) -> list[list[list[tuple[list[int], list[int]]]]]:
        """Each pair's model inputs (see :func:`pair_windows`)."""
        claims = self._ids([c for c, _ in pairs])
        premises = self._ids([p for _, p in pairs])
        return [pair_windows(c, p, cls=self.cls, sep=self.sep, max_claim=self.max_claim_tokens,
                             max_premise=self.max_premise_tokens) for c, p in zip(claims, premises)]

    def logits(self, inputs: Sequence[tuple[list[int], list[int]]]) -> np.ndarray:
        """One logit per input (token ids, segment ids), batched by length over the cores.

        Steps as :func:`plan_steps` makes them (one length each, one product per input): an
        input's logit is the one it gets alone, whatever else is judged with it (a row judged
        alone, as the genai route does, and in a batch give the same bits)."""
        steps = plan_steps([len(ids) for ids, _ in inputs], 64, TOKENS_PER_STEP)

        def run(chunk: list[int]) -> np.ndarray:
            tokens = np.array([inputs[i][0] for i in chunk], dtype=np.int64)  # one length per step
            types = np.array([inputs[i][1] for i in chunk], dtype=np.int64)
            mask = np.ones(tokens.shape, dtype=np.float32)
            states = self.base._forward(tokens, mask, types=types, layers=self.base.layers[:self.frozen])
            states = self.base._forward(tokens, mask, layers=self.top, states=states)
            return _head(states[:, 0], self.head)

        out = np.empty(len(inputs), dtype=np.float64)
        run_steps(steps, run, out, self.base.workers, "mlflow-rag-eval-cross-encoder")
        return out

    def entailment(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        """P(entailed) per (claim, premise) pair: the best premise window for each claim window,
        the worst claim window."""
        if not pairs:
            return np.zeros(0)
        keys = [hashlib.blake2b(f"{c}\x00{p}".encode(), digest_size=16).digest() for c, p in pairs]
        with self._lock:
            found = {k: self._cache[k] for k in keys if k in self._cache}
        missing = list({k: pair for k, pair in zip(keys, pairs) if k not in found}.items())
        if missing:
            per_pair = self.inputs([pair for _, pair in missing])
            flat = [x for windows in per_pair for row in windows for x in row]
            probs = 1.0 / (1.0 + np.exp(-np.clip(self.logits(flat), -40, 40)))
            new, k = {}, 0
            for (key, _), windows in zip(missing, per_pair):
                worst = 1.0
                for row in windows:
                    worst = min(worst, float(probs[k:k + len(row)].max()))
                    k += len(row)
                new[key] = worst
            found.update(new)
            with self._lock:
                if len(self._cache) + len(new) > self.max_cache:
                    self._cache.clear()
                self._cache.update(new)
        return np.array([found[k] for k in keys])


_LOADED: dict[str, CrossEncoder] = {}


def cross_encoder_sha256(path: str | Path) -> str:
    """sha256 of a cross-encoder's weights and the JSON beside them (without loading it)."""
    path = Path(path)
    return files_sha256([path, path.with_suffix(".json")])


def load_cross_encoder(path: str | Path | None = None, model: str = "minilm-l6") -> CrossEncoder:
    """The cross-encoder at ``path`` (default: the shipped one), loaded once per process."""
    key = hashlib.sha256(f"{Path(path).resolve() if path else ''}\x00{model}".encode()).hexdigest()
    found = _LOADED.get(key)
    if found is None:
        found = _LOADED[key] = CrossEncoder(path, model)
    return found
