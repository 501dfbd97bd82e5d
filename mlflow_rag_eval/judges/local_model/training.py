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

Sources count alike. A labelled pair's source is its group up to the first ``/`` (``summedits``,
``wice``, ``begin``, or ``""``); each source brings its labelled claims (weight 1 in all, half to
each class), synthetic examples from its own passages (``synthetic_weight`` in all) and corrupted
sentences of its faithful answers (``answer_corruption_weight`` in all); passages of ``corpus``
that no pair uses are one more source of synthetic examples. A large source (SummEdits has four
times WiCE's pairs) cannot make the model learn its shape alone — a judge fitted to one source
ranks well there and near chance on the others.

The model is scikit-learn's ``LogisticRegression`` on standardised features, classes balanced,
strongly regularised (``C``): the settings that held up leave-one-source-out on the development
data (``bench/faithfulness_dev.py`` trains on two sources and tests on the third, for each). Over
it, one rule: a claim with a number the contexts lack has its probability multiplied by
``missing_number_factor`` (such claims are supported in 0-9% of the development rows, in every
source; the regularised model alone weighs that rare feature too lightly to refuse them).
Its threshold maximises the *lowest* balanced accuracy of answer-level decisions (an answer is
supported when its least-supported sentence is) over the labelled sources, so it holds on every
kind of data rather than suiting the largest; without labelled pairs, the balanced accuracy of
claim-level decisions on the synthetic examples. Training is deterministic for a seed and the
same inputs (on one machine: embeddings may move in the 7th digit across CPUs).
"""

from __future__ import annotations

import dataclasses
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
from mlflow_rag_eval.judges.local_model.support_model import (
    ENTAILMENT_FEATURES,
    FEATURES,
    Premise,
    SupportModel,
    entailment_of,
    support_features,
)

__all__ = ["FeatureTable", "Featurizer", "LabelledPair", "answer_claims", "load_corpus", "load_pairs", "source_of", "train_support_model"]


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


def json_lines(path: str | Path, make, needs: str) -> list:
    """``make(row)`` for each JSON object of a JSON-lines file (or ``.jsonl.gz``); a row it cannot
    make is a ValueError naming the file, the line and ``needs``."""
    out = []
    path = Path(path)
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    for n, line in enumerate(raw.decode("utf-8").splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        try:
            out.append(make(row))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{path}:{n}: needs {needs} ({exc})") from None
    return out


def load_pairs(path: str | Path) -> list[LabelledPair]:
    """Labelled pairs from a JSONL file (or ``.jsonl.gz``) with ``context``, ``answer`` and ``label`` (0/1); the
    optional ``source`` is kept as the pair's group (a domain, for leave-one-domain-out)."""
    return json_lines(path, lambda row: LabelledPair(row["context"], row["answer"], int(row["label"]),
                                                     str(row.get("source", ""))), "context, answer and a 0/1 label")


class FeatureTable:
    """Feature rows of (claim, passages) pairs by a digest of the pair, with what computed them:
    the encoder's files, the cross-encoder's (when it gives a feature) and the feature names.

    ``train-local-judge --features-out`` writes every row its training computed, beside the
    model; a retraining that reads the table (the rebuild test) takes its rows instead of running
    the encoder, except a fixed share (``recheck_every``: the rows of one passage list in
    ``recheck_every``, by digest), which it computes again and compares: a row that differs (a
    feature's code changed, another encoder) makes it refuse the table.
    """

    #: how far a recomputed feature may be from the table's: embeddings move in the 7th digit
    #: across CPUs, and cosines with them
    TOLERANCE = 1e-5

    def __init__(self, identity: dict | None = None, rows: dict[str, np.ndarray] | None = None, *,
                 recheck_every: int = 0):
        self.identity = identity  # set by the first Featurizer that uses an empty table
        self.rows: dict[str, np.ndarray] = dict(rows or {})
        self.recheck_every = recheck_every
        self.computed = 0  # rows the table lacked
        self.rechecked = 0  # rows it had, computed again and found equal

    @staticmethod
    def identity_of(embedder: Embedder, cross_encoder=None) -> dict:
        """What computes a row: the encoder (name, files), the cross-encoder and the features."""
        return {"encoder": embedder.model_name, "encoder_sha256": embedder.files_sha256,
                "cross_encoder_sha256": cross_encoder.sha256[:16] if cross_encoder is not None else None,
                "features": list(FEATURES)}

    @staticmethod
    def key(claim: str, passages: Sequence[str]) -> str:
        return _digest([claim, *passages])

    def wants(self, key: str, passages: Sequence[str]) -> bool:
        """Whether the row of ``key`` has to be computed: the table lacks it, or checks it. The
        rows checked are those of one in ``recheck_every`` passage lists (by digest), all their
        claims: embedding the passages is most of the work, and each is then done once."""
        if key not in self.rows:
            return True
        if self.recheck_every <= 0:
            return False
        return int(_digest(passages)[:8], 16) % self.recheck_every == 0

    def put(self, key: str, row: np.ndarray, pair: tuple[str, Sequence[str]]) -> None:
        """Add a computed row, or compare it with the table's (ValueError when they differ)."""
        known = self.rows.get(key)
        if known is None:
            self.rows[key] = row
            self.computed += 1
            return
        if not np.allclose(known, row, rtol=0, atol=self.TOLERANCE, equal_nan=True):
            off = np.where(np.isnan(known) != np.isnan(row), np.inf, np.nan_to_num(np.abs(known - row)))
            worst = int(np.argmax(off))
            raise ValueError(f"the feature table is stale: for the claim {pair[0][:60]!r}, {FEATURES[worst]} is "
                             f"{row[worst]!r} now and {known[worst]!r} in the table; rebuild it (make support-model)")
        self.rechecked += 1

    def save(self, path: str | Path, **identity) -> None:
        keys = sorted(self.rows)
        np.savez_compressed(Path(path), keys=np.array(keys), X=np.stack([self.rows[k] for k in keys]),
                            identity=np.array(json.dumps({**self.identity, **identity}, sort_keys=True)))

    @classmethod
    def load(cls, path: str | Path, *, recheck_every: int = 0) -> FeatureTable:
        with np.load(Path(path), allow_pickle=False) as data:
            return cls(json.loads(str(data["identity"])), dict(zip(map(str, data["keys"]), data["X"])),
                       recheck_every=recheck_every)


class Featurizer:
    """Features of (claim, passages) pairs, premises embedded once per distinct passage list;
    the entailment features from ``cross_encoder`` (without one they are 0). With a ``table``
    (:class:`FeatureTable`), rows it holds are read from it and the rows computed are added."""

    def __init__(self, embedder: Embedder, cross_encoder=None, table: FeatureTable | None = None):
        self.embedder = embedder
        self.cross_encoder = cross_encoder
        self.table = table
        if table is not None:
            ours = FeatureTable.identity_of(embedder, cross_encoder)
            if table.identity is None:
                table.identity = ours
            elif (theirs := {k: table.identity.get(k) for k in ours}) != ours:
                raise ValueError(f"the feature table was computed by {theirs}, not by {ours}")
        self._premises: dict[tuple[str, ...], Premise] = {}

    def premise(self, passages: Sequence[str]) -> Premise:
        key = tuple(passages)
        found = self._premises.get(key)
        if found is None:
            self.premises([passages])
            found = self._premises[key]
        return found

    def premises(self, passage_lists: Iterable[Sequence[str]]) -> None:
        """Embed the units of every passage list not embedded yet, all in one ``encode`` call.

        One call per premise ran each premise's few sentences in steps of one or two texts (the
        encoder's steps hold texts of one token count), ~1,100 calls for the support model's
        training data; together, texts of one length from every premise share a step. The
        encoder gives a text the same vector in any batch, so the features are the same bits.
        """
        todo: dict[tuple[str, ...], tuple[list[tuple[str, int]], int]] = {}
        for passages in passage_lists:
            key = tuple(passages)
            if key not in self._premises and key not in todo:
                todo[key] = Premise.units_of(passages)
        texts = list(dict.fromkeys(u for units, _ in todo.values() for u, _ in units))
        vectors = self.embedder.encode(texts) if texts else None
        row = {text: i for i, text in enumerate(texts)}
        for key, (units, n_sentences) in todo.items():
            found = vectors[[row[u] for u, _ in units]] if units else np.zeros((0, 1), np.float32)
            self._premises[key] = Premise.build(key, units, n_sentences, found)

    def entailment(self, pairs: Sequence[tuple[str, Sequence[str]]], cross_encoder) -> np.ndarray:
        """The cross-encoder's P(entailed) of each (claim, passages), as the judge's veto reads it."""
        if not pairs:
            return np.zeros(0)
        vectors = self.embedder.encode([claim for claim, _ in pairs])
        self.premises(passages for _, passages in pairs)
        triples = [(claim, vectors[k], self.premise(passages)) for k, (claim, passages) in enumerate(pairs)]
        return np.array([np.nan if e is None else e[0] for e in entailment_of(triples, cross_encoder)])

    def __call__(self, pairs: Sequence[tuple[str, Sequence[str]]]) -> np.ndarray:
        if self.table is None or not pairs:
            return self._compute(pairs)
        keys = [self.table.key(claim, passages) for claim, passages in pairs]
        todo = [i for i, k in enumerate(keys) if self.table.wants(k, pairs[i][1])]
        for i, row in zip(todo, self._compute([pairs[i] for i in todo])):
            self.table.put(keys[i], row, pairs[i])
        return np.stack([self.table.rows[k] for k in keys])

    def _compute(self, pairs: Sequence[tuple[str, Sequence[str]]]) -> np.ndarray:
        if not pairs:
            return np.zeros((0, len(FEATURES)))
        vectors = self.embedder.encode([claim for claim, _ in pairs])
        self.premises(passages for _, passages in pairs)
        triples = [(claim, vectors[k], self.premise(passages)) for k, (claim, passages) in enumerate(pairs)]
        return np.array([x for x, _ in support_features(triples, self.cross_encoder)])


def _fit(X: np.ndarray, y: np.ndarray, w: np.ndarray, C: float):
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    w = w.astype(float).copy()
    for label in (0, 1):  # balance the classes
        share = w[y == label].sum()
        if share:
            w[y == label] *= 0.5 / share
    w *= len(w)  # mean weight 1: C means what it means in scikit-learn
    scaler = StandardScaler().fit(X)
    scaler.scale_[scaler.scale_ == 0] = 1.0
    model = LogisticRegression(C=C, max_iter=5000).fit(scaler.transform(X), y, sample_weight=w)
    return scaler, model


def _worst_source_threshold(scores: Sequence[np.ndarray], labels: Sequence[np.ndarray]) -> float:
    """The score cut that maximises the *lowest* balanced accuracy over the sources (ties: the
    lowest such cut): one threshold that has to hold on every kind of data, not the cut that
    suits the largest source. Candidates: up to 400 quantiles of the pooled scores."""
    pooled = np.unique(np.concatenate(scores))
    candidates = pooled if len(pooled) <= 400 else np.unique(np.quantile(pooled, np.linspace(0, 1, 401)))
    best, best_worst = 0.5, -1.0
    for t in candidates:
        worst = 1.0
        for s, y in zip(scores, labels):
            pos, neg = max((y == 1).sum(), 1), max((y == 0).sum(), 1)
            decide = s >= t
            worst = min(worst, ((decide & (y == 1)).sum() / pos + (~decide & (y == 0)).sum() / neg) / 2)
        if worst > best_worst + 1e-12:
            best, best_worst = float(t), worst
    return best


def _confident_veto(cross_encoder) -> float:
    """The veto the cross-encoder's validation on rewrite/edit twins recorded: the P(entailed)
    below which it fails at most 0.5% of faithful rewrites (:func:`.cross_training.confident_veto`)."""
    try:
        return round(float(cross_encoder.meta["validation"]["confident"]["veto"]), 6)
    except (AttributeError, KeyError, TypeError, ValueError):
        raise ValueError("the entailment veto needs a cross-encoder whose file records its confident veto "
                         "(meta validation.confident.veto: train-cross-encoder --validation writes it)") from None


def _best_threshold(scores: np.ndarray, labels: np.ndarray) -> float:
    """The score cut that maximises balanced accuracy (ties: the lowest such cut)."""
    return _worst_source_threshold([scores], [labels])


def source_of(pair: LabelledPair) -> str:
    """The source a pair comes from: its group up to the first ``/`` (``summedits/news`` and
    ``summedits/podcast`` are one source, SummEdits)."""
    return pair.group.split("/")[0]


def _digest(items: Iterable[str]) -> str:
    h = hashlib.sha256()
    for item in items:
        h.update(item.encode())
        h.update(b"\x00")
    return h.hexdigest()[:16]


@dataclass
class _Source:
    """One source's training material: its labelled pairs' claims, synthetic examples made from
    its passages and corrupted sentences of its faithful answers."""

    name: str
    pairs: list[LabelledPair]
    X_pairs: np.ndarray
    owner: np.ndarray  # pair index of each claim row
    X_synthetic: np.ndarray
    y_synthetic: np.ndarray
    X_corrupted: np.ndarray
    synthetic_kinds: Counter
    corrupted_kinds: Counter

    @property
    def labels(self) -> np.ndarray:
        return np.array([p.label for p in self.pairs], dtype=int)

    def answer_scores(self, predict) -> np.ndarray:
        """Each pair's score: its least-supported sentence's support."""
        out = np.full(len(self.pairs), np.inf)
        if len(self.owner):
            np.minimum.at(out, self.owner, predict(self.X_pairs))
        return out


def _source(name: str, passages: Sequence[str], pairs: list[LabelledPair], featurize: Featurizer, *, seed: int,
            per_passage: int, corrupt: bool) -> _Source:
    synthetic = synthetic_examples(passages, seed=seed, per_passage=per_passage)
    corrupted = answer_corruptions(((c, p.context) for p in pairs if p.label == 1 for c in answer_claims(p.answer)),
                                   seed=seed) if corrupt else []
    return _Source(
        name=name, pairs=pairs,
        X_pairs=featurize([(c, [p.context]) for p in pairs for c in answer_claims(p.answer)]),
        owner=np.array([i for i, p in enumerate(pairs) for _ in answer_claims(p.answer)], dtype=int),
        X_synthetic=featurize([(e.claim, [e.passage]) for e in synthetic]),
        y_synthetic=np.array([e.label for e in synthetic], dtype=int),
        X_corrupted=featurize([(e.claim, [e.passage]) for e in corrupted]),
        synthetic_kinds=Counter(e.kind for e in synthetic), corrupted_kinds=Counter(e.kind for e in corrupted),
    )


def _examples(sources: Sequence[_Source], keep: Sequence[np.ndarray], synthetic_weight: float,
              answer_corruption_weight: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every source weighs the same: its labelled claims 1 in all (half to each class), its
    synthetic examples ``synthetic_weight`` in all, its corrupted sentences
    ``answer_corruption_weight`` in all. A big source cannot drown a small one."""
    X, y, w = [], [], []
    for source, kept in zip(sources, keep):
        yp = source.labels[source.owner][kept]
        parts = [(source.X_synthetic, source.y_synthetic, synthetic_weight),
                 (source.X_corrupted, np.zeros(len(source.X_corrupted), dtype=int), answer_corruption_weight)]
        for X_, y_, total in parts:
            if len(X_) and total > 0:
                X.append(X_), y.append(y_), w.append(np.full(len(X_), total / len(X_)))
        for label in (0, 1):
            rows = yp == label
            if rows.any():
                X.append(source.X_pairs[kept][rows]), y.append(yp[rows]), w.append(np.full(rows.sum(), 0.5 / rows.sum()))
    return np.vstack(X), np.concatenate(y), np.concatenate(w)


def _least_supported_only(sources: Sequence[_Source], predict) -> list[np.ndarray]:
    """Multiple-instance labels: a pair labelled 0 keeps only its least-supported sentence as a
    negative (the others may well be fine); a pair labelled 1 keeps all of them."""
    keep = []
    for source in sources:
        kept = np.ones(len(source.owner), dtype=bool)
        if len(source.owner):
            p = predict(source.X_pairs)
            for i in np.flatnonzero(source.labels == 0):
                idx = np.flatnonzero(source.owner == i)
                if len(idx):
                    kept[idx] = False
                    kept[idx[np.argmin(p[idx])]] = True
        keep.append(kept)
    return keep


def train_support_model(corpus: Sequence[str], pairs: Sequence[LabelledPair] = (), *, seed: int = 0,
                        per_passage: int = 4, synthetic_weight: float = 0.05, C: float = 1e-4,
                        answer_corruption_weight: float = 0.05, missing_number_factor: float = 0.25,
                        embedder: Embedder | None = None, cross_encoder=None, veto: bool = False,
                        features: Sequence[str] = FEATURES, feature_table: FeatureTable | None = None) -> SupportModel:
    """Train a support model on human-labelled ``pairs`` from several sources (a pair's source:
    :func:`source_of`), synthetic examples from each source's passages and from ``corpus``,
    and corrupted sentences of each source's faithful answers; see the module's docstring.

    ``veto`` (needs ``cross_encoder``): the model does not read the cross-encoder; the
    cross-encoder vetoes it instead where it is confident: a claim whose P(entailed) is below
    the cut its validation on rewrite/edit twins recorded (``meta["validation"]["confident"]``:
    at most 0.5% of faithful rewrites below it) is unsupported whatever its support. The support
    threshold is chosen as without a veto. (Choosing both thresholds together on the labelled
    sources put the veto at the balanced cut and cost 0.05 mean AUROC leave-one-source-out.)

    ``feature_table`` (:class:`FeatureTable`): feature rows are read from it where it holds them
    (but for the share it rechecks), and every row computed is added to it (to save beside the
    model: ``train-local-judge --features-out``)."""
    if veto and cross_encoder is None:
        raise ValueError("the entailment veto needs a cross-encoder")
    if veto:
        features = [f for f in features if f not in ENTAILMENT_FEATURES]
    # under the veto the model reads no entailment: the cross-encoder runs only for the claims
    # whose support could pass (see _worst_source_threshold_and_veto)
    featurize_ = Featurizer(embedder or Embedder(), None if veto else cross_encoder, feature_table)
    by_source: dict[str, list[LabelledPair]] = {}
    for p in pairs:
        by_source.setdefault(source_of(p), []).append(p)
    corrupt = answer_corruption_weight > 0
    sources = [_source(name, list(dict.fromkeys(p.context for p in group)), group, featurize_, seed=seed,
                       per_passage=per_passage, corrupt=corrupt) for name, group in sorted(by_source.items())]
    own = [p for p in dict.fromkeys(corpus) if p not in {q.context for q in pairs}]
    if own:
        sources.append(_source("corpus", own, [], featurize_, seed=seed, per_passage=per_passage, corrupt=False))
    if not any(len(s.X_synthetic) or len(s.pairs) for s in sources):
        raise ValueError("no training examples: the corpus has no sentence of six words or more, and no labelled pairs")
    if cross_encoder is None:  # nothing computes them
        features = [f for f in features if f not in ENTAILMENT_FEATURES]
    columns = [FEATURES.index(f) for f in features]
    keep = [np.ones(len(s.owner), dtype=bool) for s in sources]
    for round_ in range(2 if pairs else 1):
        X, y, w = _examples(sources, keep, synthetic_weight, answer_corruption_weight)
        scaler, model = _fit(X[:, columns], y, w, C)
        support = SupportModel(
            features=tuple(features), mean=tuple(map(float, scaler.mean_)), scale=tuple(map(float, scaler.scale_)),
            coef=tuple(map(float, model.coef_[0])), intercept=float(model.intercept_[0]), threshold=0.5,
            penalties={"missing_numbers": missing_number_factor} if missing_number_factor != 1 else {},
        )
        keep = _least_supported_only(sources, support.predict)
    labelled = [s for s in sources if len(s.pairs)]
    if labelled:
        threshold = _worst_source_threshold([s.answer_scores(support.predict) for s in labelled],
                                            [s.labels for s in labelled])
    else:
        threshold = _best_threshold(np.concatenate([support.predict(s.X_synthetic) for s in sources]),
                                    np.concatenate([s.y_synthetic for s in sources]))
    settings = {"cross_encoder_sha256": cross_encoder.sha256[:16]} if cross_encoder is not None else {}
    veto_value = _confident_veto(cross_encoder) if veto else None
    if veto_value is not None:
        settings["veto_rule"] = ("a claim whose support passes is unsupported when the cross-encoder's entailment "
                                 "(best of its 3 closest units) is below the veto: "
                                 + cross_encoder.meta["validation"]["confident"]["rule"])
    return dataclasses.replace(support, threshold=round(threshold, 6), entailment_veto=veto_value, training=_lineage(
        sources, corpus, pairs, seed=seed, per_passage=per_passage, synthetic_weight=synthetic_weight, C=C,
        answer_corruption_weight=answer_corruption_weight, missing_number_factor=missing_number_factor, **settings))


def _lineage(sources: Sequence[_Source], corpus: Sequence[str], pairs: Sequence[LabelledPair],
             **settings) -> dict:
    """How a model was trained: settings, input digests and counts, per source."""
    passages = list(dict.fromkeys([*corpus, *(p.context for p in pairs)]))
    return {
        **settings, "n_passages": len(passages), "corpus_digest": _digest(passages),
        "n_synthetic": sum(len(s.y_synthetic) for s in sources),
        "synthetic_kinds": dict(sorted(sum((s.synthetic_kinds for s in sources), Counter()).items())),
        "n_answer_corruptions": sum(len(s.X_corrupted) for s in sources),
        "answer_corruption_kinds": dict(sorted(sum((s.corrupted_kinds for s in sources), Counter()).items())),
        "n_pairs": len(pairs), "pairs_digest": _digest(f"{p.label}\x01{p.context}\x01{p.answer}" for p in pairs),
        "sources": {s.name: {"pairs": len(s.pairs), "synthetic": len(s.y_synthetic), "corrupted": len(s.X_corrupted)}
                    for s in sources},
        "threshold_rule": ("max of the lowest balanced accuracy over the labelled sources" if pairs
                           else "max balanced accuracy on the synthetic claims"),
    }
