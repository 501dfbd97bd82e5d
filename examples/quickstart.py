"""Quickstart: log two variants of a RAG pipeline to MLflow, evaluate both, compare them,
then let the gate decide whether the second may replace the first as champion.

    python examples/quickstart.py            # tracking store: ./mlflow.db (sqlite)
    mlflow ui --backend-store-uri sqlite:///mlflow.db

Offline, no API key: the judge is the embedded MiniLM judge (``local:minilm-l6``). The gate's
policy is ``examples/gate.yaml``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

# MLflow draws a progress bar for every artifact the gate reads; the demo's output is the table.
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

import mlflow  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent / "rag_pipeline"))
from pipeline import load_golden, log_pipeline  # noqa: E402

POLICY = Path(__file__).resolve().parent / "gate.yaml"

SHOWN = (
    "faithfulness/mean",
    "answer_relevancy/mean",
    "context_relevance/mean",
    "context_recall/mean",
    "hit_at_5/mean",
    "mrr/mean",
    "ndcg_at_10/mean",
)


def evaluate_variant(k: int, data, judge: str, nested: bool, model_name: str) -> tuple[str, dict[str, float]]:
    """Log the pipeline with top-k retrieval as a model, register it, evaluate it in a run.

    The model is logged outside the evaluation run (MLflow 3 keeps logged models as entities
    of their own): MLflow's Evaluation runs page lists only runs that logged no model, and the
    evaluation run names the model it evaluated as its input.
    """
    model_info = log_pipeline(k=k)
    mlflow.register_model(model_info.model_uri, model_name)
    with mlflow.start_run(run_name=f"bm25-top{k}", nested=nested) as run:
        mlflow.log_param("retriever_k", k)
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
    parser.add_argument("--model-name", default="rag-quickstart-pipeline")
    parser.add_argument("--policy", default=str(POLICY))
    args = parser.parse_args(argv)

    mlflow.set_tracking_uri(args.tracking_uri)
    golden = load_golden()
    data = golden[["question", "reference", "relevant_ids", "answerable"]]

    if os.environ.get("MLFLOW_RUN_ID"):
        # Launched by `mlflow run .`: the variants become child runs of the project's run.
        with mlflow.start_run():
            runs = {k: evaluate_variant(k, data, args.judge, True, args.model_name) for k in args.k}
    else:
        mlflow.set_experiment(args.experiment)
        runs = {k: evaluate_variant(k, data, args.judge, False, args.model_name) for k in args.k}

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
    decisions = promote(args.model_name, args.policy)
    print(f"\nSee both runs in the MLflow UI:\n  mlflow ui --backend-store-uri {args.tracking_uri}")
    return runs, decisions


def promote(model_name: str, policy: str) -> list:
    """Gate the two newest versions in turn: the first on floors alone (no champion yet),
    then the second against it. Prints each decision and why."""
    from mlflow_rag_eval.gate import gate

    client = mlflow.MlflowClient()
    versions = sorted(int(v.version) for v in client.search_model_versions(f"name = '{model_name}'"))
    decisions = []
    for version in versions[-2:]:
        decision = gate(model_name, str(version), policy)
        print("\n" + decision.to_text())
        decisions.append(decision)
    return decisions


if __name__ == "__main__":
    main()
