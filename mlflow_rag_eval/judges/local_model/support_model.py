"""The local judge's learned support model: features of a (claim, passages) pair and a logistic
model over them that gives a support probability.

The features need nothing past the embedding model the judge already loads and a few regular
expressions, so they cost microseconds per claim once the embeddings exist:

- cosine of the claim to its best-matching passage sentence, the runner-up, and the best pair
  of adjacent sentences (claims that merge two sentences);
- content-word coverage over all passages and over the best sentence, coverage of the claim's
  content-word bigrams (word order), the number of content words found nowhere, not even as a
  word sharing the first five letters;
- numbers, month and weekday names, and capitalised names the claim has and the passages lack;
- negation, modality and quantity words present in the claim but not in its best sentence (or
  the reverse, for negation);
- the claim's length and its length relative to the best sentence.

A model is a small JSON file (:meth:`SupportModel.to_json`): the feature names, the scaler's
means and scales, the coefficients, the intercept, the decision threshold and how it was
trained. Inference is numpy only; training (scikit-learn) lives in
:mod:`mlflow_rag_eval.judges.local_model.training`. The model shipped with the package is
``support_model.json`` beside this module; ``local:minilm-l6?support_model=/path/model.json``
names another one.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mlflow_rag_eval._util.text import content_tokens, numbers, split_sentences

__all__ = ["ENTAILMENT_FEATURES", "FEATURES", "Premise", "SupportModel", "claim_features", "default_model_path",
           "entailment_of", "load_support_model", "support_features"]

FEATURES = (
    "cosine_best", "cosine_second", "cosine_pair", "coverage", "coverage_best", "bigram_coverage",
    "missing_words", "unmatched_words", "missing_numbers", "missing_dates", "missing_names",
    "negation_mismatch", "negation_added", "modality_added", "quantity_added", "length_ratio", "log_length",
    "coverage_unit", "coverage_top3", "prefix_coverage_unit", "numbers_off_unit", "names_off_unit",
    "negation_mismatch_unit", "entailment",
)
#: Features that come from the cross-encoder (a model without them never runs it).
ENTAILMENT_FEATURES = ("entailment",)
#: The units (sentences and adjacent pairs) a claim is cross-encoded against: its best three by
#: cosine, the highest P(entailed) counting. The best by cosine alone is often a near-copy that
#: lacks the part of the premise that entails the claim (a pair of sentences where one was read).
ENTAILMENT_UNITS = 3

_NEGATION = re.compile(
    r"\b(?:not|no|never|none|nobody|nothing|neither|nor|without|cannot|den(?:y|ies|ied)|refus\w*|fail\w*)\b|n't\b", re.I
)
_MODALITY = re.compile(
    r"\b(?:may|might|could|would|should|must|possibl\w*|probabl\w*|likely|perhaps|reportedly|allegedly|"
    r"plan\w*|expect\w*|will)\b", re.I,
)
_QUANTITY = re.compile(
    r"\b(?:all|every|each|some|many|most|few|several|none|only|always|never|majority|minority|half|"
    r"dozens?|hundreds?|thousands?|millions?|billions?|more|less|fewer)\b", re.I,
)
_DATE_WORD = re.compile(
    r"\b(?:january|february|march|april|may|june|july|august|september|october|november|december|"
    r"monday|tuesday|wednesday|thursday|friday|saturday|sunday)\b", re.I,
)
_NAME = re.compile(r"\b[A-Z][a-zA-Z'\-]+")
_WORD = re.compile(r"[a-z0-9'\-]+")


def _words(text: str) -> tuple[str, ...]:
    return tuple(_WORD.findall(text.lower()))


def _bigrams(tokens: list[str]) -> set[tuple[str, str]]:
    return set(zip(tokens, tokens[1:]))


@dataclass
class Premise:
    """What the features need of one item's passages, computed once per item."""

    units: list[tuple[str, int]]  # (text, passage index): sentences first, then adjacent pairs
    n_sentences: int
    vectors: np.ndarray  # one unit row per unit
    tokens: frozenset[str]
    prefixes: frozenset[str]
    bigrams: frozenset[tuple[str, str]]
    numbers: frozenset[str]
    words: frozenset[str]
    text: str

    @staticmethod
    def units_of(passages: Sequence[str]) -> tuple[list[tuple[str, int]], int]:
        """The sentences of every passage (a passage without one counts whole), then the pairs
        of adjacent sentences of each passage."""
        singles: list[tuple[str, int]] = []
        pairs: list[tuple[str, int]] = []
        for index, passage in enumerate(passages):
            sentences = split_sentences(passage) or ([passage] if passage.strip() else [])
            singles.extend((s, index) for s in sentences)
            pairs.extend((f"{a} {b}", index) for a, b in zip(sentences, sentences[1:]))
        return singles + pairs, len(singles)

    @classmethod
    def build(cls, passages: Sequence[str], units: list[tuple[str, int]], n_sentences: int,
              vectors: np.ndarray) -> Premise:
        return cls(units=units, n_sentences=n_sentences, vectors=vectors, **_lexical(tuple(passages)))

    @functools.cached_property
    def sentence_words(self) -> frozenset[tuple[str, ...]]:
        """Each sentence's words (lower case, punctuation dropped): a claim with the same words
        in the same order copies that sentence."""
        return frozenset(_words(text) for text, _ in self.units[: self.n_sentences])


