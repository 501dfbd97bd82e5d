"""Embeddings that do not depend on the batch a text is encoded in.

Scores are rounded to 1e-6, so a vector that moved in the 7th digit with its batch mates would
leave every value near a rounding boundary to chance (``answer_relevancy`` 0.666 alone, 0.665999
batched), and the genai route judges rows one at a time while the other routes judge batches.
The numpy encoder guarantees the same bits alone and in any batch itself: it runs texts in steps
of one token count (no padding) with one BLAS product per input (:mod:`.local_model.encoder`).
Texts were once encoded here in groups of one width for that; the encoder's own steps now do it,
and the groups only kept its steps from running on every core (200 questions: 1.6 s -> 0.9 s).
What is left here: a text that comes more than once is encoded once, and vectors a judge encoded
ahead of time (:class:`EncodedAhead`) are taken instead of encoded again.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["EncodedAhead", "encode_batch_independent"]


def encode_batch_independent(embedder: Any, texts: Sequence[str]) -> np.ndarray:
    """``embedder.encode(texts)``, each text's vector the one it gets when encoded alone (the
    numpy encoder's guarantee; a sentence-transformers model's texts are encoded as they come).
    A text that comes more than once (a row's question, paired with each question generated from
    its answer) is encoded once: it gets the same vector either way.
    """
    texts = list(texts)
    unique = list(dict.fromkeys(texts))
    if len(unique) == len(texts):
        return embedder.encode(texts)
    vectors = embedder.encode(unique)
    position = {text: i for i, text in enumerate(unique)}
    return vectors[[position[t] for t in texts]]


class EncodedAhead:
    """Vectors encoded before they are asked for, by text: a judge encodes a row's texts on its
    worker thread as soon as the row's reply gives them (answer relevancy's generated questions),
    while other rows still wait on the network, and :meth:`encode` takes them from here instead of
    encoding every row's texts after the last reply. A text's vector does not depend on the batch
    it is encoded in (:func:`encode_batch_independent`), so the vectors are the same bits either
    way. Bounded: past ``capacity`` texts the oldest are dropped (and encoded again if asked for).
    """

    def __init__(self, capacity: int = 8192):
        self.capacity = capacity
        self._vectors: dict[str, np.ndarray] = {}
        self._lock = threading.Lock()

    def add(self, embedder: Any, texts: Sequence[str]) -> None:
        """Encode ``texts`` not held yet and hold their vectors."""
        with self._lock:
            missing = [t for t in dict.fromkeys(texts) if t not in self._vectors]
        if not missing:
            return
        vectors = encode_batch_independent(embedder, missing)
        with self._lock:
            for text, vector in zip(missing, vectors):
                self._vectors[text] = vector
            while len(self._vectors) > self.capacity:
                del self._vectors[next(iter(self._vectors))]

    def encode(self, embedder: Any, texts: Sequence[str]) -> np.ndarray:
        """:func:`encode_batch_independent` of ``texts``, taking (and letting go of) the vectors held."""
        texts = list(texts)
        with self._lock:
            held = {t: self._vectors.pop(t) for t in dict.fromkeys(texts) if t in self._vectors}
        if not held:
            return encode_batch_independent(embedder, texts)
        missing = [t for t in dict.fromkeys(texts) if t not in held]
        if missing:
            held.update(zip(missing, encode_batch_independent(embedder, missing)))
        return np.stack([held[t] for t in texts])
