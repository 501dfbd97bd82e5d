"""What an LLM judge spent: running totals for lineage, and the shipped price table."""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from importlib import resources
from typing import Any

__all__ = ["Usage", "load_price_table", "token_count"]


def load_price_table() -> dict[str, Any]:
    """The shipped price table (USD per million tokens) with the date its prices were taken."""
    return json.loads(resources.files("mlflow_rag_eval.judges").joinpath("prices.json").read_text())


def token_count(value: Any) -> int | None:
    """A provider's token figure as a non-negative int, or None when it is unreadable.

    Usage comes from the provider's reply, and one server bug (``"prompt_tokens": "many"``)
    must cost its token count, never the row: ints, integral floats and digit strings are
    read; anything else (negative, bool, text, objects) is unknown.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, float) and value.is_integer() and value >= 0:
        return int(value)
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None


@dataclass
class Usage:
    """Running totals of what a judge spent; thread-safe.

    ``usage_unknown`` counts replies whose token counts were missing, unreadable or more than
    the call could hold (their tokens are not in the totals; a cap charges them at the estimate). ``response_formats`` counts provider calls by how the
    schema was asked for (``json_schema``, ``json_object``, ``schema`` for a backend's only
    way, ``prompt`` for prompt-and-parse), and ``schema_fallbacks`` each switch the judge made
    after a server refused a format (``"json_schema->json_object"``), so a fallback is never
    silent in the lineage.

    What the verdicts came from, counted per reply that was used (fresh or from the cache, a
    reply that did not parse left out): ``reply_formats``, by how its schema was asked for, and
    ``reported_models``, by the model its server reported. Both are part of the judge's
    fingerprint (:meth:`~.judge.LLMJudge.info`); ``models`` counts every provider reply.
    """

    provider_calls: int = 0
    cache_hits: int = 0
    retries: int = 0
    repair_retries: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    usage_unknown: int = 0
    cost_usd: float = 0.0
    latency_s: float = 0.0
    errors: Counter = field(default_factory=Counter)
    models: Counter = field(default_factory=Counter)
    system_fingerprints: Counter = field(default_factory=Counter)
    templates: Counter = field(default_factory=Counter)
    response_formats: Counter = field(default_factory=Counter)
    schema_fallbacks: Counter = field(default_factory=Counter)
    reply_formats: Counter = field(default_factory=Counter)
    reported_models: Counter = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, **deltas: Any) -> None:
        with self._lock:
            for name, value in deltas.items():
                current = getattr(self, name)
                if isinstance(current, Counter):
                    if value:
                        current[value] += 1
                else:
                    setattr(self, name, current + value)

    def count(self, **counts: Mapping[str, int]) -> None:
        """Add whole tallies to Counter fields, e.g. ``reported_models={"m": 40}``: what other
        processes' judges counted (Spark workers, whose replies the driver's judge never saw)."""
        with self._lock:
            for name, tally in counts.items():
                getattr(self, name).update({k: int(v) for k, v in (tally or {}).items()})

    def snapshot(self) -> dict[str, Any]:
        """Every total as it is now (for :meth:`restore`)."""
        with self._lock:
            return {f.name: Counter(getattr(self, f.name)) if isinstance(getattr(self, f.name), Counter)
                    else getattr(self, f.name) for f in fields(self) if not f.name.startswith("_")}

    def restore(self, snapshot: Mapping[str, Any]) -> None:
        """Put the totals back as :meth:`snapshot` took them (what a cache probe counted is undone)."""
        with self._lock:
            for name, value in snapshot.items():
                setattr(self, name, Counter(value) if isinstance(value, Counter) else value)

    def as_dict(self) -> dict[str, Any]:
        with self._lock:
            out = {
                f.name: dict(getattr(self, f.name)) if isinstance(getattr(self, f.name), Counter)
                else getattr(self, f.name)
                for f in fields(self)
                if not f.name.startswith("_")
            }
        out["cost_usd"] = round(out["cost_usd"], 6)
        out["latency_s"] = round(out["latency_s"], 3)
        return out