@functools.lru_cache(maxsize=4096)
def _lexical(passages: tuple[str, ...]) -> dict[str, Any]:
    """The word sets of a passage list (read-only), computed once: rows retrieve the same passages
    again and again."""
    text = " ".join(passages)
    tokens = content_tokens(text)
    return {"tokens": frozenset(tokens), "prefixes": frozenset(t[:5] for t in tokens),
            "bigrams": frozenset(_bigrams(tokens)), "numbers": frozenset(numbers(text)),
            "words": frozenset(_WORD.findall(text.lower())), "text": text}


def ranked_units(vector: np.ndarray, premise: Premise, k: int = ENTAILMENT_UNITS) -> list[int]:
    """The ``k`` units (sentences and adjacent pairs) closest to the claim's vector, best first."""
    if not premise.units:
        return []
    sims = premise.vectors @ vector
    return [int(i) for i in np.argsort(-sims, kind="stable")[:k]]


def entailment_of(claims: Sequence[tuple[str, np.ndarray, Premise]], cross_encoder, k: int = ENTAILMENT_UNITS
                  ) -> list[tuple[float, int] | None]:
    """Per (claim, vector, premise): the cross-encoder's highest P(entailed) over the claim's
    ``k`` best units by cosine, and that unit's index; None for a premise without units. A claim
    that is one of the passages' sentences word for word is entailed (1.0): no model needed
    (answers that copy a retrieved sentence are common, and the cross-encoder is the cost).
    The cross-encoder runs once, over the distinct (claim, unit) pairs."""
    ranked = [ranked_units(v, p, k) for _, v, p in claims]
    copied = [_words(c) in p.sentence_words for c, _, p in claims]
    pairs = list(dict.fromkeys((c, p.units[u][0]) for (c, _, p), units, same in zip(claims, ranked, copied)
                               if not same for u in units))
    probs = dict(zip(pairs, cross_encoder.entailment(pairs))) if pairs else {}
    out: list[tuple[float, int] | None] = []
    for (c, _, p), units, same in zip(claims, ranked, copied):
        if not units:
            out.append(None)
        elif same:
            out.append((1.0, next(i for i, (t, _) in enumerate(p.units) if _words(t) == _words(c))))
        else:
            out.append(max(((float(probs[(c, p.units[u][0])]), u) for u in units), key=lambda x: x[0]))
    return out


def support_features(claims: Sequence[tuple[str, np.ndarray, Premise]], cross_encoder=None
                     ) -> list[tuple[np.ndarray, int]]:
    """:func:`claim_features` of many (claim, vector, premise) triples, the cross-encoder run once
    over every claim's :data:`ENTAILMENT_UNITS` best units (distinct pairs only); without a
    cross-encoder the entailment features are 0 (a model that uses them must be given one)."""
    entail: list[float | None] = [None] * len(claims)
    if cross_encoder is not None:
        entail = [None if e is None else e[0] for e in entailment_of(claims, cross_encoder)]
    return [claim_features(c, v, p, entail[k]) for k, (c, v, p) in enumerate(claims)]


