"""The evaluation report: one self-contained HTML page for MLflow's artifact viewer.

The viewer shows HTML in an iframe, possibly sandboxed with script off, and a run's artifacts
may be opened offline: so the page has no script, no external resource of any kind (styles,
fonts, images and charts are inline) and a Content-Security-Policy that forbids loading any.

The page is the template ``templates/report.html.j2`` (on ``_page.html.j2``, with the inline
stylesheet ``report.css``), rendered with autoescaping: this module only gathers the figures
and the rows; all user text (questions, answers, justifications, evidence, lineage) is escaped
by the template engine, and nothing from the data is ever written as markup.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Mapping
from typing import Any

import numpy as np
from markupsafe import Markup

from mlflow_rag_eval.evaluation.result import EvaluationFigures, EvaluationResult, uncalibrated_warning
from mlflow_rag_eval.report._svg import histogram_svg, quadrant_data, quadrant_svg
from mlflow_rag_eval.report.templating import render
from mlflow_rag_eval.report.worst import worst_rows
from mlflow_rag_eval.stats import ci_missing

__all__ = ["render_figures_report", "render_report", "ROWS_SHOWN", "QUADRANT_METRICS"]

#: worst rows (and errors) shown per metric on the page; all of them are in worst_rows.json
ROWS_SHOWN = 20
#: evidence JSON longer than this is cut on the page
EVIDENCE_LIMIT = 2000
#: (x, y) metrics of the retrieval-vs-generation quadrant
QUADRANT_METRICS = ("context_recall", "faithfulness")

_USAGE_LABELS = {
    "provider_calls": "judge calls",
    "cache_hits": "cache hits",
    "tokens_in": "tokens in",
    "tokens_out": "tokens out",
    "cost_usd": "cost (USD)",
    "retries": "retries",
    "repair_retries": "repair retries",
    "latency_s": "latency (s)",
    "embedding_batches": "embedding batches",
}


def _shown_model(model: Any) -> Any:
    """A judge's model as the report shows it: the last two folders, not the absolute local path of
    its files (the page is shared; the path says where one machine keeps them). The lineage file
    keeps the path, and the files' sha256 says which they are."""
    if not (isinstance(model, str) and os.path.isabs(model)):
        return model
    return "/".join(os.path.normpath(model).split(os.sep)[-2:])  # a folder named "model" says little alone


def _shown_lineage(lineage: Mapping[str, Any]) -> dict[str, Any]:
    """The lineage with every judge's model and model settings (a panel's members' too) as
    :func:`_shown_model` shows them."""
    shown = copy.deepcopy(dict(lineage))
    judges = [shown.get("judge") or {}]
    while judges:
        judge = judges.pop()
        if "model" in judge:
            judge["model"] = _shown_model(judge["model"])
        if isinstance(judge.get("params"), dict):  # a support model or cross-encoder named by its path
            judge["params"] = {k: _shown_model(v) for k, v in judge["params"].items()}
        judges += judge.get("members") or []
    return shown


def _subtitle(lineage: dict[str, Any]) -> str:
    sub = []
    if lineage.get("created_at"):
        sub.append(f"created {str(lineage['created_at']).replace('T', ' ').replace('+00:00', ' UTC')}")
    package = (lineage.get("versions") or {}).get("mlflow-rag-eval")
    if package:
        sub.append(f"mlflow-rag-eval {package}")
    return " · ".join(sub)


def _scored(scores: Mapping[str, np.ndarray], key: str) -> np.ndarray:
    column = scores[key]
    return column[~np.isnan(column)]


def _summary(figures: EvaluationFigures, scores: Mapping[str, np.ndarray]) -> list[dict[str, Any]]:
    rows = []
    for m in figures.metrics:
        s = m.summary
        missing = None
        if s.ci_low is None:
            values = _scored(scores, m.key)
            missing = f"not computable: {ci_missing(values)}" if len(values) else "no scored row"
        rows.append({"name": m.name, "greater_is_better": m.greater_is_better, "mean": s.mean, "median": s.median,
                     "p10": s.p10, "worst10_mean": s.worst10_mean, "ci_low": s.ci_low, "ci_high": s.ci_high, "ci_missing": missing,
                     "n_scored": s.n_scored, "n_error": s.n_error, "n_skipped": s.n_skipped})
    return rows


