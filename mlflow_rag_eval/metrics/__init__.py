"""What is measured: metric units built from judge primitives or from ids.

Importing this package registers the built-in metrics.
"""

from mlflow_rag_eval.keys import display_name
from mlflow_rag_eval.metrics import (  # noqa: F401  (registration)
    abstention,
    citations,
    correctness,
    generation,
    retrieval,
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
    from mlflow_rag_eval.metrics.external.ragas import import_ragas, ragas_metric

    # A missing or broken [ragas] extra is refused when the name is resolved, before any row
    # (as deepeval's is), not found on every row.
    import_ragas()
    return ragas_metric(name)


def _deepeval(name: str) -> Metric:
    from mlflow_rag_eval.metrics.external.deepeval import deepeval_metric

    return deepeval_metric(name)


def is_judge_graded(key: str) -> bool:
    """Whether a metric's scores come from the judge (its ``primitives``). Retrieval metrics
    compare ids and need no calibration; names only an adapter or a rubric knows count as
    judge-graded, the safe side."""
    name = display_name(key)
    base = name.split("@")[0]
    if base not in registered_metrics():
        return True
    try:
        return bool(resolve_metric(name).primitives)
    except (ValueError, TypeError):
        return True


# Imported only when such a name is used: ragas and deepeval are optional extras.
register_namespace("ragas", _ragas)
register_namespace("deepeval", _deepeval)

__all__ = [
    "ENTRY_POINT_GROUP", "Metric", "register_metric", "register_namespace", "registered_metrics",
    "resolve_metric", "Rubric", "is_judge_graded", "rubric",
]