def claim_features(claim: str, vector: np.ndarray, premise: Premise,
                   entail: float | None = None) -> tuple[np.ndarray, int]:
    """The feature vector of ``claim`` (in :data:`FEATURES` order) and its best unit's index.
    ``entail``: the cross-encoder's highest P(entailed) over the claim's best units
    (:func:`support_features` computes it)."""
    sims = premise.vectors @ vector if len(premise.units) else np.zeros(0)
    singles = sims[: premise.n_sentences]
    if len(singles):
        order = np.argsort(-singles)
        best = int(order[0])
        cos_best = float(singles[best])
        cos_second = float(singles[order[1]]) if len(order) > 1 else cos_best
    else:
        best, cos_best, cos_second = -1, 0.0, 0.0
    cos_pair = float(sims[premise.n_sentences:].max()) if len(sims) > premise.n_sentences else cos_best
    best_text = premise.units[best][0] if best >= 0 else ""
    best_unit = int(np.argmax(sims)) if len(sims) else -1

    tokens = content_tokens(claim)
    n = max(len(tokens), 1)
    missing = [t for t in tokens if t not in premise.tokens]
    best_tokens = set(content_tokens(best_text))
    claim_bigrams = _bigrams(tokens)
    claim_names = {w.lower() for w in _NAME.findall(claim)}
    claim_dates = {w.lower() for w in _DATE_WORD.findall(claim)}

    def count(pattern: re.Pattern, text: str) -> int:
        return len(pattern.findall(text))

    neg_claim, neg_best = count(_NEGATION, claim), count(_NEGATION, best_text)
    quantity_added = {w.lower() for w in _QUANTITY.findall(claim)} - {w.lower() for w in _QUANTITY.findall(premise.text)}
    values = (
        cos_best, cos_second, cos_pair,
        1.0 - len(missing) / n,
        sum(t in best_tokens for t in tokens) / n,
        sum(b in premise.bigrams for b in claim_bigrams) / len(claim_bigrams) if claim_bigrams else 1.0,
        float(len(missing)),
        float(sum(t[:5] not in premise.prefixes for t in missing)),
        float(len(numbers(claim) - premise.numbers)),
        float(len(claim_dates - premise.words)),
        float(len(claim_names - premise.words)),
        float((neg_claim > 0) != (neg_best > 0)),
        float(neg_claim > neg_best),
        float(count(_MODALITY, claim) > count(_MODALITY, best_text)),
        float(len(quantity_added)),
        len(tokens) / max(len(best_tokens), 1),
        math.log1p(len(tokens)),
        *_local_features(claim, tokens, claim_names, singles, premise, best_unit),
        entail or 0.0,
    )
    return np.asarray(values, dtype=np.float64), best_unit


def _local_features(claim: str, tokens: list[str], claim_names: set[str], singles: np.ndarray, premise: Premise,
                    best_unit: int) -> tuple[float, ...]:
    """The claim against the one place that should back it (its best unit: a sentence or a
    pair of adjacent ones) and its three best sentences: a word the document has elsewhere
    does not back a claim about this sentence (an entity or a number swapped in from another
    sentence, the edit whole-document coverage cannot see)."""
    n = max(len(tokens), 1)
    unit_text = premise.units[best_unit][0] if best_unit >= 0 else ""
    unit_tokens = set(content_tokens(unit_text))
    top = np.argsort(-singles)[:3] if len(singles) else []
    top_tokens = set(content_tokens(" ".join(premise.units[int(k)][0] for k in top)))
    unit_prefixes = {t[:5] for t in unit_tokens}
    unit_words = set(_WORD.findall(unit_text.lower()))
    neg_claim, neg_unit = len(_NEGATION.findall(claim)), len(_NEGATION.findall(unit_text))
    return (
        sum(t in unit_tokens for t in tokens) / n,
        sum(t in top_tokens for t in tokens) / n,
        sum(t[:5] in unit_prefixes for t in tokens) / n,
        float(len(numbers(claim) - numbers(unit_text))),
        float(len(claim_names - unit_words)),
        float((neg_claim > 0) != (neg_unit > 0)),
    )


