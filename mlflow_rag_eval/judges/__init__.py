"""Who decides: the judge seam and its implementations.

Judges are named by strings. ``local:minilm-l6`` (the default) is the embedded MiniLM judge;
``local:<path>`` loads any sentence-transformers model folder with the same code.
"""

from __future__ import annotations

from mlflow_rag_eval.judges.base import (
    ClaimsItem,
    GeneratedQuestions,
    Judge,
    JudgeCapabilityError,
    JudgeFailure,
    JudgeInfo,
    JudgeUnreachable,
    RelevanceItem,
    Verdict,
    VerifyItem,
)

__all__ = [
    "ClaimsItem",
    "DEFAULT_JUDGE",
    "GeneratedQuestions",
    "Judge",
    "JudgeCapabilityError",
    "JudgeFailure",
    "JudgeInfo",
    "JudgeUnreachable",
    "RelevanceItem",
    "Verdict",
    "VerifyItem",
    "get_judge",
]

DEFAULT_JUDGE = "local:minilm-l6"


def get_judge(spec: str | Judge | None = None, **options) -> Judge:
    """A judge from its name, or the given Judge as is.

    Names: ``local:minilm-l6`` (default) or ``local:<model folder>``; ``openai:/<model>``
    (``?base_url=...`` for any OpenAI-compatible server); ``bedrock:/<model id>``;
    ``endpoints:/<MLflow deployments endpoint>``; ``llamacpp:/<path.gguf>``; ``scripted``.
    ``options`` go to the LLM judge (``temperature``, ``concurrency``, ``cache``, ...).
    """
    if isinstance(spec, Judge):
        return spec
    spec = spec or DEFAULT_JUDGE
    if not isinstance(spec, str):
        raise TypeError(f"a judge is a name or a Judge, got {type(spec).__name__}")
    scheme, _, target = spec.partition(":")
    if scheme == "local":
        from mlflow_rag_eval.judges.local import LocalJudge

        return LocalJudge(model=target or "minilm-l6", **options)
    target = target[1:] if target.startswith("/") else target
    if scheme == "scripted":
        from mlflow_rag_eval.judges.scripted import ScriptedBackend

        backend = ScriptedBackend()
    elif scheme == "openai":
        from mlflow_rag_eval.judges.openai_compat import parse_openai_target

        backend = parse_openai_target(spec)
    elif scheme == "bedrock":
        from mlflow_rag_eval.judges.bedrock import BedrockBackend

        backend = BedrockBackend(target)
    elif scheme == "endpoints":
        from mlflow_rag_eval.judges.mlflow_endpoints import MlflowEndpointsBackend

        backend = MlflowEndpointsBackend(target)
    elif scheme == "llamacpp":
        from mlflow_rag_eval.judges.llamacpp import LlamaCppBackend

        backend = LlamaCppBackend(target)
    else:
        raise ValueError(
            f"unknown judge {spec!r}; use local:, openai:/, bedrock:/, endpoints:/, llamacpp:/ or scripted"
        )
    from mlflow_rag_eval.judges.llm import LLMJudge

    return LLMJudge(backend, name=spec.split("?")[0], **options)
