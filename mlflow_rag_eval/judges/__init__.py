"""Who decides: the judge seam and its implementations.

Judges are named by strings, ``<scheme>:<target>?<options>``. ``local:minilm-l6`` (the default)
is the embedded MiniLM judge; ``local:<path>`` loads any sentence-transformers model folder
with the same code. Each scheme belongs to a provider registered with
:func:`register_judge_provider` (third-party packages: the entry-point group
``mlflow_rag_eval.judges``); its module is imported when the scheme is first used.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mlflow_rag_eval.judges.base import (
    JUDGE_STOPPED,
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
from mlflow_rag_eval.judges.registry import (
    ENTRY_POINT_GROUP,
    MissingJudgeDependency,
    build_judge,
    known_schemes,
    register_judge_provider,
)

__all__ = [
    "ClaimsItem",
    "DEFAULT_JUDGE",
    "ENTRY_POINT_GROUP",
    "GeneratedQuestions",
    "Judge",
    "JudgeCapabilityError",
    "JudgeFailure",
    "JudgeInfo",
    "JUDGE_STOPPED",
    "JudgeUnreachable",
    "MissingJudgeDependency",
    "RelevanceItem",
    "Verdict",
    "VerifyItem",
    "get_judge",
    "known_schemes",
    "register_judge_provider",
]

DEFAULT_JUDGE = "local:minilm-l6"


def get_judge(spec: str | Judge | Sequence[str | Judge] | None = None, **options: Any) -> Judge:
    """A judge from its name, or the given Judge as is; a list of them is a judge panel.

    Names: ``local:minilm-l6`` (default) or ``local:<model folder>``; ``openai:/<model>``
    (``?base_url=...`` for any OpenAI-compatible server); ``bedrock:/<model id>``
    (``?region_name=...&profile_name=...``); ``endpoints:/<MLflow deployments endpoint>``
    (``?target_uri=...``); ``llamacpp:/<path.gguf>``; ``scripted``;
    ``panel:<name>,<name>,...`` (a judge panel, :mod:`mlflow_rag_eval.judges.providers.panel`; also
    given as a list of names and judges, or as ``"panel", members=[...]``); and any scheme a
    third-party package registers. Each provider parses its own name and its query-string
    options, and refuses options it does not know.

    ``options`` go to the judge the name makes: for LLM judges the ``LLMJudge`` settings
    (``temperature``, ``timeout``, ``deadline``, ``max_retries``, ``concurrency``, ``cache``,
    ...); for ``local:`` its thresholds.

    Raises:
        ValueError: an unknown scheme (the message lists the known ones), a malformed name, an
            unknown option.
        MissingJudgeDependency: (an ImportError) the provider's optional dependency is not
            installed; the message names what to install.
    """
    if isinstance(spec, (list, tuple)) or (spec == "panel" and "members" in options):
        from mlflow_rag_eval.judges.providers.panel import panel_judge

        members = spec if isinstance(spec, (list, tuple)) else options.pop("members")
        return panel_judge(members, **options)
    if isinstance(spec, Judge):
        if options:
            raise ValueError(f"options {sorted(options)} apply to a judge name, not to a ready Judge")
        return spec
    spec = spec or DEFAULT_JUDGE
    if not isinstance(spec, str):
        raise TypeError(f"a judge is a name or a Judge, got {type(spec).__name__}")
    return build_judge(spec.strip(), **options)
