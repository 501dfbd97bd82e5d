"""The worst rows of each metric: where a person should start reading.

Selection is on scored rows only. A failed row (the judge could not decide) is not a low score,
so errors are listed apart and never compete with real scores for a place in the decile. A row
at the metric's best score (the best any row got) is never "worst": when every row ties there,
the metric says so in one line (``no row below 1.000``) instead of listing every row.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from mlflow_rag_eval.evaluation.result import EvaluationResult
from mlflow_rag_eval.results import MetricFigures, MetricResult, RowResult
from mlflow_rag_eval.stats.agreement import decisions, most_disagreed

__all__ = ["worst_rows", "json_safe", "metric_entry", "row_entry", "truncate", "WORST_ROWS_SCHEMA_VERSION"]

#: 2: rows at the best score are left out; ``best`` and ``note`` added. Under a judge panel a
#: metric also has ``panel`` and ``disagreements``: keys added, none changed, so still 2
WORST_ROWS_SCHEMA_VERSION = 2

#: user text (questions, answers) is cut to this many characters in the artifact and the page
TEXT_LIMIT = 500


def truncate(text: str | None, limit: int = TEXT_LIMIT) -> str | None:
    """``text`` cut to ``limit`` characters, saying how much was cut (so nobody mistakes it)."""
    if text is None or len(text) <= limit:
        return text
    return f"{text[:limit]}… [{len(text) - limit} more characters]"


def json_safe(value: Any) -> Any:
    """``value`` as plain JSON types, so ``json.dumps(..., allow_nan=False)`` cannot fail.

    Details are written by metrics and may hold tuples, numpy scalars, dataclasses or a stray
    NaN; non-finite floats become ``None`` (JSON has no NaN) and unknown objects their ``str``.
    """
    if value is None or isinstance(value, (bool, str, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
        return [json_safe(v) for v in items]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: json_safe(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if hasattr(value, "item") and callable(value.item):  # numpy scalar
        try:
            return json_safe(value.item())
        except (TypeError, ValueError):
            pass
    if hasattr(value, "tolist") and callable(value.tolist):  # numpy array
        return json_safe(value.tolist())
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def _worst_indices(metric: MetricResult, fraction: float,
                   min_rows: int) -> tuple[list[int], float | None, float | None]:
    """Row indices of the worst ``fraction`` of scored rows below the best score (all rows tied
    at the cut-off), the cut-off, and the best score (None when no row is scored)."""
    scored = [(row.value, i) for i, row in enumerate(metric.rows) if row.status == "scored"]
    if not scored:
        return [], None, None
    sign = 1.0 if metric.greater_is_better else -1.0
    best = max(sign * v for v, _ in scored) * sign
    below = [(v, i) for v, i in scored if sign * v < sign * best]
    # Worst first; the row index breaks ties so the order is stable across runs.
    # Ties in value are ordered by the row's support confidence where the judge gives one.
    rows = metric.rows
    below.sort(key=lambda vi: (sign * vi[0], sign * _support(rows[vi[1]]), vi[1]))
    k = min(len(below), max(min_rows, math.ceil(fraction * len(scored))))
    if k == 0:
        return [], None, best
    cutoff = below[k - 1][0]
    chosen = [i for v, i in below if sign * v <= sign * cutoff]
    return chosen, cutoff, best


def _support(row) -> float:
    support = row.details.get("support")
    return float(support) if support is not None else float(row.value)


def _note(greater_is_better: bool, chosen: list[int], best: float | None) -> str | None:
    if best is None:
        return "no scored row"
    if chosen:
        return None
    return f"no row {'below' if greater_is_better else 'above'} {best:.3f}"


def _question_answer(result: EvaluationResult, i: int) -> tuple[str | None, str | None]:
    if i >= len(result.records):
        return None, None
    record = result.records[i]
    return record.question, record.answer


def row_entry(i: int, question: str | None, answer: str | None, row: RowResult, *, error: bool) -> dict[str, Any]:
    """One listed row of :func:`worst_rows` (``question`` and ``answer`` uncut): the one place
    its fields are written, for the rows held in memory and for those a Spark route selected."""
    entry: dict[str, Any] = {"row": i, "question": truncate(question), "answer": truncate(answer)}
    if error:
        entry["error"] = row.error
    else:
        entry["value"], entry["justification"] = json_safe(row.value), row.justification
    entry["evidence"] = json_safe(row.details)
    return entry


def _disagreement_entry(result: EvaluationResult, metric, i: int, share: float) -> dict[str, Any]:
    row = metric.rows[i]
    question, answer = _question_answer(result, i)
    entry: dict[str, Any] = {"row": i, "question": question, "answer": answer, "disagreement": share}
    if row.error is not None:
        entry["error"] = row.error
    else:
        entry["value"], entry["justification"] = json_safe(row.value), row.justification
    # only the decisions the members split on, with what they were about (claim, passage...)
    entry["decisions"] = [json_safe(d) for d in decisions(row.details)
                          if len({v for v in d["votes"] if v is not None}) > 1]
    return entry


def _panel(result: EvaluationResult, metric, fraction: float, min_rows: int) -> dict[str, Any]:
    """A metric's ``panel`` and ``disagreements`` entries under a judge panel (else nothing)."""
    agreement = metric.agreement
    if agreement is None:
        return {}
    return {
        "panel": {"members": [m.name for m in result.judge.members], "level": agreement.level,
                  "krippendorff_alpha": agreement.alpha, "ci_low": agreement.ci_low, "ci_high": agreement.ci_high,
                  "n_decisions": agreement.n_decisions, "n_rows": agreement.n_rows, "missing": agreement.missing},
        "disagreements": [_disagreement_entry(result, metric, i, share)
                          for i, share in most_disagreed(agreement, fraction, min_rows)],
    }


