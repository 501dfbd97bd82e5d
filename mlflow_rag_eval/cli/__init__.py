"""The ``mlflow-rag-eval`` command line: :mod:`._main` holds the group, its exit codes and its
error handling; each command is a module of its own, registered on the group when imported here.
"""

from __future__ import annotations

from mlflow_rag_eval.cli import (  # noqa: F401 - each registers its command(s) on main
    cache,
    calibrate,
    compare,
    evaluate,
    gate,
    ppi,
    testset,
    train_cross_encoder,
    train_local_judge,
)
from mlflow_rag_eval.cli._main import main

__all__ = ["main"]
