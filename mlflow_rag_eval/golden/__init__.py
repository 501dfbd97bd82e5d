"""Golden sets: written from the user's documents by a judge, checked by the same judge,
versioned in MLflow by digest.

    from mlflow_rag_eval.golden import generate_golden_set, load_passages, log_golden_set

    golden = generate_golden_set(load_passages("docs.jsonl"), "openai:/gpt-4o-mini", n=100)
    print(golden.report.to_text())          # what was dropped, and why
    logged = log_golden_set(golden, name="support-docs")
    # evaluate on golden_dataset(golden, "support-docs") (or golden.to_frame()): every run logs
    # rag_eval.dataset_digest == logged.digest
"""

from mlflow_rag_eval.golden.generate import (
    QUESTION_TYPES,
    GoldenRow,
    GoldenSet,
    GoldenSetReport,
    Passage,
    generate_golden_set,
    load_passages,
)
from mlflow_rag_eval.golden.prompts import GOLDEN_PROMPTS, GOLDEN_PROMPTS_VERSION

__all__ = [
    "GOLDEN_PROMPTS", "GOLDEN_PROMPTS_VERSION", "QUESTION_TYPES", "GoldenRow", "GoldenSet", "GoldenSetReport",
    "LoggedGoldenSet", "Passage", "generate_golden_set", "golden_dataset", "load_passages", "log_golden_set",
]


def __getattr__(name: str):
    # mlflow is imported only by what logs: generating a set needs no tracking store.
    if name in ("log_golden_set", "LoggedGoldenSet", "golden_dataset"):
        from mlflow_rag_eval.golden import mlflow_log

        return getattr(mlflow_log, name)
    raise AttributeError(name)
