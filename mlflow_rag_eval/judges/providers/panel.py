"""A judge made of judges: ``panel:<spec>,<spec>,...``, deciding by majority, item by item.

One judge's verdicts carry that judge's biases; a panel of different judges (models, providers,
the local judge) shows where they hold and where they part. The panel is an ordinary
:class:`Judge`, so every metric, route and report works with it unchanged:

- **decisions** (``verify``, ``rate_relevance``, ``is_abstention``: one yes/no per claim,
  passage or answer): every member decides every item, and the panel takes the **majority of
  the whole panel** — more than half of *all* members, so that failing members cannot leave
  one judge deciding for five. Each aggregated :class:`Verdict` carries the members' votes
  (``votes``, in member order, None where a member failed) and its reason says the count
  (``2 of 3 members say yes; c failed``). No decision is ever silently given to one side:

  - ``PanelTie`` — the members that voted split evenly (an even panel, or a member failed);
  - ``PanelNoMajority`` — one side leads but has no majority of the panel (members failed);
  - ``PanelFailure`` — every member failed on the item (their errors are listed).

  An undecided decision fails its whole row (a row's score needs all its decisions) with one
  of these named errors, counted in ``n_error``; the votes stay in the row's details, so the
  agreement statistic and the disagreement rows still count the row.
- **scores** (``similarity``, ``grade``): the mean of the members' scores, over the members
  that scored, when they are more than half of the panel (else ``PanelNoMajority``).
- **generation** (``extract_claims``, ``generate_questions``): the first member only. Claims
  must be the same for every member, or their verdicts could not be compared claim by claim;
  ``extract_and_verify`` is the first member's (fused) call, then every other member verifies
  the claims it extracted.

Members are called one after another on each batch, each through its own bounded pool: the
panel never has more calls in flight than its busiest member allows, and a member's rate limit
holds as it is. Members named by string get the same ``get_judge`` options, so one
``cache=JudgeCache(...)`` is shared by all (a cache key includes the model, so members never
get each other's answers); LLM members open the same default cache anyway.

Names: ``panel:<spec>,<spec>,...`` — members are separated by ``,`` at the top level; a comma
inside a member's option value is percent-encoded (``%2C``), as ``?`` and ``&`` already are
(:func:`~mlflow_rag_eval.judges.registry.split_judge_name`). A member whose name needs a
literal comma (a model folder named with one) is given in the list form, which takes names and
ready :class:`Judge` objects alike: ``get_judge(["openai:/gpt-4o-mini", "local:minilm-l6"])``
or ``PanelJudge([...])``. Panels do not nest.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from mlflow_rag_eval.judges.base import (
    ClaimsItem,
    GeneratedQuestions,
    Judge,
    JudgeFailure,
    JudgeInfo,
    Outcome,
    RelevanceItem,
    Verdict,
    VerifyItem,
)
from mlflow_rag_eval.judges.registry import build_judge, register_judge_provider, scheme_of

__all__ = ["PanelFailure", "PanelJudge", "PanelScore", "parse_panel_members", "panel_judge"]

SCHEME = "panel"
#: primitives decided by every member; the others are the first member's
_EVERY_MEMBER = ("verify", "rate_relevance", "similarity", "is_abstention", "grade")
#: a claim or passage is cut to this many characters in an undecided row's details
_LABEL_CHARS = 300


class PanelFailure(JudgeFailure):
    """A panel could not decide an item; ``details`` holds the members' votes (the row's
    details, so the undecided row still counts in the agreement and the disagreement rows)."""

    def __init__(self, kind: str, message: str, details: dict[str, Any] | None = None):
        super().__init__(kind, message)
        self.details = details or {}


class PanelScore(float):
    """A panel's mean score, with the members' scores in ``votes`` (member order, None where a
    member failed). It is a float everywhere a score is used."""

    votes: tuple[float | None, ...] = ()

    def __new__(cls, value: float, votes: Sequence[float | None]):
        score = super().__new__(cls, value)
        score.votes = tuple(votes)
        return score


def parse_panel_members(spec: str) -> list[str]:
    """The member names of ``panel:<spec>,<spec>,...`` (split at every ``,``).

    Raises:
        ValueError: not a panel name, no member, an empty member, or a nested panel.
    """
    head, sep, rest = spec.partition(":")
    if head.strip() != SCHEME or not sep:
        raise ValueError(f"not a panel judge name: {spec!r} (expected 'panel:<judge>,<judge>,...')")
    members = [m.strip() for m in rest.split(",")]
    if not rest.strip() or any(not m for m in members):
        raise ValueError(f"empty member in judge name {spec!r}: members are separated by single commas "
                         "(percent-encode a comma inside an option value as %2C)")
    return members


class PanelJudge(Judge):
    """Every member judges every decision; the panel decides by majority (see the module)."""

    def __init__(self, members: Sequence[Judge]):
        members = list(members)
        if len(members) < 2:
            raise ValueError(f"a judge panel needs at least 2 members, got {len(members)}")
        if any(isinstance(m, PanelJudge) for m in members):
            raise ValueError("judge panels do not nest: list the members of the inner panel instead")
        self.members = members
        first, every = members[0], members
        caps = {p for p in _EVERY_MEMBER if all(m.supports(p) for m in every)}
        caps |= {p for p in ("extract_claims", "generate_questions") if first.supports(p)}
        if first.supports("extract_and_verify") and all(m.supports("verify") for m in every[1:]):
            caps.add("extract_and_verify")
        self.capabilities = frozenset(caps)
        #: metrics side by side only when every member waits on the network
        self.parallel_metrics = all(getattr(m, "parallel_metrics", False) for m in members)
        self._names = [m.info().name for m in members]

    # -- identity ---------------------------------------------------------------------------
    def info(self) -> JudgeInfo:
        infos = tuple(m.info() for m in self.members)
        # Order counts: the first member extracts the claims every member then judges.
        blob = json.dumps([[i.fingerprint, i.prompts_version] for i in infos])
        return JudgeInfo(
            name=f"{SCHEME}:" + ",".join(i.name for i in infos),
            kind=SCHEME,
            model=",".join(i.model for i in infos),
            fingerprint=hashlib.sha256(blob.encode()).hexdigest()[:16],
            prompts_version="+".join(dict.fromkeys(i.prompts_version for i in infos)),
            params={"members": [i.name for i in infos], "aggregation": "majority of the panel; mean of scores"},
            members=infos,
        )

    def stopped(self) -> str | None:
        return next((reason for reason in (m.stopped() for m in self.members) if reason), None)

    def restart(self) -> None:
        for member in self.members:
            member.restart()

    def usage(self) -> dict[str, Any]:
        """Numbers summed over members (counters merged), and each member's own usage."""
        each = [m.usage() for m in self.members]
        total: dict[str, Any] = {}
        for usage in each:
            for key, value in usage.items():
                if isinstance(value, bool):
                    continue
                if isinstance(value, (int, float)):
                    total[key] = total.get(key, 0) + value
                elif isinstance(value, dict):
                    merged = Counter(total.get(key, {}))
                    merged.update({k: v for k, v in value.items() if isinstance(v, (int, float))})
                    total[key] = dict(merged)
        if isinstance(total.get("cost_usd"), float):
            total["cost_usd"] = round(total["cost_usd"], 6)
        total["members"] = [{"name": n, **u} for n, u in zip(self._names, each)]
        return total

    # -- generation: the first member -------------------------------------------------------
    def extract_claims(self, texts: Sequence[str]) -> list[Outcome[list[str]]]:
        return self.members[0].extract_claims(texts)

    def generate_questions(self, answers: Sequence[str], n: int) -> list[Outcome[GeneratedQuestions]]:
        return self.members[0].generate_questions(answers, n)

    # -- decisions: every member ------------------------------------------------------------
    def verify(self, items: Sequence[VerifyItem]) -> list[Outcome[list[Verdict]]]:
        calls = [m.verify(items) for m in self.members]
        return [self._decide_list(i, [call[i] for call in calls], list(items[i].claims), "claim")
                for i in range(len(items))]

    def rate_relevance(self, items: Sequence[RelevanceItem]) -> list[Outcome[list[Verdict]]]:
        calls = [m.rate_relevance(items) for m in self.members]
        return [self._decide_list(i, [call[i] for call in calls], list(items[i].passages), "passage")
                for i in range(len(items))]

    def is_abstention(self, items: Sequence[tuple[str, str]]) -> list[Outcome[Verdict]]:
        calls = [m.is_abstention(items) for m in self.members]
        out: list[Outcome[Verdict]] = []
        for i in range(len(items)):
            decided = self._decide_list(i, [c[i] if isinstance(c[i], JudgeFailure) else [c[i]] for c in calls],
                                        None, "answer")
            out.append(decided if isinstance(decided, JudgeFailure) else decided[0])
        return out

    def extract_and_verify(self, items: Sequence[ClaimsItem]) -> list[Outcome[list[tuple[str, Verdict]]]]:
        first = self.members[0].extract_and_verify(items)
        out: list[Any] = [None] * len(items)
        todo = []
        for i, outcome in enumerate(first):
            if isinstance(outcome, JudgeFailure):
                out[i] = JudgeFailure(outcome.kind, f"panel member {self._names[0]} (which extracts the claims): "
                                                    f"{outcome.message}")
            elif not outcome:
                out[i] = []
            else:
                todo.append(i)
        others = [m.verify([VerifyItem(items[i].passages, [c for c, _ in first[i]]) for i in todo])
                  for m in self.members[1:]]
        for j, i in enumerate(todo):
            claims = [c for c, _ in first[i]]
            votes = [[v for _, v in first[i]]] + [call[j] for call in others]
            decided = self._decide_list(i, votes, claims, "claim")
            out[i] = decided if isinstance(decided, JudgeFailure) else list(zip(claims, decided))
        return out

    # -- scores: the mean -------------------------------------------------------------------
    def similarity(self, pairs: Sequence[tuple[str, str]]) -> list[Outcome[float]]:
        calls = [m.similarity(pairs) for m in self.members]
        return [self._mean([c[i] for c in calls], float) for i in range(len(pairs))]

    def grade(self, rubric: Any, fields: Sequence[dict[str, str]]) -> list[Outcome[Verdict]]:
        calls = [m.grade(rubric, fields) for m in self.members]
        out: list[Outcome[Verdict]] = []
        for i in range(len(fields)):
            outcomes = [c[i] for c in calls]
            score = self._mean(outcomes, lambda v: v.score)
            if isinstance(score, JudgeFailure):
                out.append(score)
                continue
            voted = sum(not isinstance(o, JudgeFailure) for o in outcomes)
            out.append(Verdict(score >= 0.5, f"mean of {voted} of {len(self.members)} members' grades "
                                             f"{float(score):.3f}{self._failed_note(outcomes)}",
                               score=float(score), votes=score.votes))
        return out

    # -- aggregation ------------------------------------------------------------------------
    def _failed_note(self, outcomes: Sequence[Any]) -> str:
        failed = [f"{n} failed ({o.kind})" for n, o in zip(self._names, outcomes) if isinstance(o, JudgeFailure)]
        return "; " + ", ".join(failed) if failed else ""

    def _all_failed(self, outcomes: Sequence[JudgeFailure]) -> PanelFailure:
        return PanelFailure("PanelFailure", "every member failed: " + "; ".join(
            f"{n}: {o.kind}: {o.message}" for n, o in zip(self._names, outcomes)))

    def _mean(self, outcomes: Sequence[Any], score_of: Callable[[Any], float | None]) -> Outcome[PanelScore]:
        """The mean score of the members that scored, if they are a majority of the panel."""
        if all(isinstance(o, JudgeFailure) for o in outcomes):
            return self._all_failed(outcomes)
        votes = [None if isinstance(o, JudgeFailure) else score_of(o) for o in outcomes]
        scored = [float(v) for v in votes if v is not None]
        if 2 * len(scored) <= len(self.members):
            return PanelFailure("PanelNoMajority", f"only {len(scored)} of {len(self.members)} members scored"
                                f"{self._failed_note(outcomes)}", {"votes": votes})
        return PanelScore(sum(scored) / len(scored), votes)

    def _decide_list(self, item: int, outcomes: Sequence[Any], labels: Sequence[str] | None,
                     what: str) -> Outcome[list[Verdict]]:
        """One item's decisions: per position, the majority of the panel over the members'
        verdict lists. A member whose list has the wrong length counts as failed on the item."""
        if all(isinstance(o, JudgeFailure) for o in outcomes):
            return self._all_failed(outcomes)
        n = len(labels) if labels is not None else next(len(o) for o in outcomes if not isinstance(o, JudgeFailure))
        outcomes = [o if isinstance(o, JudgeFailure) or len(o) == n
                    else JudgeFailure("PanelMismatch", f"{len(o)} verdicts for {n} {what}s") for o in outcomes]
        if all(isinstance(o, JudgeFailure) for o in outcomes):
            return self._all_failed(outcomes)
        note = self._failed_note(outcomes)
        decided: list[Verdict] = []
        undecided: list[tuple[str, str]] = []
        decisions: list[dict[str, Any]] = []
        for d in range(n):
            verdicts = [None if isinstance(o, JudgeFailure) else o[d] for o in outcomes]
            verdict, kind = self._majority(verdicts, note)
            label = labels[d] if labels is not None else None
            decisions.append({**({what: label[:_LABEL_CHARS]} if label is not None else {}), "votes": [
                None if v is None else bool(v.value) for v in verdicts], "decided": kind is None})
            if kind is None:
                decided.append(verdict)
            else:
                undecided.append((kind, f"{what} {d + 1}: {self._tally(verdicts)}"))
        if undecided:
            kind = "PanelTie" if any(k == "PanelTie" for k, _ in undecided) else "PanelNoMajority"
            return PanelFailure(kind, f"{len(undecided)} of {n} {what}(s) undecided by the panel of "
                                f"{len(self.members)}: " + "; ".join(m for _, m in undecided) + note,
                                {"panel_votes": decisions})
        return decided

    def _tally(self, verdicts: Sequence[Verdict | None]) -> str:
        parts = [f"{name} {'failed' if v is None else ('yes' if v.value else 'no')}"
                 for name, v in zip(self._names, verdicts)]
        return ", ".join(parts)

    def _majority(self, verdicts: Sequence[Verdict | None], note: str) -> tuple[Verdict | None, str | None]:
        """The panel's verdict, or (None, the failure kind) when it has no majority."""
        yes = [v for v in verdicts if v is not None and v.value]
        no = [v for v in verdicts if v is not None and not v.value]
        if len(yes) == len(no):
            return None, "PanelTie"
        winners = yes if len(yes) > len(no) else no
        if 2 * len(winners) <= len(self.members):
            return None, "PanelNoMajority"
        voters = [v for v in verdicts if v is not None]
        scores = [v.score for v in voters]
        lead = winners[0]
        word = "yes" if lead.value else "no"
        return Verdict(
            bool(lead.value),
            f"{len(winners)} of {len(self.members)} members say {word}{note}" + (f"; {lead.reason}" if lead.reason else ""),
            evidence=lead.evidence,
            score=sum(scores) / len(scores) if all(s is not None for s in scores) else None,
            source_index=lead.source_index,
            votes=tuple(None if v is None else bool(v.value) for v in verdicts),
        ), None


def panel_judge(members: Sequence[str | Judge], **options: Any) -> PanelJudge:
    """A panel of ``members`` (names, built with ``options`` each, or ready judges)."""
    built = []
    for member in members:
        if isinstance(member, str):
            name = member.strip()
            if scheme_of(name) == SCHEME:
                raise ValueError("judge panels do not nest: list the members of the inner panel instead")
            built.append(build_judge(name, **options))
        else:
            if options:
                raise ValueError(f"options {sorted(options)} apply to member names, not to ready judges")
            if not isinstance(member, Judge):
                raise TypeError(f"a judge is a name or a Judge, got {type(member).__name__}")
            built.append(member)
    return PanelJudge(built)


def _build(members: list[str], *, name: str, **options: Any) -> PanelJudge:
    return panel_judge(members, **options)


register_judge_provider(SCHEME, build=_build)(parse_panel_members)