def _distributions(figures: EvaluationFigures, scores: Mapping[str, np.ndarray]) -> list[dict[str, Any]]:
    charts = []
    for m in figures.metrics:
        values = _scored(scores, m.key)
        svg, n_clamped = histogram_svg(
            values, m.summary.mean, chart_id=f"hist-{m.key}", label=f"distribution of {m.name} scores"
        )
        # The charts are built by _svg, which escapes every text it writes: markup of our own.
        charts.append({"name": m.name, "arrow": "↑" if m.greater_is_better else "↓", "svg": Markup(svg),
                       "n_scored": len(values), "n_clamped": n_clamped})
    return charts


def _quadrant(figures: EvaluationFigures, scores: Mapping[str, np.ndarray]) -> dict[str, Any] | None:
    by_name = {m.name: m for m in figures.metrics}
    x_name, y_name = QUADRANT_METRICS
    if x_name not in by_name or y_name not in by_name:
        return None
    data = quadrant_data(scores[by_name[x_name].key], scores[by_name[y_name].key])
    notes = [f"{len(data.rows):,} rows scored on both metrics"]
    if data.n_missing:
        notes.append(f"{data.n_missing:,} rows left out (missing either score)")
    if len(data.drawn) < len(data.rows):
        notes.append(
            f"showing a seeded random sample of {len(data.drawn):,} points (of {len(data.rows):,}); "
            "the shares in the corners count every row"
        )
    notes.append("points are jittered slightly so that equal scores stay visible")
    return {"svg": Markup(quadrant_svg(data, x_label=x_name, y_label=y_name)), "notes": notes}


def _evidence_text(evidence: Any) -> str:
    if not evidence:
        return ""
    # One line per claim / passage / verdict reads better than a fully indented JSON tree.
    lines = []
    for key, value in (evidence.items() if isinstance(evidence, dict) else [("", evidence)]):
        if isinstance(value, list) and value:
            lines.append(f"{key}:")
            lines += [f"  {json.dumps(item, ensure_ascii=False)}" for item in value]
        else:
            lines.append(f"{key}: {json.dumps(value, ensure_ascii=False)}")
    text = "\n".join(lines)
    if len(text) > EVIDENCE_LIMIT:
        text = text[:EVIDENCE_LIMIT] + f"\n… [{len(text) - EVIDENCE_LIMIT} more characters in worst_rows.json]"
    return text


def _worst(figures: EvaluationFigures, worst: dict[str, Any]) -> list[dict[str, Any]]:
    blocks = []
    for m in figures.metrics:
        w = worst["metrics"].get(m.key)
        if w is None:
            continue
        rows = [{**r, "evidence_text": _evidence_text(r["evidence"])} for r in w["worst"][:ROWS_SHOWN]]
        note_long = w["note"] or ""
        if w["best"] is not None and w["note"]:
            note_long = f"{w['note']}: all {w['n_scored']:,} scored rows score {w['best']:.3f}, the best score seen"
        blocks.append({"name": m.name, "rows": rows, "n_rows": len(w["worst"]), "errors": w["errors"][:ROWS_SHOWN],
                       # every failed row (worst_rows.json lists them all, or the first ``limit``)
                       "n_errors": w["n_error"], "errors_listed": len(w["errors"]), "cutoff": w["cutoff"],
                       "side": "≤" if m.greater_is_better else "≥", "note": w["note"], "note_long": note_long})
    return blocks


def _panel(result: EvaluationFigures, worst: dict[str, Any]) -> dict[str, Any] | None:
    """Under a judge panel: its members and, per metric, the agreement and the rows where the
    members disagree most (from worst_rows.json's ``panel`` and ``disagreements``)."""
    if not result.judge.members:
        return None
    metrics = []
    for m in result.metrics:
        w = worst["metrics"].get(m.key) or {}
        if "panel" not in w:
            continue
        rows = [{**r, "decisions_text": _evidence_text({"split decisions": r["decisions"]})}
                for r in w["disagreements"][:ROWS_SHOWN]]
        metrics.append({"name": m.name, **w["panel"], "rows": rows, "n_rows_split": len(w["disagreements"])})
    return {"members": [j.name for j in result.judge.members], "metrics": metrics}


