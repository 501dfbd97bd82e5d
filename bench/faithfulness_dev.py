"""The local judge's faithfulness against human labels (shared/data/faithfulness_dev).

    .venv/bin/python bench/faithfulness_dev.py [--data ../shared/data/faithfulness_dev/summedits_dev.jsonl]

Each pair (document, summary) becomes a record whose only context is the document; the
faithfulness score (share of summary sentences supported) is compared with the human label
(1 = consistent). Prints AUROC, and balanced accuracy with the score binarised at 1.0 (every
sentence supported) and at the best threshold found on this same data (optimistic: tuned here).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from sklearn.metrics import balanced_accuracy_score, roc_auc_score

from mlflow_rag_eval.engine import evaluate_records
from mlflow_rag_eval.records import Context, RagRecord

DEFAULT = Path(__file__).resolve().parents[2] / "shared" / "data" / "faithfulness_dev" / "summedits_dev.jsonl"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default=str(DEFAULT))
    parser.add_argument("--judge", default="local:minilm-l6")
    parser.add_argument("--limit", type=int, default=None)
    args = parser.parse_args()
    rows = [json.loads(line) for line in open(args.data)][: args.limit]
    records = [
        RagRecord(question="Summarize the document.", answer=r["answer"], contexts=(Context(r["context"]),))
        for r in rows
    ]
    labels = np.array([r["label"] for r in rows])
    start = time.perf_counter()
    result = evaluate_records(records, ["faithfulness"], args.judge)
    elapsed = time.perf_counter() - start
    (metric,) = result.metrics
    scores = np.array([r.value if r.value is not None else np.nan for r in metric.rows])
    ok = ~np.isnan(scores)
    auroc = roc_auc_score(labels[ok], scores[ok])
    bacc_all = balanced_accuracy_score(labels[ok], scores[ok] >= 1.0)
    best_t, best_b = max(
        ((t, balanced_accuracy_score(labels[ok], scores[ok] >= t)) for t in np.unique(scores[ok])),
        key=lambda x: x[1],
    )
    print(f"rows: {len(rows)} (scored {ok.sum()}, errors {metric.summary.n_error}), positives {labels.sum()}")
    print(f"judge: {result.judge.name} fingerprint {result.judge.fingerprint}")
    print(f"AUROC: {auroc:.3f}")
    print(f"balanced accuracy at score >= 1.0: {bacc_all:.3f}")
    print(f"balanced accuracy at best threshold {best_t:.3f} (tuned on this data): {best_b:.3f}")
    print(f"time: {elapsed:.1f} s ({len(rows) / elapsed:.1f} rows/s)")


if __name__ == "__main__":
    main()
