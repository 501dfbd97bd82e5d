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

A *slice key* names one statistic of one metric on the rows of one slice
(:mod:`mlflow_rag_eval.evaluation.slices`): ``<key>/slice/<field>/<value>/<stat>``
(``faithfulness/slice/difficulty/hard/mean``). The metric's own keys stay a prefix of it, so the
MLflow UI files a metric's slices beside it, and the statistic stays after the last ``/``, as in
every aggregate key. Field names and values are user data, made *segments* by
:func:`slice_segments`:

- every character but ``A-Z a-z 0-9 _ . -`` becomes ``_``. MLflow also accepts spaces, ``:``
  and (on most stores) any Unicode letter, but ``:`` is refused on Windows, ``/`` would add a
  level, ``=`` is refused everywhere, and a file store keeps each key as a file path: ASCII
  keeps a key the same on every store and platform;
- an empty segment becomes ``_``, and a segment of dots only has them replaced (``.`` and
  ``..`` would name another directory; MLflow refuses them);
- a segment longer than :data:`SEGMENT_LIMIT` is cut and ends with ``-`` and 8 hex digits of
  the sha256 of the full text, so values that differ only past the cut stay apart;
- two names of one set (the fields, or the values of one field) that would get the same
  segment, case aside, never share a key: each of them gets ``-`` and 8 hex digits of the
  sha256 of its own text (``a b`` -> ``a_b-<hash>`` when ``a_b`` is a value too). Case counts
  as a collision because a file store on macOS or Windows would keep ``Hard/mean`` and
  ``hard/mean`` in one file. The suffix therefore depends on the other values of the run:
  ``rag_eval/slices.json`` maps each value to its segment, and compare and the gate read that
  file, never the keys.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

__all__ = [
    "AGGREGATES", "COUNTS", "MAX_KEY_LENGTH", "PANEL_STATS", "PPI_STATS", "RUN_METRICS", "RUN_STATS", "SEGMENT_LIMIT",
    "SLICE", "aggregate_key", "check_run_metrics", "display_name", "is_namespaced", "is_slice_key", "metric_key",
    "metrics_in_columns", "score_column", "slice_prefix", "slice_segments", "split_aggregate_key",
]

#: the per-run statistics of a metric that are logged as ``<key>/<stat>`` and that a gate
#: policy's floors and ceilings may name (:class:`mlflow_rag_eval.results.MetricSummary`):
#: ``p10`` is the 10th percentile, ``worst10_mean`` the mean of the worst 10% of the scored rows
#: (at least one, by the metric's direction), the one that guards the worst rows
AGGREGATES = ("mean", "median", "p10", "worst10_mean", "ci_low", "ci_high")
#: the row counts of a metric (``<key>/n_scored``, ``<key>/n_error``)
COUNTS = ("n_scored", "n_error")
#: the statistics of a metric a run logs as MLflow metrics by default: what a person compares
#: across runs in the runs table (a metric's keys sort together: ``<key>/ci_high``, ``/ci_low``,
#: ``/mean``). The counts, quantiles, worst decile and per-slice figures are in the run's
#: statistics table (``rag_eval/statistics.json``) and report, and the gate recomputes them
#: from the rows table
RUN_STATS = ("mean", "ci_low", "ci_high")
#: what a run logs as MLflow metrics (the ``run_metrics`` option of every route):
#: ``"means"`` each metric's :data:`RUN_STATS`; ``"all"`` every statistic (the counts,
#: :data:`AGGREGATES`, a panel's agreement) of the run and of each slice, as runs logged them
#: before the statistics table, for those who chart them
RUN_METRICS = ("means", "all")
#: the PPI estimate of a metric's mean (:mod:`mlflow_rag_eval.stats.ppi`), logged as ``<key>/<stat>``
#: once humans labelled some of a run's rows; floors may name these too
PPI_STATS = ("ppi_mean", "ppi_ci_low", "ppi_ci_high")
#: a judge panel's inter-judge agreement on a metric (:mod:`mlflow_rag_eval.stats.agreement`):
#: Krippendorff's alpha and its bootstrap CI, logged as ``<key>/<stat>`` when a panel judged it.
#: They describe the judge, not the pipeline: gate floors do not name them
PANEL_STATS = ("panel_alpha", "panel_alpha_ci_low", "panel_alpha_ci_high")
_CUTOFF_KEY = re.compile(r"_at_(\d+)$")
_SCORE = "/score"
#: the level of a slice key after the metric key: ``<key>/slice/<field>/<value>/<stat>``
SLICE = "slice"
#: the longest field or value segment of a slice key
SEGMENT_LIMIT = 64
#: the longest metric key MLflow stores (``mlflow.utils.validation.MAX_ENTITY_KEY_LENGTH``)
MAX_KEY_LENGTH = 250
#: the longest statistic a slice key ends with (``worst10_mean``)
_LONGEST_STAT = max(len(s) for s in (*AGGREGATES, "n_scored", "n_error"))
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def check_run_metrics(value: str, where: str = "run_metrics") -> str:
    """``value`` if it is one of :data:`RUN_METRICS`.

    Raises:
        ValueError: naming ``where`` (the setting) and the values it takes.
    """
    if value not in RUN_METRICS:
        raise ValueError(f"{where} must be one of {', '.join(map(repr, RUN_METRICS))}, got {value!r}")
    return value


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


