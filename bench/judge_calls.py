"""Judge calls, tokens and wall time of an LLM-judged evaluation against a loopback server.

    .venv/bin/python bench/judge_calls.py [--rows 200] [--latency 0.1] [--concurrency 1 16]

A local OpenAI-compatible server adds a fixed latency per call and answers valid JSON for the
requested schema (verdicts for every claim/passage index it finds in the prompt). The suite is
faithfulness, answer relevancy, context precision and context recall with 5 contexts per row
(the Northwind example pipeline retrieving top 5). For each concurrency it runs cold (empty
cache) and warm (same cache again) and prints calls per row, tokens per row and wall time.

Token counts are what the server reports: characters / 4 of the prompt and reply (it has no
tokenizer); real BPE counts for English are close to that.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "rag_pipeline"))

from mlflow_rag_eval.evaluation.engine import evaluate_records  # noqa: E402
from mlflow_rag_eval.judges import get_judge  # noqa: E402
from mlflow_rag_eval.judges.cache import JudgeCache  # noqa: E402
from mlflow_rag_eval.records import records_from_frame  # noqa: E402
from mlflow_rag_eval.testing import FakeJudgeServer  # noqa: E402

METRICS = ["faithfulness", "answer_relevancy", "context_precision", "context_recall"]


def bench_rows(n: int):
    """n rows: golden questions answered by the example pipeline with top-5 retrieval."""
    from pipeline import BM25, extract_answer, load_corpus, load_golden

    golden = load_golden()
    index = BM25(load_corpus())
    rows = []
    for i in range(n):
        g = golden.iloc[i % len(golden)]
        question = g["question"] if i < len(golden) else f"{g['question']} (variant {i // len(golden)})"
        contexts = [{"id": p["id"], "text": p["text"]} for p, _ in index.search(question, 5)]
        rows.append({"question": question, "answer": extract_answer(question, contexts, 0.0),
                     "contexts": contexts, "reference": g["reference"]})
    import pandas as pd

    return records_from_frame(pd.DataFrame(rows))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--latency", type=float, default=0.1)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    args = parser.parse_args()
    records = bench_rows(args.rows)
    server = FakeJudgeServer(latency=args.latency)
    spec = f"openai:/bench-judge?base_url=http://127.0.0.1:{server.port}/v1"
    # Load the embedding model once so that neither run pays its start-up.
    get_judge("scripted").similarity([("warm", "up")])
    print(f"{args.rows} rows, {len(METRICS)} metrics ({', '.join(METRICS)}), "
          f"{args.latency * 1000:.0f} ms per judge call, 5 contexts per row")
    print("calls/row: provider calls; identical prompts (repeated questions) hit the cache even cold")
    print(f"{'concurrency':>11} {'run':>5} {'calls/row':>10} {'hits/row':>9} {'tokens/row':>11} {'wall s':>8} {'errors':>7}")
    for concurrency in args.concurrency:
        with tempfile.TemporaryDirectory() as tmp:
            cache = JudgeCache(Path(tmp) / "cache.sqlite")
            for run in ("cold", "warm"):
                judge = get_judge(spec, cache=cache, concurrency=concurrency)
                start = time.perf_counter()
                result = evaluate_records(records, METRICS, judge, progress=False)
                wall = time.perf_counter() - start
                usage = judge.usage()
                errors = sum(m.summary.n_error for m in result.metrics)
                tokens = (usage["tokens_in"] + usage["tokens_out"]) / len(records)
                print(f"{concurrency:>11} {run:>5} {usage['provider_calls'] / len(records):>10.2f} "
                      f"{usage['cache_hits'] / len(records):>9.2f} "
                      f"{tokens:>11.0f} {wall:>8.2f} {errors:>7}")
                judge.close()
    server.close()


if __name__ == "__main__":
    main()
