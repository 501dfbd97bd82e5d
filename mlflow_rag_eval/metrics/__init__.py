"""What is measured: metric units built from judge primitives or from ids.

Importing this package registers the built-in metrics.
"""

from mlflow_rag_eval.metrics import (  # noqa: F401  (registration)
    abstention,
    citations,
    correctness,
    generation,
    retrieval_metrics,
)
from mlflow_rag_eval.metrics.base import (
    ENTRY_POINT_GROUP,
    Metric,
    register_metric,
    register_namespace,
    registered_metrics,
    resolve_metric,
)
from mlflow_rag_eval.metrics.rubric import Rubric, rubric


def _ragas(name: str) -> Metric:
    from mlflow_rag_eval.integrations.ragas_adapter import _import_ragas, ragas_metric

    # A missing or broken [ragas] extra is refused when the name is resolved, before any row
    # (as deepeval's is), not found on every row.
    _import_ragas()
    return ragas_metric(name)


def _deepeval(name: str) -> Metric:
    from mlflow_rag_eval.integrations.deepeval_adapter import deepeval_metric

    return deepeval_metric(name)


# Imported only when such a name is used: ragas and deepeval are optional extras.
register_namespace("ragas", _ragas)
register_namespace("deepeval", _deepeval)

__all__ = [
    "ENTRY_POINT_GROUP", "Metric", "register_metric", "register_namespace", "registered_metrics",
    "resolve_metric", "Rubric", "rubric",
]
