"""The evaluation's seal: params written when a run is evaluated that bind what it holds.

MLflow never lets a param change once logged (``log_param`` with another value is refused),
while artifacts and metrics can be rewritten by anyone who can write to the run. So at
evaluation time the run records, as params:

- ``rag_eval.seal.rows_sha256``: sha256 of the bytes of ``eval_results_table.json``;
- ``rag_eval.seal.slices_sha256``: of ``rag_eval/slices.json`` (``none``: not sliced);
- ``rag_eval.seal.lineage_sha256``: of ``rag_eval/judge_lineage.json``;
- ``rag_eval.seal.directions``: each metric key's direction, ``{"faithfulness": "higher", ...}``.

The gate (:mod:`mlflow_rag_eval.gate.evidence`) checks the artifacts it reads against them. A
run logged before the seal existed has none of these params.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

__all__ = ["DIRECTIONS", "LINEAGE", "NOT_SLICED", "ROWS", "SLICES", "directions_param", "read_directions", "sha256"]

ROWS = "rag_eval.seal.rows_sha256"
SLICES = "rag_eval.seal.slices_sha256"
LINEAGE = "rag_eval.seal.lineage_sha256"
DIRECTIONS = "rag_eval.seal.directions"
#: the value of ``rag_eval.seal.slices_sha256`` for a run that was not sliced
NOT_SLICED = "none"


def sha256(data: str | bytes) -> str:
    """sha256 of text as the artifact store keeps it (UTF-8), or of bytes."""
    return hashlib.sha256(data.encode("utf-8") if isinstance(data, str) else data).hexdigest()


def directions_param(greater_is_better: Mapping[str, bool]) -> str:
    """The ``rag_eval.seal.directions`` value: compact JSON, metric key -> higher | lower."""
    return json.dumps({k: "higher" if v else "lower" for k, v in greater_is_better.items()},
                      separators=(",", ":"), sort_keys=True)


def read_directions(value: str) -> dict[str, bool]:
    """The directions a seal recorded (metric key -> greater is better).

    Raises:
        ValueError: not what :func:`directions_param` writes.
    """
    doc = json.loads(value)
    if not isinstance(doc, dict) or any(v not in ("higher", "lower") for v in doc.values()):
        raise ValueError(f"not a directions seal: {value[:200]!r}")
    return {str(k): v == "higher" for k, v in doc.items()}