def metric_entry(metric: MetricResult | MetricFigures, *, best: float | None, cutoff: float | None,
                 worst: list[dict[str, Any]], errors: list[dict[str, Any]],
                 panel: dict[str, Any] | None = None) -> dict[str, Any]:
    """One metric's entry of :func:`worst_rows`, from the rows chosen (:func:`row_entry` each);
    ``panel``: its ``panel`` and ``disagreements`` entries under a judge panel."""
    summary = metric.summary
    return {
        "name": metric.name,
        "greater_is_better": metric.greater_is_better,
        "n_scored": summary.n_scored,
        "n_error": summary.n_error,
        "n_skipped": summary.n_skipped,
        "best": json_safe(best),
        "cutoff": json_safe(cutoff),
        "note": _note(metric.greater_is_better, [e["row"] for e in worst], best),
        "worst": worst,
        "errors": errors,
        **(panel or {}),
    }


def _row_entry(result: EvaluationResult, metric, i: int, *, error: bool) -> dict[str, Any]:
    question, answer = _question_answer(result, i)
    return row_entry(i, question, answer, metric.rows[i], error=error)


def _metric_worst(result: EvaluationResult, metric, fraction: float, min_rows: int) -> dict[str, Any]:
    """One metric's entry of :func:`worst_rows`."""
    chosen, cutoff, best = _worst_indices(metric, fraction, min_rows)
    return metric_entry(
        metric, best=best, cutoff=cutoff,
        worst=[_row_entry(result, metric, i, error=False) for i in chosen],
        errors=[_row_entry(result, metric, i, error=True) for i, row in enumerate(metric.rows) if row.status == "error"],
        panel=_panel(result, metric, fraction, min_rows),
    )


def worst_rows(result: EvaluationResult, fraction: float = 0.1, min_rows: int = 1) -> dict[str, Any]:
    """Per metric, the worst ``fraction`` of scored rows and, apart, the rows that errored.

    "Worst" is the bottom of the scores for a metric where greater is better, the top for one
    where lower is better. Only rows below the best score any row got can be worst (above it,
    where lower is better): when all rows tie, none is. The number taken is
    ``ceil(fraction * n_scored)``, at least ``min_rows``, at most the rows below the best;
    every row tied with the last one taken is included too, so the cut never depends on row
    order. Rows are listed worst first (row index breaks ties).

    Returns a JSON-serialisable dict (written as ``rag_eval/worst_rows.json``)::

        {"schema_version": 2, "fraction": 0.1, "min_rows": 1, "n_rows": ...,
         "metrics": {<metric key>: {"name", "greater_is_better", "n_scored", "n_error",
                                    "n_skipped", "best", "cutoff", "note", "worst": [...],
                                    "errors": [...]}}}

    ``best`` is the best score a row got (None when none is scored); ``cutoff`` the score of
    the last worst row (None when there is none); ``note`` says in words why ``worst`` is
    empty — ``"no row below 1.000"`` (``"no row above ..."`` where lower is better) when every
    scored row has the best score, ``"no scored row"`` — and is None otherwise.

    Each worst row: ``row`` (0-based index in the evaluated data), ``question``, ``answer``
    (both cut to 500 characters), ``value``, ``justification``, ``evidence`` (the row's details:
    claims, verdicts, passages as the metric wrote them). Each error: ``row``, ``question``,
    ``answer``, ``error``, ``evidence``.

    Under a judge panel (:mod:`mlflow_rag_eval.judges.providers.panel`) each judge-graded metric also
    has ``panel`` (``members``, ``level``, ``krippendorff_alpha``, ``ci_low``, ``ci_high``,
    ``n_decisions``, ``n_rows``, ``missing``: why alpha is None) and ``disagreements``: the
    rows where the members disagree most (:func:`mlflow_rag_eval.stats.agreement.most_disagreed`,
    with the same ``fraction`` and ``min_rows``), each with ``row``, ``question``, ``answer``,
    ``disagreement``, ``value`` and ``justification`` (or ``error``: a row the panel could not
    decide) and ``decisions``: the split decisions, their ``votes`` in member order.
    """
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be in (0, 1], got {fraction!r}")
    if min_rows < 0:
        raise ValueError(f"min_rows must be >= 0, got {min_rows!r}")
    metrics = {metric.key: _metric_worst(result, metric, fraction, min_rows) for metric in result.metrics}
    return {
        "schema_version": WORST_ROWS_SCHEMA_VERSION,
        "fraction": fraction,
        "min_rows": min_rows,
        "n_rows": len(result.records),
        "metrics": metrics,
    }
