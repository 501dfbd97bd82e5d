"""What a metric is, and the one way to add one.

A metric is a small frozen dataclass: its fields are its parameters, and ``spec()`` (name,
version, non-default parameters) is logged with every result. Metrics register with
:func:`register_metric`; third-party packages expose theirs through the entry-point group
``mlflow_rag_eval.metrics`` (each entry point names a Metric class, registered on first lookup).
Names with a cut-off, like ``ndcg@10``, are parsed into the metric ``ndcg`` with ``k=10``.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import re
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points
from typing import Any, ClassVar

from mlflow_rag_eval._util.text import did_you_mean
from mlflow_rag_eval.judges.base import Judge
from mlflow_rag_eval.keys import display_name
from mlflow_rag_eval.records import ColumnMapping, RagRecord
from mlflow_rag_eval.results import RowResult, metric_key

__all__ = [
    "ENTRY_POINT_GROUP", "Metric", "batch_memo", "each_applicable", "memoized", "register_metric",
    "register_namespace", "registered_metrics",
    "resolve_metric",
]

ENTRY_POINT_GROUP = "mlflow_rag_eval.metrics"
_REGISTRY: dict[str, type[Metric]] = {}
_NAMESPACES: dict[str, Callable[[str], Metric]] = {}
_ENTRY_POINTS_LOADED = False
_NAME = re.compile(r"^(?P<base>[a-z][a-z0-9_.\-]*?)(?:@(?P<k>\d+))?$")


@dataclasses.dataclass(frozen=True)
class Metric(ABC):
    """A measurement over RAG records, made from judge primitives or from ids alone.

    Class attributes declare what the metric is; dataclass fields are its parameters.
    """

    name: ClassVar[str]
    version: ClassVar[int] = 1
    greater_is_better: ClassVar[bool] = True
    #: record fields the metric reads; a dataset without one of them cannot run the metric
    requires: ClassVar[tuple[str, ...]] = ()
    #: judge primitives the metric calls; checked before any row is judged
    primitives: ClassVar[tuple[str, ...]] = ()

    @property
    def display_name(self) -> str:
        """The user-facing name, ``ndcg@10`` for a cut-off metric."""
        k = getattr(self, "k", None)
        return f"{self.name}@{k}" if k is not None else self.name

    @property
    def key(self) -> str:
        """The MLflow metric key prefix (no ``@``)."""
        return metric_key(self.display_name)

    def spec(self) -> dict[str, Any]:
        """Name, version and the parameters that differ from the defaults."""
        params = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if getattr(self, f.name) != f.default
        }
        return {"name": self.display_name, "version": self.version, "params": params,
                "greater_is_better": self.greater_is_better}

    def not_applicable(self, record: RagRecord) -> str | None:
        """Why this record cannot be scored (e.g. no reference), or None when it can."""
        return None

    def validate(self, records: Sequence[RagRecord], mapping: ColumnMapping) -> None:
        """Raise RecordError (row and column named) for data this metric cannot use at all.

        Called for every metric before any judge call, so bad data stops the run early.
        """

    @abstractmethod
    def compute(self, records: Sequence[RagRecord], judge: Judge) -> list[RowResult]:
        """One RowResult per record, in order. Judge failures become named row errors."""


#: What the metrics of one batch may share (e.g. the retrieval metrics' relevance arrays), set
#: by the engine around each batch; absent outside it, so nothing outlives a batch.
_BATCH_MEMO: contextvars.ContextVar[dict | None] = contextvars.ContextVar("rag_eval_batch_memo", default=None)


@contextlib.contextmanager
def batch_memo():
    """A memo shared by the metrics scoring one batch of records (the engine opens one per
    batch; threads started inside must run in a copy of the context to see it)."""
    token = _BATCH_MEMO.set({"_lock": threading.Lock()})
    try:
        yield
    finally:
        _BATCH_MEMO.reset(token)


def memoized(key: Any, build: Callable[[], Any]) -> Any:
    """``build()``, once per batch for ``key`` when a batch memo is open; else every time."""
    memo = _BATCH_MEMO.get()
    if memo is None:
        return build()
    with memo["_lock"]:
        if key not in memo:
            memo[key] = build()
        return memo[key]


def each_applicable(
    metric: Metric, records: Sequence[RagRecord], score: Callable[[list[int]], dict[int, RowResult]]
) -> list[RowResult]:
    """Score the applicable rows in one batch (``score(rows) -> {row: result}``); the others
    are marked not applicable with the metric's reason."""
    results: list[RowResult | None] = [None] * len(records)
    todo = []
    for i, record in enumerate(records):
        reason = metric.not_applicable(record)
        if reason is not None:
            results[i] = RowResult.not_applicable(reason)
        else:
            todo.append(i)
    if todo:
        for i, row in score(todo).items():
            results[i] = row
    return results  # type: ignore[return-value]