def _slices(slices) -> list[dict[str, Any]]:
    """Per sliced field, a column per value (its rows) and a row per metric: the mean, CI and
    errors on that slice (the figures :mod:`mlflow_rag_eval.evaluation.slices` computed, which are also
    logged). Metrics as rows, as in the summary above: a run has a dozen metrics and a field
    a few values, so the table stays as wide as the page."""
    if slices is None:
        return []
    out = []
    for f in slices.fields:
        rows = []
        for key, (name, _) in slices.metrics.items():
            cells = []
            for s in f.slices:
                m = s.summaries[key]
                missing = None
                if m.ci_low is None:
                    missing = "no scored row" if not m.n_scored else (
                        "not computable: fewer than 2 scored rows, or all equal")
                cells.append({"mean": m.mean, "ci_low": m.ci_low, "ci_high": m.ci_high, "ci_missing": missing,
                              "n_scored": m.n_scored, "n_error": m.n_error})
            rows.append({"name": name, "cells": cells})
        out.append({"field": f.field, "n_missing": f.n_missing, "rows": rows,
                    "columns": [{"value": s.value, "n_rows": len(s.rows)} for s in f.slices]})
    return out


def _usage(figures: EvaluationFigures, lineage: dict[str, Any]) -> list[tuple[str, str]]:
    tiles = []
    for key, value in (lineage.get("usage", figures.judge_usage) or {}).items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        shown = f"{value:,}" if isinstance(value, int) else f"{value:,.4f}".rstrip("0").rstrip(".")
        tiles.append((_USAGE_LABELS.get(key, key), shown))
    return tiles


def render_report(
    result: EvaluationResult,
    lineage: dict[str, Any],
    title: str = "RAG evaluation",
    *,
    worst: dict[str, Any] | None = None,
    slices=None,
) -> str:
    """The evaluation as one self-contained HTML page (no script, no external resource).

    Args:
        lineage: the dict written as ``rag_eval/judge_lineage.json``
            (:func:`mlflow_rag_eval.tracking.run_logging.lineage`).
        worst: the output of :func:`worst_rows`, when the caller has it already.
        slices: the run's :class:`~mlflow_rag_eval.evaluation.slices.SliceTable`, when it was sliced: the
            page then has a per-slice table (none otherwise).

    Sized for 10k rows: the quadrant draws at most 2,000 points and each metric shows at most
    20 worst rows and 20 errors, so the page stays well under 2 MB.
    """
    worst = worst if worst is not None else worst_rows(result)
    scores = {m.key: np.array([r.value if r.status == "scored" else np.nan for r in m.rows], dtype=float)
              for m in result.metrics}
    return render_figures_report(result.figures(), scores, lineage, title, worst=worst, slices=slices)


def render_figures_report(
    figures: EvaluationFigures,
    scores: Mapping[str, np.ndarray],
    lineage: dict[str, Any],
    title: str = "RAG evaluation",
    *,
    worst: dict[str, Any],
    slices=None,
) -> str:
    """The page of :func:`render_report` from what a run holds without its rows: the figures,
    every row's score per metric key (NaN where not scored, in row order) and the worst rows.

    The Spark route renders its report with it; a ``worst`` document with a ``limit`` (the worst
    rows capped per metric) is described as such on the page.
    """
    limit = worst.get("limit")
    percent = f"{100 * worst['fraction']:g}%"
    return render(
        "report.html.j2",
        title=title,
        subtitle=_subtitle(lineage),
        dataset_digest=figures.dataset_digest,
        n_rows=figures.n_rows,
        judge=figures.judge,
        judge_model=_shown_model(figures.judge.model),
        # the banner's bold "Uncalibrated judge." heads the warning, which then need not repeat it
        uncalibrated=(uncalibrated_warning(figures.judge.name, figures.calibration) or "").removeprefix(
            "uncalibrated judge: "),
        calibrated=[(k, r) for k, r in figures.calibration.items() if r],
        summary=_summary(figures, scores),
        slices=_slices(slices),
        slice_metrics=[name for name, _ in (slices.metrics.values() if slices is not None else [])],
        distributions=_distributions(figures, scores),
        quadrant=_quadrant(figures, scores),
        worst=_worst(figures, worst),
        panel=_panel(figures, worst),
        worst_percent=f"{percent} (at most {limit} per metric)" if limit else percent,
        worst_limit=limit,
        rows_shown=ROWS_SHOWN,
        usage=_usage(figures, lineage),
        lineage_json=json.dumps(_shown_lineage(lineage), indent=2, ensure_ascii=False, default=str),
    )
