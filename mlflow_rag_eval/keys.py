"""Metric names, MLflow keys and display names: the one place that turns one into the other.

Three spellings of a metric, and where each is used:

- the **metric name**, as users type it and as the metric's spec logs it: ``ndcg@10``,
  ``faithfulness``, ``ragas:faithfulness``;
- the **MLflow key**, the prefix of its logged metrics (``ndcg_at_10/mean``), of its columns in
  ``eval_results_table.json`` (``ndcg_at_10/score``) and the name of its row ``Feedback``:
  ``@`` becomes ``_at_`` (MLflow rejects ``@`` in keys) and ``:`` becomes ``_`` (refused on
  some platforms);
- the **display name** of a key: the metric name it was made from, for tables and for looking
  a metric up in the registry (``ndcg_at_10`` -> ``ndcg@10``). Only the cut-off round-trips:
  ``ragas_faithfulness`` stays as it is, since ``_`` also appears in plain names.

An *aggregate key* names one statistic of one metric: ``<key>/<stat>`` (``faithfulness/p10``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = [
    "AGGREGATES", "aggregate_key", "display_name", "is_namespaced", "metric_key", "metrics_in_columns",
    "score_column", "split_aggregate_key",
]

#: the per-run statistics of a metric that are logged as ``<key>/<stat>`` and that a gate
#: policy's floors and ceilings may name
AGGREGATES = ("mean", "median", "p10", "ci_low", "ci_high")
_CUTOFF_KEY = re.compile(r"_at_(\d+)$")
_SCORE = "/score"


def metric_key(name: str) -> str:
    """The MLflow key of a metric name: ``ndcg@10`` -> ``ndcg_at_10``, ``ragas:faithfulness``
    -> ``ragas_faithfulness``. A key is returned unchanged (the mapping is idempotent)."""
    return name.replace("@", "_at_").replace(":", "_")


def display_name(key: str) -> str:
    """The metric name a key was made from, where it can be told: ``ndcg_at_10`` -> ``ndcg@10``.

    A metric name is returned unchanged, so this also accepts what users type.
    """
    return _CUTOFF_KEY.sub(r"@\1", key)


def is_namespaced(name: str) -> bool:
    """Whether a metric name belongs to an adapter (``ragas:...``, ``deepeval:...``)."""
    return ":" in name


def aggregate_key(metric: str, stat: str) -> str:
    """``<key>/<stat>`` for a metric name or key: (``ndcg@10``, ``mean``) -> ``ndcg_at_10/mean``."""
    return f"{metric_key(metric)}/{stat}"


def split_aggregate_key(key: str) -> tuple[str, str]:
    """(metric, stat) of ``<metric>/<stat>``; the metric part is returned as written.

    Raises:
        ValueError: ``key`` has no ``/`` or nothing before it.
    """
    metric, sep, stat = key.rpartition("/")
    if not sep or not metric:
        raise ValueError(f"{key!r} is not <metric>/<stat>")
    return metric, stat


def score_column(metric: str) -> str:
    """The per-row score column of a metric in ``eval_results_table.json``: ``<key>/score``."""
    return metric_key(metric) + _SCORE


def metrics_in_columns(columns: Iterable[str]) -> list[str]:
    """Metric keys that have a score column among ``columns``, in column order."""
    return [c[: -len(_SCORE)] for c in columns if c.endswith(_SCORE)]