@dataclass(frozen=True)
class SupportModel:
    """A logistic model over standardised :data:`FEATURES`: P(supported | features)."""

    features: tuple[str, ...]
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    coef: tuple[float, ...]
    intercept: float
    threshold: float
    training: dict[str, Any] = field(default_factory=dict)
    #: feature -> factor: a claim with that feature above 0 has its probability multiplied by
    #: the factor. A rule over the learned model for what is rare but decisive — a number the
    #: contexts lack is a fabricated specific (on the development data such a claim is
    #: supported in 0-9% of cases, per source), which strong regularisation alone weighs too lightly.
    penalties: dict[str, float] = field(default_factory=dict)
    #: The cross-encoder's P(entailed) below which it vetoes a claim whatever its support (the
    #: veto, :meth:`with_veto`); None: no veto. The cut where the cross-encoder named in
    #: ``training["cross_encoder_sha256"]`` is confident (``training["veto_rule"]``).
    entailment_veto: float | None = None

    def __post_init__(self):
        unknown = sorted((set(self.features) | set(self.penalties)) - set(FEATURES))
        if unknown:
            raise ValueError(
                f"support model uses features this version of the local judge does not compute "
                f"({unknown}); retrain it with train-local-judge"
            )
        if not (len(self.mean) == len(self.scale) == len(self.coef) == len(self.features)):
            raise ValueError("support model: mean, scale and coef need one value per feature")

    @property
    def features_use_entailment(self) -> bool:
        """Whether the model's features include the cross-encoder's."""
        return any(f in ENTAILMENT_FEATURES for f in self.features)

    @property
    def uses_entailment(self) -> bool:
        """Whether the model reads the cross-encoder (its features, or its veto): then the judge runs it."""
        return self.features_use_entailment or self.entailment_veto is not None

    def with_veto(self, support: np.ndarray, entailment: np.ndarray, threshold: float | None = None,
                  veto: float | None = None) -> np.ndarray:
        """Support lowered by the veto: a claim whose support reaches the threshold and whose
        entailment is below the veto gets ``threshold * (0.5 + 0.5 * entailment / veto)``, below
        the threshold, ranked by its entailment; every other claim keeps its support (one below
        the threshold cannot change its decision, and the judge does not run the cross-encoder for
        it: its entailment may be NaN). So a claim reaches the threshold exactly when its support
        does and its entailment reaches the veto, and the support model still ranks every claim
        the veto leaves alone: the veto sits where the cross-encoder is confident, and elsewhere
        its probability says less than the support model's ranking does."""
        t = self.threshold if threshold is None else threshold
        v = self.entailment_veto if veto is None else veto
        support, entailment = np.asarray(support, dtype=np.float64), np.asarray(entailment, dtype=np.float64)
        if v is None:
            return support
        v = max(v, 1e-9)
        e = np.nan_to_num(entailment, nan=1.0)
        vetoed = t * (0.5 + 0.5 * np.minimum(e / v, 1.0 - 1e-9))
        return np.where((support >= t) & (e < v), vetoed, support)

    @functools.cached_property
    def _columns(self) -> np.ndarray:
        """Where the model's features sit in a :data:`FEATURES` row: a model names the features
        it uses, so one trained on fewer (an older one) still reads today's rows."""
        return np.array([FEATURES.index(f) for f in self.features], dtype=int)

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Support probabilities, one per row of ``X`` (rows in :data:`FEATURES` order)."""
        X_full = X
        X = np.atleast_2d(np.asarray(X, dtype=np.float64))[:, self._columns]
        z = (X - np.asarray(self.mean)) / np.asarray(self.scale)
        logits = z @ np.asarray(self.coef) + self.intercept
        p = 1.0 / (1.0 + np.exp(-np.clip(logits, -40, 40)))
        full = np.atleast_2d(np.asarray(X_full, dtype=np.float64))
        for feature, factor in self.penalties.items():
            p = np.where(full[:, FEATURES.index(feature)] > 0, p * factor, p)
        return p

    def to_json(self) -> str:
        data = asdict(self)
        if not data["penalties"]:  # a model without penalties reads (and hashes) as it did before they existed
            del data["penalties"]
        if data["entailment_veto"] is None:  # likewise without a veto
            del data["entailment_veto"]
        data["schema_version"] = 1
        return json.dumps(data, indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> SupportModel:
        data = json.loads(text)
        data.pop("schema_version", None)
        for key in ("features", "mean", "scale", "coef"):
            data[key] = tuple(data[key])
        return cls(**data)

    @property
    def sha256(self) -> str:
        """sha256 of the model's JSON: part of the judge's fingerprint."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()


def default_model_path() -> Path:
    """The support model shipped with the package."""
    return Path(__file__).with_name("support_model.json")


_LOADED: dict[str, SupportModel] = {}


def load_support_model(path: str | Path | None = None) -> SupportModel:
    """The model at ``path`` (default: the shipped one), read once per process."""
    path = str(Path(path).expanduser().resolve()) if path else str(default_model_path())
    model = _LOADED.get(path)
    if model is None:
        try:
            text = Path(path).read_text()
        except FileNotFoundError:
            raise FileNotFoundError(f"no support model at {path} (train one with: mlflow-rag-eval "
                                    "train-local-judge --corpus ... --out model.json)") from None
        model = _LOADED[path] = SupportModel.from_json(text)
    return model
