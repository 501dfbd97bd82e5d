"""The evaluation report: one self-contained HTML page for MLflow's artifact viewer.

The viewer shows HTML in an iframe, possibly sandboxed with script off, and a run's artifacts
may be opened offline: so the page has no script, no external resource of any kind (styles,
fonts, images and charts are inline) and a Content-Security-Policy that forbids loading any.
All user text (questions, answers, justifications, evidence, lineage) goes through
:func:`html.escape`; nothing from the data is ever written as markup.
"""

from __future__ import annotations

import json
from html import escape
from typing import Any

from mlflow_rag_eval.engine import EvaluationResult
from mlflow_rag_eval.report._style import CSP as _CSP, CSS as _CSS
from mlflow_rag_eval.report._svg import histogram_svg, quadrant_data, quadrant_svg
from mlflow_rag_eval.report._worst import worst_rows

__all__ = ["render_report", "ROWS_SHOWN", "QUADRANT_METRICS"]

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


def _e(value: Any) -> str:
    return escape("" if value is None else str(value), quote=True)


def _f(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _header(result: EvaluationResult, lineage: dict[str, Any], title: str) -> str:
    judge = result.judge
    items = [
        ("dataset digest", f'<span class="mono">{_e(result.dataset_digest)}</span>'),
        ("rows", f"{len(result.records):,}"),
        ("judge", f"{_e(judge.name)} <span class='dir'>({_e(judge.kind)}{', ' + _e(judge.model) if judge.model else ''})</span>"),
        ("judge fingerprint", f'<span class="mono">{_e(judge.fingerprint)}</span>'),
        ("prompts version", _e(judge.prompts_version)),
    ]
    cells = "".join(f"<div><dt>{k}</dt><dd>{v}</dd></div>" for k, v in items)
    sub = []
    if lineage.get("created_at"):
        sub.append(f"created {str(lineage['created_at']).replace('T', ' ').replace('+00:00', ' UTC')}")
    package = (lineage.get("versions") or {}).get("mlflow-rag-eval")
    if package:
        sub.append(f"mlflow-rag-eval {package}")
    subtitle = f"<p class='note sub'>{_e(' · '.join(sub))}</p>" if sub else ""
    return f"<h1>{_e(title)}</h1>{subtitle}<dl class='meta'>{cells}</dl>"


def _summary(result: EvaluationResult) -> str:
    head = (
        "<tr><th>metric</th><th class='num'>mean</th><th class='num'>median</th><th class='num'>p10</th>"
        "<th class='num'>95% CI of the mean</th><th class='num'>scored</th><th class='num'>errors</th>"
        "<th class='num'>skipped</th></tr>"
    )
    rows = []
    for m in result.metrics:
        s = m.summary
        ci = "—" if s.ci_low is None else f"{s.ci_low:.3f} – {s.ci_high:.3f}"
        direction = "higher is better" if m.greater_is_better else "lower is better"
        rows.append(
            f"<tr><td>{_e(m.name)} <span class='dir'>{'↑' if m.greater_is_better else '↓'} {direction}</span></td>"
            f"<td class='num'>{_f(s.mean)}</td><td class='num'>{_f(s.median)}</td><td class='num'>{_f(s.p10)}</td>"
            f"<td class='num'>{ci}</td><td class='num'>{s.n_scored:,}</td>"
            f"<td class='num{' bad' if s.n_error else ''}'>{s.n_error:,}</td><td class='num'>{s.n_skipped:,}</td></tr>"
        )
    return (
        "<h2>Summary</h2><table>" + head + "".join(rows) + "</table>"
        "<p class='note'>Statistics are over scored rows only: rows the judge could not decide are "
        "counted as errors, rows a metric does not apply to as skipped; neither enters a mean. "
        "The 95% CI is a seeded bootstrap of the mean.</p>"
    )


def _distributions(result: EvaluationResult) -> str:
    figures = []
    for m in result.metrics:
        values = [r.value for r in m.rows if r.status == "scored"]
        svg, n_clamped = histogram_svg(
            values, m.summary.mean, chart_id=f"hist-{m.key}", label=f"distribution of {m.name} scores"
        )
        notes = [f"{len(values):,} scored rows, 10 bins over [0, 1]"]
        if n_clamped:
            notes.append(f"<b>{n_clamped:,} value(s) outside [0, 1] clamped into the edge bins</b>")
        arrow = "↑" if m.greater_is_better else "↓"
        figures.append(
            f"<figure><figcaption>{_e(m.name)} <span class='dir'>{arrow}</span></figcaption>{svg}"
            f"<p class='note'>{'; '.join(notes)}</p></figure>"
        )
    return "<h2>Score distributions</h2><div class='charts'>" + "".join(figures) + "</div>"


def _quadrant(result: EvaluationResult) -> str:
    by_name = {m.name: m for m in result.metrics}
    x_name, y_name = QUADRANT_METRICS
    if x_name not in by_name or y_name not in by_name:
        return ""
    xs = [r.value if r.status == "scored" else None for r in by_name[x_name].rows]
    ys = [r.value if r.status == "scored" else None for r in by_name[y_name].rows]
    data = quadrant_data(xs, ys)
    notes = [f"{len(data.rows):,} rows scored on both metrics"]
    if data.n_missing:
        notes.append(f"{data.n_missing:,} rows left out (missing either score)")
    if len(data.drawn) < len(data.rows):
        notes.append(
            f"showing a seeded random sample of {len(data.drawn):,} points (of {len(data.rows):,}); "
            "the shares in the corners count every row"
        )
    notes.append("points are jittered slightly so that equal scores stay visible")
    legend = (
        "<div class='legend'><p>Each point is one row. The dashed lines split both scores at 0.5 "
        "(a score of exactly 0.5 counts as high):</p><ul>"
        f"<li><b>retriever misses</b> (top left): the answer keeps to the contexts, but the contexts "
        f"lack what the reference needs — fix retrieval.</li>"
        f"<li><b>generator invents</b> (bottom right): the contexts hold what is needed, but the answer "
        f"asserts things they do not support — fix generation.</li>"
        f"<li><b>both fail</b> (bottom left): poor contexts and an ungrounded answer.</li>"
        f"<li><b>healthy</b> (top right): good contexts, grounded answer.</li></ul>"
        f"<p class='note'>{'; '.join(notes)}.</p></div>"
    )
    svg = quadrant_svg(data, x_label=x_name, y_label=y_name)
    return (
        "<h2>Retrieval vs generation</h2>"
        f"<div class='quad'><figure>{svg}</figure>{legend}</div>"
    )


def _evidence(evidence: Any) -> str:
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
    return f"<details><summary>evidence</summary><pre class='evidence'>{_e(text)}</pre></details>"


def _qa(item: dict[str, Any]) -> str:
    return (
        f"<div class='qa'><div class='q'>{_e(item.get('question'))}</div>"
        f"<div class='a'>{_e(item.get('answer'))}</div></div>"
    )


def _worst_section(result: EvaluationResult, worst: dict[str, Any]) -> str:
    blocks = []
    for m in result.metrics:
        w = worst["metrics"].get(m.key)
        if w is None:
            continue
        rows, errors = w["worst"], w["errors"]
        side = "≤" if m.greater_is_better else "≥"
        head = f"{_e(m.name)} — {len(rows):,} worst row(s)"
        if w["cutoff"] is not None:
            head += f" ({side} {w['cutoff']:.3f})"
        if errors:
            head += f" · <span class='err'>{len(errors):,} error(s)</span>"
        body = []
        if rows:
            trs = "".join(
                f"<tr><td class='num'>{r['row']}</td><td class='num'>{_f(r['value'])}</td>"
                f"<td>{_qa(r)}</td><td><div class='just'>{_e(r['justification'])}</div>{_evidence(r['evidence'])}</td></tr>"
                for r in rows[:ROWS_SHOWN]
            )
            body.append(
                "<table class='rows'><tr><th class='num idx'>row</th><th class='num score'>score</th><th class='qa'>question / answer</th>"
                f"<th>justification</th></tr>{trs}</table>"
            )
            if len(rows) > ROWS_SHOWN:
                body.append(f"<p class='note'>showing {ROWS_SHOWN} of {len(rows):,} (ties at the cut-off included); all are in rag_eval/worst_rows.json</p>")
        else:
            body.append("<p class='note'>no scored rows</p>")
        if errors:
            trs = "".join(
                f"<tr><td class='num'>{r['row']}</td><td>{_qa(r)}</td>"
                f"<td class='err just'>{_e(r['error'])}</td></tr>"
                for r in errors[:ROWS_SHOWN]
            )
            body.append(
                "<p><b>Errors</b> — the judge could not score these rows; they are not in any statistic.</p>"
                f"<table class='rows'><tr><th class='num idx'>row</th><th class='qa'>question / answer</th><th>error</th></tr>{trs}</table>"
            )
            if len(errors) > ROWS_SHOWN:
                body.append(f"<p class='note'>showing {ROWS_SHOWN} of {len(errors):,} errors; all are in rag_eval/worst_rows.json</p>")
        blocks.append(f"<details><summary>{head}</summary><div class='body'>{''.join(body)}</div></details>")
    pct = f"{100 * worst['fraction']:g}%"
    return (
        f"<h2>Worst rows</h2><p class='note'>Per metric, the worst {pct} of scored rows (the lowest, or the "
        "highest where lower is better), worst first, with the judge's justification; rows tied at the "
        "cut-off are all included. Click a metric to open it.</p>" + "".join(blocks)
    )


def _lineage(result: EvaluationResult, lineage: dict[str, Any]) -> str:
    usage = lineage.get("usage", result.judge_usage) or {}
    tiles = []
    for key, value in usage.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        shown = f"{value:,}" if isinstance(value, int) else f"{value:,.4f}".rstrip("0").rstrip(".")
        tiles.append(f"<div><b>{_e(shown)}</b><span>{_e(_USAGE_LABELS.get(key, key))}</span></div>")
    usage_html = f"<div class='usage'>{''.join(tiles)}</div>" if tiles else "<p class='note'>no judge usage recorded</p>"
    text = json.dumps(lineage, indent=2, ensure_ascii=False, default=str)
    return (
        "<h2>Judge lineage</h2>" + usage_html
        + "<p class='note'>As logged in rag_eval/judge_lineage.json.</p>"
        + f"<pre>{_e(text)}</pre>"
    )


def render_report(
    result: EvaluationResult,
    lineage: dict[str, Any],
    title: str = "RAG evaluation",
    *,
    worst: dict[str, Any] | None = None,
) -> str:
    """The evaluation as one self-contained HTML page (no script, no external resource).

    Args:
        lineage: the dict written as ``rag_eval/judge_lineage.json``
            (:func:`mlflow_rag_eval.integrations.mlflow_logging.lineage`).
        worst: the output of :func:`worst_rows`, when the caller has it already.

    Sized for 10k rows: the quadrant draws at most 2,000 points and each metric shows at most
    20 worst rows and 20 errors, so the page stays well under 2 MB.
    """
    worst = worst if worst is not None else worst_rows(result)
    body = "".join(
        [
            _header(result, lineage, title),
            _summary(result),
            _distributions(result),
            _quadrant(result),
            _worst_section(result, worst),
            _lineage(result, lineage),
        ]
    )
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<meta http-equiv='Content-Security-Policy' content=\"{_CSP}\">"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>{_e(title)}</title><style>{_CSS}</style></head>"
        f"<body><main>{body}</main></body></html>\n"
    )