def _tagged(segment: str, text: str, limit: int = SEGMENT_LIMIT) -> str:
    """``segment`` ending in ``-`` and 8 hex digits of the sha256 of ``text``, within ``limit``."""
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:8]
    return f"{segment[: limit - 9]}-{digest}"


def _segment(text: str) -> str:
    segment = _UNSAFE.sub("_", text) or "_"
    if not segment.strip("."):  # "." and ".." would name another directory
        segment = "_" * len(segment)
    return _tagged(segment, text) if len(segment) > SEGMENT_LIMIT else segment


def slice_segments(names: Iterable[str]) -> dict[str, str]:
    """The key segment of each name of one set (the slice fields, or the values of one field):
    see the module docstring. Names are taken as given; the same name twice is one name.

    Raises:
        ValueError: two names still share a segment after their hashes were added (never seen:
            it takes a value spelled as another one's segment and hash).
    """
    names = list(dict.fromkeys(names))
    segments = {name: _segment(name) for name in names}
    groups: dict[str, list[str]] = {}
    for name, segment in segments.items():
        groups.setdefault(segment.lower(), []).append(name)
    for group in groups.values():
        if len(group) > 1:
            segments.update({name: _tagged(segments[name], name) for name in group})
    seen: dict[str, str] = {}
    for name, segment in segments.items():
        other = seen.setdefault(segment.lower(), name)
        if other != name:
            raise ValueError(f"slice values {other!r} and {name!r} would share the key segment {segment!r}; "
                             "rename one of them")
    return segments


def slice_prefix(metric: str, field_segment: str, value_segment: str) -> str:
    """``<key>/slice/<field>/<value>``, the prefix of a slice's ``/<stat>`` keys; the segments
    come from :func:`slice_segments`.

    Raises:
        ValueError: a key under it would be longer than MLflow stores (a metric key of over 100
            characters; segments are at most :data:`SEGMENT_LIMIT`).
    """
    prefix = f"{metric_key(metric)}/{SLICE}/{field_segment}/{value_segment}"
    if len(prefix) + 1 + _LONGEST_STAT > MAX_KEY_LENGTH:
        raise ValueError(f"the slice key {prefix}/<stat> would be longer than the {MAX_KEY_LENGTH} "
                         "characters MLflow stores")
    return prefix


def is_slice_key(key: str) -> bool:
    """Whether an MLflow metric key is a slice's (``<key>/slice/<field>/<value>/<stat>``)."""
    return f"/{SLICE}/" in key
