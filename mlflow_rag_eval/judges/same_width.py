"""Embeddings that do not depend on the batch a text is encoded in.

The numpy encoder pads each step of a batch to its longest text, and padding changes the
summation order inside the kernels: a text's vector moves in the 7th digit with its batch
mates (measured: a third of 300 texts). Rounding scores to 1e-6 leaves every value near a
rounding boundary to chance (``answer_relevancy`` 0.666 alone, 0.665999 batched). Texts of one
token count need no padding, and a batch of them gives each text the vector it gets alone,
exactly; so texts are encoded in groups of one width. The genai route judges rows one at a
time and the other routes in batches: both now give the same bits.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

from mlflow_rag_eval.judges.local_model.embedding import load_model

__all__ = ["encode_batch_independent"]


def encode_batch_independent(embedder: Any, texts: Sequence[str]) -> np.ndarray:
    """``embedder.encode(texts)``, each text's vector the one it gets when encoded alone.

    Models the numpy encoder does not run (sentence-transformers) are encoded as they come:
    their tokenizer is not at hand here.
    """
    texts = list(texts)
    tokenize = getattr(load_model(embedder.path), "tokenize", None) if texts else None
    if tokenize is None:
        return embedder.encode(texts)
    by_width: dict[int, list[int]] = defaultdict(list)
    for i, ids in enumerate(tokenize(texts)):
        by_width[len(ids)].append(i)
    if len(by_width) == 1:
        return embedder.encode(texts)
    out: np.ndarray | None = None
    for rows in by_width.values():
        vectors = embedder.encode([texts[i] for i in rows])
        if out is None:
            out = np.empty((len(texts), vectors.shape[1]), dtype=vectors.dtype)
        out[rows] = vectors
    return out
