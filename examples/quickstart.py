"""Quickstart: write a golden set from the example documents and log it, evaluate two versions
of a RAG pipeline on it (overall and per slice), compare them, then let the gate decide whether
each may become the champion.

    python examples/quickstart.py            # tracking store: ./mlflow.db (sqlite)
    mlflow ui --backend-store-uri sqlite:///mlflow.db

The two versions retrieve alike (BM25, top 5) and differ in their answer generator: the second
is *overconfident*: it never abstains and, on about 40% of questions, adds a sentence the
passages do not support. The faithfulness and abstention figures, the report's worst rows and
"generator invents" quadrant, the per-slice tables and the gate all show it.

Offline, no API key: the golden set is written by the ``scripted`` judge (deterministic rules
standing in for an LLM: cloze questions from passage sentences); the evaluations use the
embedded MiniLM judge (``local:minilm-l6``). The gate's policy is ``examples/gate.yaml``.
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
from pipeline import DATA_DIR, log_pipeline  # noqa: E402

POLICY = Path(__file__).resolve().parent / "gate.yaml"
VARIANTS = ("extractive", "overconfident")
SLICE_BY = ["question_type", "difficulty"]
GOLDEN_SET = "northwind-generated"

SHOWN = (
    "faithfulness/mean",
    "abstention/mean",
    "answer_relevancy/mean",
    "context_relevance/mean",
    "context_recall/mean",
    "hit_at_5/mean",
    "mrr/mean",
    "ndcg_at_10/mean",
)
SLICE_METRICS = ("faithfulness", "abstention", "hit_at_5")


def write_golden_set(n: int, name: str):
    """Write a golden set from the example corpus with the scripted judge, and log it."""
    from mlflow_rag_eval.golden import generate_golden_set, load_passages, log_golden_set

    golden = generate_golden_set(load_passages(DATA_DIR / "corpus.jsonl"), "scripted", n=n, seed=0)
    logged = log_golden_set(golden, name)
    where = f"MLflow evaluation dataset {logged.dataset_id}" if logged.dataset_id else f"run {logged.run_id}"
    print(f"Golden set {name!r}: {len(golden.rows)} questions, digest {logged.digest} ({where})")
    print(golden.report.to_text())
    return golden


def evaluate_variant(generator: str, data, judge: str, nested: bool, model_name: str, k: int = 5,
                     min_overlap: float = 0.5) -> tuple[str, dict[str, float]]:
    """Log the pipeline with the given answer generator as a model, evaluate it in a run, sliced
    by question type and difficulty, and register it from that run.

    The model is logged outside the evaluation run (MLflow 3 keeps logged models as entities
    of their own): MLflow's Evaluation runs page lists only runs that logged no model, and the
    evaluation run names the model it evaluated as its input.
    """
    model_info = log_pipeline(k=k, min_overlap=min_overlap, generator=generator)
    with mlflow.start_run(run_name=f"bm25-top{k}-{generator}", nested=nested) as run:
        mlflow.log_params({"retriever_k": k, "generator": generator})
        result = mlflow.models.evaluate(
            model=model_info.model_uri,
            data=data,
            model_type="rag",
            evaluators="rag",
            evaluator_config={"judge": judge, "slice_by": SLICE_BY},
        )
    register_from_run(model_info, model_name, run.info.run_id)
    return run.info.run_id, result.metrics


def register_from_run(model_info, model_name: str, run_id: str) -> str:
    """Register the logged model as a version whose ``run_id`` is its evaluation run: the one
    fact of a version no one can change later, and the gate's evidence under every rule
    (``evidence: version-run`` trusts nothing else)."""
    client = mlflow.MlflowClient()
    if not client.search_registered_models(f"name = '{model_name}'"):
        client.create_registered_model(model_name)
    return client.create_model_version(model_name, source=model_info.model_uri, run_id=run_id,
                                       model_id=model_info.model_id).version


def _cell(value) -> str:
    return f"{value:>12.3f}" if value is not None else f"{'-':>12}"


def print_comparison(runs: dict[str, tuple[str, dict[str, float]]]) -> None:
    """The overall metrics of both runs, then per slice (from each run's rag_eval/slices.json)."""
    from mlflow_rag_eval.evaluation.slices import load_slices

    (name_a, (run_a, ma)), (name_b, (run_b, mb)) = runs.items()
    header = f"{'metric':<26}{name_a:>12}{name_b:>14}{'delta':>10}"
    print("\n" + header)
    print("-" * len(header))
    for key in SHOWN:
        a, b = ma.get(key), mb.get(key)
        delta = f"{b - a:>+10.3f}" if a is not None and b is not None else f"{'':>10}"
        print(f"{key:<26}{_cell(a)}  {_cell(b)}{delta}")
    slices_a, slices_b = load_slices(run_a), load_slices(run_b)
    for field in SLICE_BY:
        print(f"\nper {field} (mean; n = rows scored)")
        print(f"{'slice':<26}{'metric':<14}{name_a:>12}{name_b:>14}{'delta':>10}")
        values_b = slices_b["fields"][field]["slices"]
        for value, sa in slices_a["fields"][field]["slices"].items():
            sb = values_b.get(value, {"metrics": {}})
            for metric in SLICE_METRICS:
                a, b = sa["metrics"].get(metric, {}), sb["metrics"].get(metric, {})
                if not a.get("n_scored") and not b.get("n_scored"):
                    continue
                mean_a, mean_b = a.get("mean"), b.get("mean")
                delta = f"{mean_b - mean_a:>+10.3f}" if mean_a is not None and mean_b is not None else f"{'':>10}"
                label = f"{value} (n={a.get('n_scored', 0)})"
                print(f"{label:<26}{metric:<14}{_cell(mean_a)}  {_cell(mean_b)}{delta}")


def main(argv: list[str] | None = None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tracking-uri", default=os.environ.get("MLFLOW_TRACKING_URI", "sqlite:///mlflow.db"))
    parser.add_argument("--experiment", default="rag-quickstart")
    parser.add_argument("--judge", default="local:minilm-l6")
    parser.add_argument("--n", type=int, default=100, help="questions in the generated golden set")
    parser.add_argument("--model-name", default="rag-quickstart-pipeline")
    parser.add_argument("--policy", default=str(POLICY))
    args = parser.parse_args(argv)

    mlflow.set_tracking_uri(args.tracking_uri)

    def run_all(nested: bool):
        from mlflow_rag_eval.golden import golden_dataset

        golden = write_golden_set(args.n, GOLDEN_SET)
        # The golden set by name and digest: the evaluation runs' Dataset column names it.
        data = golden_dataset(golden, GOLDEN_SET)
        return {g: evaluate_variant(g, data, args.judge, nested, args.model_name) for g in VARIANTS}

    if os.environ.get("MLFLOW_RUN_ID"):
        # Launched by `mlflow run .`: the variants become child runs of the project's run.
        with mlflow.start_run():
            runs = run_all(True)
    else:
        mlflow.set_experiment(args.experiment)
        runs = run_all(False)

    print_comparison(runs)
    for name, (run_id, _) in runs.items():
        print(f"run {name}: {run_id}")
    decisions = promote(args.model_name, args.policy)
    print(f"\nSee both runs in the MLflow UI:\n  mlflow ui --backend-store-uri {args.tracking_uri}")
    return runs, decisions


def promote(model_name: str, policy: str) -> list:
    """Gate the two newest versions in turn: the first on floors alone (no champion yet),
    then the second against it (the overconfident one: refused). Prints each decision and why."""
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
