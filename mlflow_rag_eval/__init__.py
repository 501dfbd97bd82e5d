"""mlflow_rag_eval: evaluate RAG pipelines inside MLflow.

The curated public API. Everything is imported on first use, so ``import mlflow_rag_eval``
loads neither MLflow nor torch (the evaluator plugin is found by MLflow through its entry point).

Routes into MLflow:
- ``mlflow.models.evaluate(..., model_type="rag", evaluators="rag")`` — the evaluator plugin;
- :func:`rag_metrics` — ``extra_metrics`` for MLflow's default evaluator;
- :func:`rag_scorers` — scorers for ``mlflow.genai.evaluate``;
- :func:`evaluate_spark` — 100k to 10M rows on Spark (the ``spark`` extra), into the same run.
Building blocks: :func:`evaluate_records`, :func:`get_judge`, :func:`rubric`,
:func:`compare_runs`, :func:`compute_slices` (per-slice results); extension points: :func:`register_metric`, :func:`register_judge_provider`.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "__version__",
    "ColumnMapping",
    "RagRecord",
    "compare_runs",
    "compute_slices",
    "evaluate_records",
    "evaluate_spark",
    "evaluate_traces",
    "get_judge",
    "rag_metrics",
    "rag_scorers",
    "records_from_frame",
    "register_judge_provider",
    "register_metric",
    "rubric",
]

_WHERE = {
    "ColumnMapping": "mlflow_rag_eval.records",
    "RagRecord": "mlflow_rag_eval.records",
    "records_from_frame": "mlflow_rag_eval.records",
    "evaluate_records": "mlflow_rag_eval.evaluation.engine",
    "evaluate_spark": "mlflow_rag_eval.spark",  # imports pyspark, on first use only
    "evaluate_traces": "mlflow_rag_eval.routes.production_traces",
    "get_judge": "mlflow_rag_eval.judges",
    "register_judge_provider": "mlflow_rag_eval.judges",
    "rag_metrics": "mlflow_rag_eval.routes.extra_metrics",
    "rag_scorers": "mlflow_rag_eval.routes.scorers",
    "register_metric": "mlflow_rag_eval.metrics",
    "rubric": "mlflow_rag_eval.metrics",
    "compare_runs": "mlflow_rag_eval.compare",
    "compute_slices": "mlflow_rag_eval.evaluation.slices",
}


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("mlflow-rag-eval")
    except metadata.PackageNotFoundError:  # a source tree on sys.path, not installed
        return "0.0.0+unknown"


def __getattr__(name: str) -> Any:
    if name == "__version__":  # read from the installed metadata on first use, not at import
        globals()[name] = value = _version()
        return value
    if name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'mlflow_rag_eval' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
