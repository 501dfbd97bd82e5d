"""The judge seam: the primitives RAG metrics are built from.

Metrics never see a provider; they ask a :class:`Judge` for primitives. Every primitive takes a
batch of rows and returns one outcome per row, in order: the row's answer, or a
:class:`JudgeFailure` naming why the judge could not decide. A failure is never a score: the
metric turns it into a named per-row error, counted in ``n_error``.

Batching at this seam lets the local judge encode every text of a batch at once and lets LLM
judges fan rows out under their own concurrency limit.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from mlflow_rag_eval._util.redaction import redact

__all__ = [
    "Judge",
    "JudgeCapabilityError",
    "JudgeFailure",
    "JudgeInfo",
    "JUDGE_STOPPED",
    "JudgeUnreachable",
    "Outcome",
    "RelevanceItem",
    "Verdict",
    "VerifyItem",
    "ClaimsItem",
    "GeneratedQuestions",
]

T = TypeVar("T")


@dataclass(frozen=True)
class Verdict:
    """A judge's decision on one claim, passage or answer.

    Attributes:
        value: the decision (True: supported / relevant / abstains).
        reason: a short human-readable reason.
        evidence: the text the decision rests on, where there is one (e.g. the supporting
            context sentence).
        score: the judge's continuous confidence in [0, 1], where it has one.
        source_index: index of the passage the evidence comes from, where it applies.
        votes: a judge panel's decision only: each member's vote, in member order (its verdict
            for a yes/no decision, its score for a graded one; None where the member failed).
            Metrics keep verdicts in their rows' details, so the votes reach the run's table,
            the inter-judge agreement and the disagreement rows without the metric knowing.
    """

    value: bool
    reason: str = ""
    evidence: str | None = None
    score: float | None = None
    source_index: int | None = None
    votes: tuple[bool | float | None, ...] | None = None

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


class JudgeFailure(Exception):
    """The judge could not decide on a row. ``kind`` names the failure (e.g. ``ParseError``)."""

    def __init__(self, kind: str, message: str):
        self.kind = kind
        self.message = message = redact(message)  # it becomes a row's error, a log line, a report line
        super().__init__(f"{kind}: {message}")


#: The kind of a row's failure when its judge stopped asking before judging it: an outage past
#: its budget (``LLMSettings.outage_budget``). The rows judged before keep their verdicts; a run
#: with such rows says it stopped (``EvaluationFigures.stopped``).
JUDGE_STOPPED = "JudgeStopped"


class JudgeCapabilityError(RuntimeError):
    """A metric asked a judge for a primitive it cannot perform (a configuration error)."""


class JudgeUnreachable(RuntimeError):
    """The judge's provider cannot be reached at all (consecutive connection failures): the
    evaluation stops with this one error, before anything is logged, instead of turning every
    row into the same failure."""


Outcome = T | JudgeFailure


@dataclass(frozen=True)
class VerifyItem:
    """Claims to check against the passages of one row."""

    passages: Sequence[str]
    claims: Sequence[str]


@dataclass(frozen=True)
class RelevanceItem:
    """Passages to rate for one question (optionally given a reference answer)."""

    question: str
    passages: Sequence[str]
    reference: str | None = None


@dataclass(frozen=True)
class ClaimsItem:
    """A text whose claims are to be extracted and checked against one row's passages."""

    text: str
    passages: Sequence[str]


@dataclass(frozen=True)
class GeneratedQuestions:
    """Questions an answer would answer, and whether the answer is noncommittal."""

    questions: list[str]
    noncommittal: bool = False


@dataclass(frozen=True)
class JudgeInfo:
    """What identifies a judge in lineage, caches and the gate.

    ``fingerprint`` changes whenever anything that can change a verdict changes: the model
    files or id, the generation parameters, the thresholds, the prompt versions.
    """

    name: str
    kind: str
    model: str
    fingerprint: str
    prompts_version: str
    params: dict[str, Any] = field(default_factory=dict)
    model_files_sha256: str | None = None
    #: a judge panel's members, in order (the lineage lists each one); empty for one judge
    members: tuple[JudgeInfo, ...] = ()


class Judge(ABC):
    """Who decides. Subclasses implement the primitives they can; others raise
    :class:`JudgeCapabilityError`, which :meth:`supports` reports up front."""

    #: primitives this judge implements; metrics check it before any row is judged.
    capabilities: frozenset[str] = frozenset()

    @abstractmethod
    def info(self) -> JudgeInfo: ...

    def supports(self, primitive: str) -> bool:
        return primitive in self.capabilities

    def require(self, *primitives: str, metric: str) -> None:
        missing = [p for p in primitives if not self.supports(p)]
        if missing:
            raise JudgeCapabilityError(
                f"metric {metric!r} needs {missing}, which judge {self.info().name!r} cannot do"
            )

    def extract_claims(self, texts: Sequence[str]) -> list[Outcome[list[str]]]:
        raise JudgeCapabilityError(f"{self.info().name} cannot extract claims")

    def verify(self, items: Sequence[VerifyItem]) -> list[Outcome[list[Verdict]]]:
        raise JudgeCapabilityError(f"{self.info().name} cannot verify claims")

    def rate_relevance(self, items: Sequence[RelevanceItem]) -> list[Outcome[list[Verdict]]]:
        raise JudgeCapabilityError(f"{self.info().name} cannot rate relevance")

    def similarity(self, pairs: Sequence[tuple[str, str]]) -> list[Outcome[float]]:
        raise JudgeCapabilityError(f"{self.info().name} cannot measure similarity")

    def extract_and_verify(self, items: Sequence[ClaimsItem]) -> list[Outcome[list[tuple[str, Verdict]]]]:
        """The claims of each text with a verdict each. By default two primitives (extract,
        then verify the rows that have claims); an LLM judge fuses them into one call."""
        extracted = self.extract_claims([item.text for item in items])
        out: list = list(extracted)
        todo = [i for i, claims in enumerate(extracted) if not isinstance(claims, JudgeFailure) and claims]
        verdicts = self.verify([VerifyItem(items[i].passages, extracted[i]) for i in todo])
        for i, outcome in zip(todo, verdicts):
            out[i] = outcome if isinstance(outcome, JudgeFailure) else list(zip(extracted[i], outcome))
        return out

    def usage(self) -> dict[str, Any]:
        """What this judge has spent so far (calls, cache hits, tokens...), for lineage."""
        return {}

    def stopped(self) -> str | None:
        """Why this judge stopped asking in the current evaluation (an outage past its budget:
        each row it has not judged fails as :data:`JUDGE_STOPPED`), None while it asks."""
        return None

    def restart(self) -> None:
        """Forget a stop (:data:`JUDGE_STOPPED`) of an earlier evaluation: each evaluation
        starts asking. Nothing to forget for a judge that cannot stop (a local one)."""

    def generate_questions(self, answers: Sequence[str], n: int) -> list[Outcome[GeneratedQuestions]]:
        raise JudgeCapabilityError(f"{self.info().name} cannot generate questions")

    def is_abstention(self, items: Sequence[tuple[str, str]]) -> list[Outcome[Verdict]]:
        raise JudgeCapabilityError(f"{self.info().name} cannot detect abstentions")

    def grade(self, rubric: Any, fields: Sequence[dict[str, str]]) -> list[Outcome[Verdict]]:
        raise JudgeCapabilityError(f"{self.info().name} cannot grade against a rubric")
