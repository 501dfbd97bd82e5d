"""How much a judge panel's members agree on one metric, and where they disagree most.

A panel (:mod:`mlflow_rag_eval.judges.providers.panel`) leaves each decision's member votes on the
verdict (``votes``), and metrics keep verdicts in their rows' details; so the votes of a metric
are read back from its rows, whatever the metric and whichever route computed them. A
*decision* is any mapping in a row's details with a ``votes`` list (a claim, a passage, an
answer, a grade); a row with none was not judged by a panel.

- **agreement**: Krippendorff's alpha over the metric's decisions with its bootstrap CI over
  rows (:func:`mlflow_rag_eval.stats.alpha_ci`): nominal when the votes are verdicts, interval
  when they are scores. Logged as ``<metric>/panel_alpha``, ``/panel_alpha_ci_low``,
  ``/panel_alpha_ci_high`` (:data:`mlflow_rag_eval.keys.PANEL_STATS`).
- **disagreement of a row**: the mean over its decisions of the share of voting members that
  are *not* with the most common vote (verdicts; 0 when unanimous, 1/3 for a 2-1 split of three),
  or of the range of the members' scores (scores). Members that failed do not vote.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mlflow_rag_eval.keys import PANEL_STATS, aggregate_key
from mlflow_rag_eval.stats import alpha_ci

__all__ = ["PanelAgreement", "decisions", "disagreement", "most_disagreed", "panel_agreement"]

Decision = Mapping[str, Any]


def decisions(details: Any) -> list[Decision]:
    """Every decision (a mapping with a ``votes`` list) in a row's details, depth first."""
    found: list[Decision] = []
    stack = [details]
    while stack:
        node = stack.pop()
        if isinstance(node, Mapping):
            if isinstance(node.get("votes"), (list, tuple)):
                found.append(node)
            stack.extend(reversed([v for v in node.values() if isinstance(v, (Mapping, list, tuple))]))
        elif isinstance(node, (list, tuple)):
            stack.extend(reversed([v for v in node if isinstance(v, (Mapping, list, tuple))]))
    return found


def _level(units: Sequence[Sequence[Any]]) -> str:
    votes = [v for unit in units for v in unit if v is not None]
    return "nominal" if all(isinstance(v, bool) for v in votes) else "interval"


def disagreement(units: Sequence[Sequence[Any]], level: str) -> float:
    """One row's disagreement (see the module docstring); 0 with no decision of two votes."""
    shares = []
    for unit in units:
        votes = [v for v in unit if v is not None]
        if len(votes) < 2:
            continue
        if level == "nominal":
            shares.append(1.0 - Counter(votes).most_common(1)[0][1] / len(votes))
        else:
            shares.append(float(max(votes) - min(votes)))
    return sum(shares) / len(shares) if shares else 0.0


@dataclass(frozen=True)
class PanelAgreement:
    """One metric's inter-judge agreement."""

    #: ``nominal`` (verdicts) or ``interval`` (scores)
    level: str
    #: Krippendorff's alpha; None when undefined (every vote the same, or no decision with two)
    alpha: float | None
    ci_low: float | None
    ci_high: float | None
    #: decisions with at least two votes, and the rows they are on
    n_decisions: int
    n_rows: int
    #: per row (None: no panel decision on it), its decisions' votes
    row_units: tuple[tuple[tuple[Any, ...], ...] | None, ...]

    def as_metrics(self, key: str) -> dict[str, float]:
        """``<key>/panel_alpha``, ``/panel_alpha_ci_low``, ``/panel_alpha_ci_high``; a figure
        that is not computable is left out, never NaN."""
        values = dict(zip(PANEL_STATS, (self.alpha, self.ci_low, self.ci_high)))
        return {aggregate_key(key, stat): float(v) for stat, v in values.items() if v is not None}

    @property
    def missing(self) -> str | None:
        """Why alpha is not computable, in words (None when it is)."""
        if self.alpha is not None:
            return None
        if not self.n_decisions:
            return "no decision has two members' votes"
        return "every member voted the same on every decision: agreement beyond chance cannot be told"


def panel_agreement(rows: Sequence[Any]) -> PanelAgreement | None:
    """The agreement of the panel on a metric's rows (``RowResult``s); None when no row holds
    a panel's votes (the metric was not judged by a panel)."""
    row_units: list[tuple | None] = []
    for row in rows:
        found = decisions(row.details) if row.details else []
        row_units.append(tuple(tuple(d["votes"]) for d in found) if found else None)
    groups = [units for units in row_units if units is not None]
    if not groups:
        return None
    level = _level([u for units in groups for u in units])
    alpha, ci = alpha_ci(groups, level)
    pairable = sum(sum(v is not None for v in u) >= 2 for units in groups for u in units)
    return PanelAgreement(
        level=level, alpha=alpha, ci_low=ci[0] if ci else None, ci_high=ci[1] if ci else None,
        n_decisions=pairable, n_rows=len(groups), row_units=tuple(row_units),
    )


def most_disagreed(agreement: PanelAgreement, fraction: float = 0.1, min_rows: int = 1) -> list[tuple[int, float]]:
    """``(row, disagreement)`` of the rows where the members disagree most, most first (row
    index breaks ties): the top ``ceil(fraction * rows with votes)``, at least ``min_rows``,
    and every row tied with the last one taken; rows where the members agree are never listed."""
    scored = [(disagreement(units, agreement.level), i) for i, units in enumerate(agreement.row_units)
              if units is not None]
    split = sorted(((d, i) for d, i in scored if d > 0), key=lambda di: (-di[0], di[1]))
    k = min(len(split), max(min_rows, math.ceil(fraction * len(scored))))
    if k == 0:
        return []
    cutoff = split[k - 1][0]
    return [(i, d) for d, i in split if d >= cutoff]
