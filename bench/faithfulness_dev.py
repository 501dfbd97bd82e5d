"""The local judge's faithfulness against human labels (shared/data/faithfulness_dev), leave one
source out.

    .venv/bin/python bench/faithfulness_dev.py [--data-dir ../shared/data/faithfulness_dev] [--seed 0]

For each of the three sources (SummEdits, WiCE, BEGIN), a support model is trained with the
shipped recipe (:func:`train_support_model`) on the *other two* — their labelled pairs, the
Northwind pairs (``training_data/northwind_pairs.jsonl``), synthetic examples from their passages
and from the Northwind corpus, corrupted sentences of their faithful answers — and scored on the
held-out source. An answer's score is its least-supported sentence's support (the row's
``support``); its decision is that score against the threshold the recipe chose on the training
sources (the one that maximises the lowest balanced accuracy over them). The recipe's model
("v6") is the support model ("v4": the same, without the veto) with the cross-encoder's
confident veto: a claim whose P(entailed) is below the cut its validation on rewrite/edit twins
recorded (at most 0.5% of faithful rewrites below it; no labelled source chose it) fails.

Beside it, on the same rows and in the same run:

- v5: a support model that reads the cross-encoder's entailment as a feature;

- the 20-line baseline: the weakest answer sentence's best cosine to a context sentence, mixed
  half and half with its content-word containment in the context; its decision threshold chosen
  the same way on the two training sources;
- the model shipped before the recipe learnt from three sources (``bench/data/
  support_model_before_three_sources.json``: trained on SummEdits, its own threshold), a
  fixed model, so its figures on SummEdits are in-sample;
- the shipped model (trained on all three: every figure in-sample, not a measurement).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "rag_pipeline"))

from mlflow_rag_eval._util.text import content_tokens  # noqa: E402
from mlflow_rag_eval.calibration.calibrate import agreement  # noqa: E402
from mlflow_rag_eval.judges.local_model.cross_encoder import load_cross_encoder  # noqa: E402
from mlflow_rag_eval.judges.local_model.embedding import Embedder  # noqa: E402
from mlflow_rag_eval.judges.local_model.support_model import (  # noqa: E402
    FEATURES,
    SupportModel,
    load_support_model,
)
from mlflow_rag_eval.judges.local_model.training import (  # noqa: E402
    Featurizer,
    answer_claims,
    load_pairs,
    source_of,
    train_support_model,
)

DATA = ROOT.parent / "shared" / "data" / "faithfulness_dev"
NORTHWIND_PAIRS = ROOT / "training_data" / "northwind_pairs.jsonl"
BEFORE = ROOT / "bench" / "data" / "support_model_before_three_sources.json"


def figures(scores: np.ndarray, labels: np.ndarray, threshold: float) -> tuple[float, float]:
    """AUROC of the scores, balanced accuracy of ``score >= threshold`` (the calibration code's
    figures, so the bench and ``mlflow-rag-eval calibrate`` agree)."""
    out = agreement(scores, labels, threshold=threshold, n_boot=0)
    return out["auroc"]["value"], out["balanced_accuracy"]["value"]


def worst_source_threshold(scores: list[np.ndarray], labels: list[np.ndarray]) -> float:
    """The cut that maximises the lowest balanced accuracy over the given sources."""
    def worst(t: float) -> float:
        return min(figures(s, y, t)[1] for s, y in zip(scores, labels))

    pooled = np.unique(np.concatenate(scores))
    return max(np.quantile(pooled, np.linspace(0.01, 0.99, 99)), key=worst)


def baseline(featurize: Featurizer, embedder: Embedder, claims: list[tuple[str, list[str]]]) -> np.ndarray:
    """Per claim: 0.5 * best cosine to a context sentence + 0.5 * content-word containment."""
    vectors = embedder.encode([c for c, _ in claims])
    out = np.zeros(len(claims))
    for k, (claim, passages) in enumerate(claims):
        premise = featurize.premise(passages)
        cosine = float((premise.vectors[: premise.n_sentences] @ vectors[k]).max()) if premise.n_sentences else 0.0
        tokens = content_tokens(claim)
        out[k] = 0.5 * cosine + 0.5 * sum(t in premise.tokens for t in tokens) / max(len(tokens), 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-dir", default=str(DATA))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    start = time.perf_counter()
    from pipeline import load_corpus

    corpus = [p["text"] for p in load_corpus()]
    pairs = [p for f in sorted(Path(args.data_dir).glob("*_dev.jsonl")) for p in load_pairs(f)]
    sources = sorted({source_of(p) for p in pairs})
    embedder = Embedder()
    cross_encoder = load_cross_encoder()
    featurize = Featurizer(embedder, cross_encoder)
    claims = [(c, [p.context]) for p in pairs for c in answer_claims(p.answer)]
    owner = np.array([i for i, p in enumerate(pairs) for _ in answer_claims(p.answer)])
    t0 = time.perf_counter()
    X = featurize(claims)  # every feature, the cross-encoder's included
    print(f"features of {len(claims)} claims (cross-encoder included): {time.perf_counter() - t0:.0f} s")
    labels = np.array([p.label for p in pairs])
    source = np.array([source_of(p) for p in pairs])

    def per_answer(claim_scores: np.ndarray) -> np.ndarray:
        out = np.full(len(pairs), np.inf)
        np.minimum.at(out, owner, claim_scores)
        return out

    base = per_answer(baseline(featurize, embedder, claims))
    before = SupportModel.from_json(BEFORE.read_text())
    before_scores = per_answer(before.predict(X))
    print(f"rows: {len(pairs)} ({labels.sum()} supported), claims: {len(X)}, sources: {sources}, seed {args.seed}")
    print(f"{'held-out source':<16} {'judge':<44} {'AUROC':>6} {'bal.acc':>8} {'threshold':>10}")
    rows = {"baseline": [], "before": [], "recipe": [], "cross": [], "veto": []}
    entail = X[:, FEATURES.index("entailment")]
    northwind = load_pairs(NORTHWIND_PAIRS)
    for test in sources:
        held = source == test
        train = [s for s in sources if s != test]
        t_base = worst_source_threshold([base[source == s] for s in train], [labels[source == s] for s in train])
        training = [p for p in pairs if source_of(p) != test] + northwind
        # the shipped recipe (make support-model): v4's support model and the cross-encoder's confident veto
        vetoed = train_support_model(corpus, training, seed=args.seed, embedder=embedder, cross_encoder=cross_encoder,
                                     per_passage=4, veto=True)
        model = dataclasses.replace(vetoed, entailment_veto=None)  # v4: the same model without the veto
        support = per_answer(model.predict(X))
        with_ce = train_support_model(corpus, training, seed=args.seed, embedder=embedder, cross_encoder=cross_encoder,
                                      per_passage=1)
        support_ce = per_answer(with_ce.predict(X))
        support_veto = per_answer(vetoed.with_veto(vetoed.predict(X), entail))
        print(f"  v6 on {' + '.join(train)}: support threshold {vetoed.threshold:.3f}, "
              f"entailment veto {vetoed.entailment_veto:.3f} (the cross-encoder's confident cut)")
        for key, name, scores, t in (
            ("baseline", "20-line baseline (cosine + containment)", base, t_base),
            ("before", "model before (SummEdits only, fixed)", before_scores, before.threshold),
            ("recipe", f"v4 support model on {' + '.join(train)}", support, model.threshold),
            ("cross", f"v5 + cross-encoder on {' + '.join(train)}", support_ce, with_ce.threshold),
            ("veto", f"v6 v4 + cross-encoder veto on {' + '.join(train)}", support_veto, vetoed.threshold),
        ):
            auroc, bacc = figures(scores[held], labels[held], t)
            rows[key].append((auroc, bacc))
            print(f"{test:<16} {name:<44} {auroc:>6.3f} {bacc:>8.3f} {t:>10.3f}")
    for key, name in (("baseline", "20-line baseline"), ("before", "model before"), ("recipe", "v4 support model"),
                      ("cross", "v5 + cross-encoder"), ("veto", "v6 v4 + cross-encoder veto")):
        (auroc, bacc), (low_auroc, low_bacc) = np.mean(rows[key], axis=0), np.min(rows[key], axis=0)
        print(f"{'mean (lowest)':<16} {name:<44} {auroc:>6.3f} {bacc:>8.3f}   lowest AUROC {low_auroc:.3f}, "
              f"lowest bal.acc {low_bacc:.3f}")
    shipped = load_support_model()
    scores = per_answer(shipped.with_veto(shipped.predict(X), entail))
    print("shipped model (trained on all three: in-sample, not a measurement): " + ", ".join(
        f"{s} {figures(scores[source == s], labels[source == s], shipped.threshold)[0]:.3f}/"
        f"{figures(scores[source == s], labels[source == s], shipped.threshold)[1]:.3f}" for s in sources)
        + f" (AUROC/bal.acc at its threshold {shipped.threshold:.3f})")
    breaking_held_out(cross_encoder)
    print(f"time: {time.perf_counter() - start:.1f} s")


def breaking_held_out(cross_encoder) -> None:
    """The cross-encoder alone on the Breaking NLI categories its training pairs leave out
    (``training_data/entailment_pairs.py``: HELD_OUT_BREAKING), P(entailed) >= 0.5 as its decision."""
    import gzip
    import json

    sys.path.insert(0, str(ROOT / "training_data"))
    from entailment_pairs import HELD_OUT_BREAKING

    path = ROOT.parent / "shared" / "data" / "nli" / "breaking_nli.jsonl.gz"
    if not path.exists():
        print(f"held-out Breaking NLI: {path} not found")
        return
    rows = [json.loads(line) for line in gzip.open(path, "rt")]
    for category in (*HELD_OUT_BREAKING, "all three"):
        chosen = [r for r in rows if r["category"] == category or (category == "all three"
                                                                  and r["category"] in HELD_OUT_BREAKING)]
        p = cross_encoder.entailment([(r["hypothesis"], r["premise"]) for r in chosen])
        y = np.array([r["label"] == "entailment" for r in chosen])
        own = cross_encoder.meta.get("validation", {}).get("threshold")
        print(f"held-out Breaking NLI {category:<10} n={len(chosen):>5}: accuracy {np.mean((p >= 0.5) == y):.3f} "
              f"at 0.5" + (f", {np.mean((p >= own) == y):.3f} at its validation threshold {own:.3f}" if own else "")
              + f" (entailed {y.sum()}, not {len(y) - y.sum()})")


if __name__ == "__main__":
    main()
