"""Human-readable outputs of an evaluation: the worst rows, and a self-contained HTML report.

``worst_rows`` is written as ``rag_eval/worst_rows.json``; ``render_report`` gives one HTML page
(no script, no external resource) that opens in MLflow's artifact viewer and offline. Both are
imported on first use, so the page templates can be used without loading the engine.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["render_figures_report", "render_report", "worst_rows"]

_WHERE = {
    "render_figures_report": "mlflow_rag_eval.report._html",
    "render_report": "mlflow_rag_eval.report._html",
    "worst_rows": "mlflow_rag_eval.report.worst",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'mlflow_rag_eval.report' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
