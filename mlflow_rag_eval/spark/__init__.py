"""Evaluate 100k to 10M rows on Spark: the same records, metrics, judge and run, a different runner.

``mlflow.evaluate`` keeps 10,000 rows of a Spark DataFrame, and the engine runs in one process.
Here every row is read and checked by the single-process code in the executors, the engine
scores each partition (``mapInArrow``), and the run gets what a single-process evaluation of
the same rows gets, with the same values::

    from mlflow_rag_eval.spark import evaluate_spark

    with mlflow.start_run():
        done = evaluate_spark("s3://bucket/eval/rows.parquet", metrics=["faithfulness", "ndcg@10"],
                              judge="local:minilm-l6", output="s3://bucket/eval/scored")

Installed with the ``spark`` extra (``pip install 'mlflow-rag-eval[spark]'``); executors need the
package too. ``import mlflow_rag_eval`` never imports pyspark: only this module does.
"""

from __future__ import annotations

try:
    import pyspark  # noqa: F401
except ImportError as exc:  # pragma: no cover - the extra is installed in the test environment
    raise ImportError("mlflow_rag_eval.spark needs pyspark: pip install 'mlflow-rag-eval[spark]'") from exc

from mlflow_rag_eval.spark._collect import WORST_LIMIT
from mlflow_rag_eval.spark._run import (
    ROWS_ARTIFACT_DIR,
    ROWS_ARTIFACT_LIMIT,
    ROWS_PATH_TAG,
    SparkEvaluation,
    evaluate_spark,
    worker_share,
)
from mlflow_rag_eval.spark._worker import metric_columns

__all__ = [
    "ROWS_ARTIFACT_DIR", "ROWS_ARTIFACT_LIMIT", "ROWS_PATH_TAG", "SparkEvaluation", "WORST_LIMIT", "evaluate_spark",
    "metric_columns", "worker_share",
]
