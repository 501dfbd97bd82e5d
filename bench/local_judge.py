"""Rows per second of the whole metric suite with the local judge (target: >= 50 rows/s).

    .venv/bin/python bench/local_judge.py [--rows 500] [--judge local:minilm-l6]

``--judge "local:minilm-l6?entailment_threshold=0"`` is the default judge without its
cross-encoder veto (the judge before issue 43), to compare.

Rows come from the Northwind example: each golden question in several variants (top-k from 3
to 7, answers made of one or two retrieved sentences, with and without a citation), so
answers differ between rows while passages recur, as they do when a pipeline retrieves from
one corpus. The timing covers the suite (metric computation, not MLflow logging), with the
embedding model already loaded and the embedding cache empty.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "rag_pipeline"))

import pandas as pd  # noqa: E402

from mlflow_rag_eval.evaluation.engine import evaluate_records  # noqa: E402
from mlflow_rag_eval.judges import get_judge  # noqa: E402
from mlflow_rag_eval.records import records_from_frame  # noqa: E402

SUITE = [
    "faithfulness", "answer_relevancy", "context_relevance", "context_precision", "context_recall",
    "answer_correctness", "abstention", "false_abstention", "citation_validity", "citation_support",
    "hit@5", "precision@5", "recall@5", "mrr", "map", "ndcg@10",
]


def bench_frame(n: int) -> pd.DataFrame:
    from pipeline import BM25, load_corpus, load_golden, split_sentences

    golden = load_golden()
    index = BM25(load_corpus())
    rows = []
    for i in range(n):
        g = golden.iloc[i % len(golden)]
        variant = i // len(golden)
        k = 3 + variant % 5
        hits = index.search(g["question"], k)
        contexts = [{"id": p["id"], "text": p["text"]} for p, _ in hits]
        sentences = [s for c in contexts for s in split_sentences(c["text"])]
        pick = sentences[variant % max(len(sentences), 1): variant % max(len(sentences), 1) + 1 + variant % 2]
        answer = " ".join(pick) or "I don't know."
        if variant % 3 == 1 and contexts:
            answer += " [1]"
        rows.append({"question": g["question"], "answer": answer, "contexts": contexts,
                     "reference": g["reference"], "relevant_ids": g["relevant_ids"],
                     "answerable": bool(g["answerable"])})
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=500)
    parser.add_argument("--judge", default="local:minilm-l6")
    args = parser.parse_args()
    records = records_from_frame(bench_frame(args.rows))
    judge = get_judge(args.judge)
    judge.embedder.encode(["load the model before timing"])
    start = time.perf_counter()
    result = evaluate_records(records, SUITE, judge, progress=False)
    elapsed = time.perf_counter() - start
    errors = sum(m.summary.n_error for m in result.metrics)
    print(f"{len(records)} rows, {len(SUITE)} metrics, local judge {judge.info().name}")
    print(f"unique texts embedded: {len(judge.embedder._cache)}")
    print(f"time: {elapsed:.2f} s -> {len(records) / elapsed:.1f} rows/s ({errors} errors)")
    for name, seconds in sorted(result.timings.items(), key=lambda kv: -kv[1]):
        print(f"  {name:<20} {seconds:6.2f} s")


if __name__ == "__main__":
    main()
