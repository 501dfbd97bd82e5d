"""Training the local judge's support model (``mlflow-rag-eval train-local-judge``).

Examples come from three places: synthetic claims made from a passage collection by
:func:`mlflow_rag_eval.judges.local_model.corruptions.synthetic_examples` (claim-level labels); when
given, human-labelled (context, answer, label) pairs such as ``shared/data/faithfulness_dev``;
and the sentences of the answers labelled 1, corrupted by
:func:`mlflow_rag_eval.judges.local_model.corruptions.answer_corruptions` (negatives that paraphrase their
context as a real answer does, with one fact changed).
A labelled answer of several sentences is labelled as a whole: its sentences all count as
supported when the label is 1; when it is 0, only its least-supported sentence (under a first
model) counts as unsupported — the others may well be fine (multiple-instance labelling, one
refinement round).

The model is scikit-learn's ``LogisticRegression`` on standardised features, classes weighted
to balance, synthetic examples weighted ``synthetic_weight`` against human-labelled ones. Its
threshold is the one that maximises balanced accuracy of answer-level decisions (an answer is
supported when its least-supported sentence is) on the labelled training pairs, or of
claim-level decisions when there are none. Training is deterministic for a seed and the same
inputs (on one machine: embeddings may move in the 7th digit across CPUs).
"""

from __future__ import annotations

import gzip
import hashlib
import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mlflow_rag_eval._util.text import content_tokens, split_sentences, strip_citations
from mlflow_rag_eval.judges.local_model.corruptions import answer_corruptions, synthetic_examples
from mlflow_rag_eval.judges.local_model.embedding import Embedder
from mlflow_rag_eval.judges.local_model.support_model import FEATURES, Premise, SupportModel, claim_features

__all__ = ["Featurizer", "LabelledPair", "answer_claims", "load_corpus", "load_pairs", "train_support_model"]


@dataclass(frozen=True)
class LabelledPair:
    """A human-labelled (context, answer) pair: label 1 when the context supports the answer."""

    context: str
    answer: str
    label: int
    group: str = ""


def answer_claims(answer: str) -> list[str]:
    """The sentences of an answer that the local judge verifies (as its claim extraction does,
    minus the abstention filter: labelled answers state things)."""
    return [s for s in split_sentences(strip_citations(answer)) if content_tokens(s)] or [answer]


def load_corpus(path: str | Path) -> list[str]:
    """Passages from a folder of ``.txt``/``.md`` files (one passage a file), a ``.jsonl`` file
    (field ``text``, ``context`` or ``passage``), or a text file (passages split by blank lines)."""
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.suffix in (".txt", ".md") and p.is_file())
        return [p.read_text(encoding="utf-8") for p in files]
    if path.suffix == ".jsonl":
        out = []
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            row = json.loads(line)
            text = next((row[k] for k in ("text", "context", "passage") if k in row), None)
            if not isinstance(text, str):
                raise ValueError(f"{path}:{n}: no 'text', 'context' or 'passage' string field")
            out.append(text)
        return list(dict.fromkeys(out))
    return [p for p in path.read_text(encoding="utf-8").split("\n\n") if p.strip()]