def register_metric(cls: type[Metric]) -> type[Metric]:
    """Class decorator: make a metric resolvable by its ``name``."""
    existing = _REGISTRY.get(cls.name)
    if existing is not None and existing is not cls:
        raise ValueError(f"metric name {cls.name!r} is already registered by {existing.__qualname__}")
    _REGISTRY[cls.name] = cls
    return cls


def _load_entry_points() -> None:
    global _ENTRY_POINTS_LOADED
    if _ENTRY_POINTS_LOADED:
        return
    _ENTRY_POINTS_LOADED = True
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        cls = ep.load()
        if not (isinstance(cls, type) and issubclass(cls, Metric)):
            raise TypeError(f"entry point {ep.name!r} in {ENTRY_POINT_GROUP} is not a Metric class")
        register_metric(cls)


def registered_metrics() -> dict[str, type[Metric]]:
    _load_entry_points()
    return dict(_REGISTRY)


def register_namespace(prefix: str, factory: Callable[[str], Metric]) -> None:
    """Resolve names ``<prefix>:<name>`` with ``factory(name)`` (e.g. ``ragas:faithfulness``).

    Adapters to other libraries register here, so their metrics are named like ours and run
    in the same suite, with the same judge.
    """
    _NAMESPACES[prefix] = factory


def _known_names(registry: dict[str, type]) -> str:
    """The registered names as a user types them: ``ndcg@<k>`` for a metric with a cut-off."""
    with_k = {name for name, cls in registry.items()
              if dataclasses.is_dataclass(cls) and "k" in {f.name for f in dataclasses.fields(cls)}}
    return ", ".join(f"{name}@<k>" if name in with_k else name for name in sorted(registry))


def resolve_metric(spec: str | Metric) -> Metric:
    """A Metric from a name such as ``faithfulness``, ``ndcg@10`` or ``ragas:faithfulness``; the
    key a run logs (``ndcg_at_10``, as policies and the runs table spell it) names the same metric."""
    if isinstance(spec, Metric):
        return spec
    if not isinstance(spec, str):
        raise TypeError(f"a metric is a name or a Metric, got {type(spec).__name__}")
    prefix, sep, rest = spec.strip().partition(":")
    if sep:
        if prefix not in _NAMESPACES:
            raise ValueError(f"unknown metric namespace {prefix!r} in {spec!r}{did_you_mean(prefix, _NAMESPACES)}; "
                             f"known: {sorted(_NAMESPACES)}")
        return _NAMESPACES[prefix](rest)
    match = _NAME.match(display_name(spec.strip().lower()))
    registry = registered_metrics()
    if not match or match.group("base") not in registry:
        if spec.strip().lower() == "rubric":  # a kind of metric, made with its criteria and steps
            raise ValueError("a rubric is made, not named: pass rubric('politeness', criteria='...', "
                             "steps=['...']) from mlflow_rag_eval as the metric (an LLM judge grades it)")
        base, k = (match.group("base"), match.group("k")) if match else (spec.strip().lower(), None)
        hint = did_you_mean(base, registry, f"@{k}" if k else "")
        raise ValueError(f"unknown metric {spec!r}{hint}; known: {_known_names(registry)}")
    cls = registry[match.group("base")]
    if match.group("k") is None:
        return cls()
    if "k" not in {f.name for f in dataclasses.fields(cls)}:
        raise ValueError(f"metric {cls.name!r} takes no cut-off, got {spec!r}")
    return cls(k=int(match.group("k")))
