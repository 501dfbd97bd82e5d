"""Who decides: the judge seam and its implementations.

Judges are named by strings. ``local:minilm-l6`` (the default) is the embedded MiniLM judge;
``local:<path>`` loads any sentence-transformers model folder with the same code.
"""

from __future__ import annotations

from mlflow_rag_eval.judges.base import (
    Judge,
    JudgeCapabilityError,
    JudgeFailure,
    JudgeInfo,
    RelevanceItem,
    Verdict,
    VerifyItem,
)

__all__ = [
    "DEFAULT_JUDGE",
    "Judge",
    "JudgeCapabilityError",
    "JudgeFailure",
    "JudgeInfo",
    "RelevanceItem",
    "Verdict",
    "VerifyItem",
    "get_judge",
]

DEFAULT_JUDGE = "local:minilm-l6"


def get_judge(spec: str | Judge | None = None) -> Judge:
    """A judge from its name (``local:minilm-l6``), or the given Judge as is."""
    if isinstance(spec, Judge):
        return spec
    spec = spec or DEFAULT_JUDGE
    if not isinstance(spec, str):
        raise TypeError(f"a judge is a name or a Judge, got {type(spec).__name__}")
    scheme, _, target = spec.partition(":")
    if scheme == "local":
        from mlflow_rag_eval.judges.local import LocalJudge

        return LocalJudge(model=target or "minilm-l6")
    raise ValueError(f"unknown judge {spec!r}; available here: {DEFAULT_JUDGE!r}, 'local:<model folder>'")
