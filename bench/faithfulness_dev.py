"""The local judge's faithfulness against human labels (shared/data/faithfulness_dev), leave one
domain out.

    .venv/bin/python bench/faithfulness_dev.py [--data .../summedits_dev.jsonl] [--seed 0] [--answer-corruption-weight 2]

For each domain of the data (``source``: summedits/news, summedits/podcast), a support model is
trained with :func:`train_support_model` on the *other* domain only — its labelled pairs, the
Northwind reference pairs (``training_data/northwind_pairs.jsonl``), synthetic corruptions
of their documents and of the Northwind example corpus, and corrupted sentences of its faithful
answers (``--answer-corruption-weight``; 0 leaves them out) — and scored on the held-out domain:
the shipped model's recipe with one domain left out. An answer's score is its least-supported sentence's support probability (the
row's ``support`` confidence); its decision is that score against the model's own threshold
(chosen on the training domain). Printed beside it, on the same rows: the rules the local judge
used before (``local-rules-v2``: 0.5 cosine + 0.5 content-word coverage, halved when a number
is missing, a sentence supported at >= 0.62, the row's score the supported share; decisions at
score 1.0, every sentence supported), and the shipped model (trained on both domains, so its
figures here are in-sample: not a measurement).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "rag_pipeline"))

from mlflow_rag_eval.calibration.calibrate import agreement  # noqa: E402
from mlflow_rag_eval.judges.local_model.embedding import Embedder  # noqa: E402
from mlflow_rag_eval.judges.local_model.support_model import FEATURES, load_support_model  # noqa: E402
from mlflow_rag_eval.judges.local_model.training import (  # noqa: E402
    Featurizer,
    answer_claims,
    load_pairs,
    train_support_model,
)

DEFAULT = ROOT.parent / "shared" / "data" / "faithfulness_dev" / "summedits_dev.jsonl"
NORTHWIND_PAIRS = ROOT / "training_data" / "northwind_pairs.jsonl"


def northwind() -> list[str]:
    from pipeline import load_corpus

    return [p["text"] for p in load_corpus()]


def figures(scores: np.ndarray, labels: np.ndarray, threshold: float) -> tuple[float, float]:
    """AUROC of the scores, balanced accuracy of ``score >= threshold`` (the calibration code's
    figures, so the bench and ``mlflow-rag-eval calibrate`` agree)."""
    out = agreement(scores, labels, threshold=threshold, n_boot=0)
    return out["auroc"]["value"], out["balanced_accuracy"]["value"]


def rules_v2(X: np.ndarray) -> np.ndarray:
    """Per-claim support of local-rules-v2, from the same features."""
    f = {name: X[:, i] for i, name in enumerate(FEATURES)}
    score = 0.5 * np.maximum(np.maximum(f["cosine_best"], f["cosine_pair"]), 0) + 0.5 * f["coverage"]
    return np.where(f["missing_numbers"] > 0, score * 0.5, score)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default=str(DEFAULT))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--answer-corruption-weight", type=float, default=2.0,
                        help="weight of corrupted faithful answers (0: the recipe before they were added)")
    args = parser.parse_args()
    start = time.perf_counter()
    pairs = load_pairs(args.data)
    embedder = Embedder()
    featurize = Featurizer(embedder)
    owner = np.array([i for i, p in enumerate(pairs) for _ in answer_claims(p.answer)])
    X = featurize([(c, [p.context]) for p in pairs for c in answer_claims(p.answer)])
    labels = np.array([p.label for p in pairs])
    groups = np.array([p.group for p in pairs])
    corpus = northwind()

    def per_answer(claim_scores: np.ndarray, reduce=np.minimum) -> np.ndarray:
        out = np.full(len(pairs), np.inf if reduce is np.minimum else 0.0)
        reduce.at(out, owner, claim_scores)
        return out

    v2_claims = rules_v2(X)
    v2_share = np.zeros(len(pairs))
    np.add.at(v2_share, owner, v2_claims >= 0.62)
    v2_share /= np.bincount(owner, minlength=len(pairs))
    print(f"rows: {len(pairs)} ({labels.sum()} consistent), claims: {len(X)}, seed {args.seed}")
    print(f"{'test domain':<20} {'judge':<34} {'AUROC':>6} {'bal.acc':>8} {'threshold':>10}")
    lodo = []
    for test in sorted(set(groups)):
        train_pairs = [p for p in pairs if p.group != test] + load_pairs(NORTHWIND_PAIRS)
        model = train_support_model(corpus, train_pairs, seed=args.seed, embedder=embedder,
                                    answer_corruption_weight=args.answer_corruption_weight)
        held = groups == test
        support = per_answer(model.predict(X))
        auroc, bacc = figures(support[held], labels[held], model.threshold)
        lodo.append((auroc, bacc))
        old_auroc, old_bacc = figures(v2_share[held], labels[held], 1.0)
        print(f"{test:<20} {'local-rules-v2 (before)':<34} {old_auroc:>6.3f} {old_bacc:>8.3f} {'1.0':>10}")
        print(f"{test:<20} {'support model, trained on the rest':<34} {auroc:>6.3f} {bacc:>8.3f} "
              f"{model.threshold:>10.3f}")
    mean_auroc, mean_bacc = np.mean(lodo, axis=0)
    print(f"{'mean of held-out domains':<55} {mean_auroc:>6.3f} {mean_bacc:>8.3f}")
    shipped = load_support_model()
    auroc, bacc = figures(per_answer(shipped.predict(X)), labels, shipped.threshold)
    print(f"shipped model on all rows (in-sample, it was trained on them): AUROC {auroc:.3f}, "
          f"balanced accuracy {bacc:.3f} at its threshold {shipped.threshold:.3f}")
    print(f"time: {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
