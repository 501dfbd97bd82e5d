"""Human-readable outputs of an evaluation: the worst rows, and a self-contained HTML report.

``worst_rows`` is written as ``rag_eval/worst_rows.json``; ``render_report`` gives one HTML page
(no script, no external resource) that opens in MLflow's artifact viewer and offline.
"""

from mlflow_rag_eval.report._html import render_report
from mlflow_rag_eval.report._worst import worst_rows

__all__ = ["render_report", "worst_rows"]
