"""Quickstart: log two variants of a RAG pipeline to MLflow, evaluate both, compare them.

    python examples/quickstart.py            # tracking store: ./mlflow.db (sqlite)
    mlflow ui --backend-store-uri sqlite:///mlflow.db

Offline, no API key: the judge is the embedded MiniLM judge (``local:minilm-l6``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import mlflow

sys.path.insert(0, str(Path(__file__).resolve().parent / "rag_pipeline"))
from pipeline import load_golden, log_pipeline  # noqa: E402

SHOWN = (
    "faithfulness/mean",
    "answer_relevancy/mean",
    "context_relevance/mean",
    "context_recall/mean",
    "hit_at_5/mean",
    "mrr/mean",
    "ndcg_at_10/mean",
)


def evaluate_variant(k: int, data, judge: str, nested: bool) -> tuple[str, dict[str, float]]:
    """Log the pipeline with top-k retrieval in a new run and evaluate it there."""
    with mlflow.start_run(run_name=f"bm25-top{k}", nested=nested) as run:
        mlflow.log_param("retriever_k", k)
        model_info = log_pipeline(k=k)
        result = mlflow.models.evaluate(
            model=model_info.model_uri,
            data=data,
            model_type="rag",
            evaluators="rag",
            evaluator_config={"judge": judge},
        )
        return run.info.run_id, result.metrics


def main(argv: list[str] | None = None) -> dict[int, tuple[str, dict[str, float]]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tracking-uri", default=os.environ.get("MLFLOW_TRACKING_URI", "sqlite:///mlflow.db"))
    parser.add_argument("--experiment", default="rag-quickstart")
    parser.add_argument("--judge", default="local:minilm-l6")
    parser.add_argument("--k", type=int, nargs=2, default=(2, 5), metavar=("K_A", "K_B"))
    args = parser.parse_args(argv)

    mlflow.set_tracking_uri(args.tracking_uri)
    golden = load_golden()
    data = golden[["question", "reference", "relevant_ids", "answerable"]]

    if os.environ.get("MLFLOW_RUN_ID"):
        # Launched by `mlflow run .`: the variants become child runs of the project's run.
        with mlflow.start_run():
            runs = {k: evaluate_variant(k, data, args.judge, nested=True) for k in args.k}
    else:
        mlflow.set_experiment(args.experiment)
        runs = {k: evaluate_variant(k, data, args.judge, nested=False) for k in args.k}

    header = f"{'metric':<24}" + "".join(f"{'top-' + str(k):>12}" for k in runs) + f"{'delta':>10}"
    print("\n" + header)
    print("-" * len(header))
    (ka, (_, ma)), (kb, (_, mb)) = runs.items()
    for key in SHOWN:
        a, b = ma.get(key), mb.get(key)
        cells = "".join(f"{v:>12.3f}" if v is not None else f"{'-':>12}" for v in (a, b))
        delta = f"{b - a:>+10.3f}" if a is not None and b is not None else f"{'':>10}"
        print(f"{key:<24}{cells}{delta}")
    for k, (run_id, _) in runs.items():
        print(f"run top-{k}: {run_id}")
    print(f"\nSee both runs in the MLflow UI:\n  mlflow ui --backend-store-uri {args.tracking_uri}")
    return runs


if __name__ == "__main__":
    main()