def load_pairs(path: str | Path) -> list[LabelledPair]:
    """Labelled pairs from a JSONL file (or ``.jsonl.gz``) with ``context``, ``answer`` and ``label`` (0/1); the
    optional ``source`` is kept as the pair's group (a domain, for leave-one-domain-out)."""
    out = []
    path = Path(path)
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    for n, line in enumerate(raw.decode("utf-8").splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        try:
            out.append(LabelledPair(row["context"], row["answer"], int(row["label"]), str(row.get("source", ""))))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{path}:{n}: needs context, answer and a 0/1 label ({exc})") from None
    return out


class Featurizer:
    """Features of (claim, passages) pairs, premises embedded once per distinct passage list."""

    def __init__(self, embedder: Embedder):
        self.embedder = embedder
        self._premises: dict[tuple[str, ...], Premise] = {}

    def premise(self, passages: Sequence[str]) -> Premise:
        key = tuple(passages)
        found = self._premises.get(key)
        if found is None:
            units, n_sentences = Premise.units_of(passages)
            vectors = self.embedder.encode([u for u, _ in units]) if units else np.zeros((0, 1), np.float32)
            found = self._premises[key] = Premise.build(passages, units, n_sentences, vectors)
        return found

    def __call__(self, pairs: Sequence[tuple[str, Sequence[str]]]) -> np.ndarray:
        if not pairs:
            return np.zeros((0, len(FEATURES)))
        vectors = self.embedder.encode([claim for claim, _ in pairs])
        return np.array([claim_features(claim, vectors[k], self.premise(passages))[0]
                         for k, (claim, passages) in enumerate(pairs)])


def _fit(X: np.ndarray, y: np.ndarray, w: np.ndarray, C: float):
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    w = w.astype(float).copy()
    for label in (0, 1):  # balance the classes
        share = (y == label).sum()
        if share:
            w[y == label] *= len(y) / (2 * share)
    scaler = StandardScaler().fit(X)
    scaler.scale_[scaler.scale_ == 0] = 1.0
    model = LogisticRegression(C=C, max_iter=5000).fit(scaler.transform(X), y, sample_weight=w)
    return scaler, model


def _best_threshold(scores: np.ndarray, labels: np.ndarray) -> float:
    """The score cut that maximises balanced accuracy (ties: the lowest such cut)."""
    candidates = np.unique(scores)
    pos, neg = max(labels.sum(), 1), max((1 - labels).sum(), 1)
    best, best_bacc = 0.5, -1.0
    for t in candidates:
        decide = scores >= t
        bacc = ((decide & (labels == 1)).sum() / pos + (~decide & (labels == 0)).sum() / neg) / 2
        if bacc > best_bacc + 1e-12:
            best, best_bacc = float(t), bacc
    return best


def _digest(items: Iterable[str]) -> str:
    h = hashlib.sha256()
    for item in items:
        h.update(item.encode())
        h.update(b"\x00")
    return h.hexdigest()[:16]


def train_support_model(corpus: Sequence[str], pairs: Sequence[LabelledPair] = (), *, seed: int = 0,
                        per_passage: int = 4, synthetic_weight: float = 0.3, C: float = 1.0,
                        answer_corruption_weight: float = 2.0, embedder: Embedder | None = None) -> SupportModel:
    """Train a support model on synthetic examples from ``corpus`` and the labelled ``pairs``
    (the labelled pairs' contexts join the corpus for synthetic examples; the sentences of
    answers labelled 1, corrupted, are negatives weighted ``answer_corruption_weight``)."""
    featurize_ = Featurizer(embedder or Embedder())
    passages = list(dict.fromkeys([*corpus, *(p.context for p in pairs)]))
    synthetic = synthetic_examples(passages, seed=seed, per_passage=per_passage)
    if not synthetic and not pairs:
        raise ValueError("no training examples: the corpus has no sentence of six words or more, and no labelled pairs")
    Xs = featurize_([(e.claim, [e.passage]) for e in synthetic])
    ys = np.array([e.label for e in synthetic], dtype=int)
    corrupted = answer_corruptions(((c, p.context) for p in pairs if p.label == 1 for c in answer_claims(p.answer)),
                                   seed=seed) if answer_corruption_weight > 0 else []
    Xa = featurize_([(e.claim, [e.passage]) for e in corrupted])
    owner = np.array([i for i, p in enumerate(pairs) for _ in answer_claims(p.answer)], dtype=int)
    Xp = featurize_([(c, [p.context]) for p in pairs for c in answer_claims(p.answer)])
    yp = np.array([pairs[i].label for i in owner], dtype=int)
    keep = np.ones(len(owner), dtype=bool)
    rounds = 2 if len(pairs) else 1
    for round_ in range(rounds):
        X = np.vstack([Xs, Xa, Xp[keep]])
        y = np.concatenate([ys, np.zeros(len(Xa), dtype=int), yp[keep]])
        w = np.concatenate([np.full(len(ys), synthetic_weight), np.full(len(Xa), answer_corruption_weight),
                            np.ones(int(keep.sum()))])
        scaler, model = _fit(X, y, w, C)
        if round_ + 1 < rounds:  # a 0-labelled answer: only its least-supported sentence is a negative
            p = model.predict_proba(scaler.transform(Xp))[:, 1]
            keep[:] = True
            for i in np.unique(owner[yp == 0]):
                idx = np.flatnonzero(owner == i)
                keep[idx] = False
                keep[idx[np.argmin(p[idx])]] = True
    support = SupportModel(
        features=FEATURES, mean=tuple(map(float, scaler.mean_)), scale=tuple(map(float, scaler.scale_)),
        coef=tuple(map(float, model.coef_[0])), intercept=float(model.intercept_[0]), threshold=0.5,
    )
    if len(pairs):
        answer_scores = np.full(len(pairs), np.inf)
        np.minimum.at(answer_scores, owner, support.predict(Xp))
        threshold = _best_threshold(answer_scores, np.array([p.label for p in pairs]))
    else:
        threshold = _best_threshold(support.predict(Xs), ys)
    kinds: dict[str, int] = {}
    for e in synthetic:
        kinds[e.kind] = kinds.get(e.kind, 0) + 1
    training = {
        "seed": seed, "per_passage": per_passage, "synthetic_weight": synthetic_weight, "C": C,
        "n_passages": len(passages), "corpus_digest": _digest(passages),
        "n_synthetic": len(synthetic), "synthetic_kinds": dict(sorted(kinds.items())),
        "n_answer_corruptions": len(corrupted), "answer_corruption_weight": answer_corruption_weight,
        "answer_corruption_kinds": dict(sorted(Counter(e.kind for e in corrupted).items())),
        "n_pairs": len(pairs), "pairs_digest": _digest(f"{p.label}\x01{p.context}\x01{p.answer}" for p in pairs),
        "threshold_rule": "max balanced accuracy on the training " + ("pairs" if len(pairs) else "claims"),
    }
    return SupportModel(features=support.features, mean=support.mean, scale=support.scale, coef=support.coef,
                        intercept=support.intercept, threshold=round(threshold, 6), training=training)
