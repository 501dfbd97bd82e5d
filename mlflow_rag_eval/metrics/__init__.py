"""What is measured: metric units built from judge primitives or from ids.

Importing this package registers the built-in metrics.
"""

from mlflow_rag_eval.metrics import generation, retrieval_metrics  # noqa: F401  (registration)
from mlflow_rag_eval.metrics.base import (
    ENTRY_POINT_GROUP,
    Metric,
    register_metric,
    registered_metrics,
    resolve_metric,
)

__all__ = ["ENTRY_POINT_GROUP", "Metric", "register_metric", "registered_metrics", "resolve_metric"]
