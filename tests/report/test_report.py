"""The worst-rows artifact and the HTML report: selection rules, safety, and a real browser.

Results are built by hand (MetricResult/RowResult directly): no judge, no model, no MLflow run.
The browser test renders the report in headless Chromium: the charts must be in the DOM, have a
layout size, and the screenshot must show something.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from html.parser import HTMLParser

import numpy as np
import pytest
from browser import FLAGS, DevTools, kill
from browser import chromium as chromium  # noqa: F401  (the fixture)

from mlflow_rag_eval.evaluation.result import EvaluationResult
from mlflow_rag_eval.judges import JudgeInfo
from mlflow_rag_eval.records import Context, RagRecord
from mlflow_rag_eval.report import render_report, worst_rows
from mlflow_rag_eval.results import MetricResult, RowResult
from mlflow_rag_eval.tracking.run_logging import lineage

JUDGE = JudgeInfo(name="scripted", kind="scripted", model="m", fingerprint="f", prompts_version="p")
XSS = "<script>alert('x')</script>"
XSS_ESCAPED = "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;"  # as the templates escape it (MarkupSafe)


def _row(v: float | str | None, i: int) -> RowResult:
    """A float is a score, None not applicable, a string an error."""
    if v is None:
        return RowResult.not_applicable("no reference")
    if isinstance(v, str):
        return RowResult.failed(v, raw_reply="{not json")
    return RowResult.scored(
        v, f"{round(v * 4)} of 4 claims supported",
        claims=[{"claim": f"claim {i}.{k}", "value": k < round(v * 4)} for k in range(4)],
    )


def make_result(
    columns: dict[str, list], *, lower_is_better: tuple[str, ...] = (), questions=None, answers=None,
    usage: dict | None = None,
) -> EvaluationResult:
    n = len(next(iter(columns.values())))
    records = [
        RagRecord(
            question=questions[i] if questions else f"What does document {i} say?",
            answer=answers[i] if answers else f"Document {i} says something.",
            contexts=(Context(f"passage {i}", id=f"d{i}"),),
            reference=f"reference {i}",
        )
        for i in range(n)
    ]
    metrics = [
        MetricResult(
            name=name, spec={"name": name, "version": 1},
            rows=tuple(_row(v, i) for i, v in enumerate(values)),
            greater_is_better=name not in lower_is_better,
        )
        for name, values in columns.items()
    ]
    return EvaluationResult(
        records=records, metrics=metrics, judge=JUDGE, dataset_digest="abc123",
        timings={name: 0.01 for name in columns}, judge_usage=usage or {},
    )


def _rows(out: dict, key: str) -> list[int]:
    return [r["row"] for r in out["metrics"][key]["worst"]]


# -- worst_rows -------------------------------------------------------------------------------
def test_worst_rows_take_the_bottom_decile_worst_first():
    values = [((7 * i) % 20) / 19 for i in range(20)]  # a permutation of 0, 1/19, ..., 1
    out = worst_rows(make_result({"faithfulness": values}))
    m = out["metrics"]["faithfulness"]
    # ceil(0.1 * 20) = 2 rows: the scores 0 and 1/19, lowest first.
    assert _rows(out, "faithfulness") == [values.index(0.0), values.index(1 / 19)]
    assert [r["value"] for r in m["worst"]] == [0.0, 1 / 19]
    assert m["cutoff"] == 1 / 19 and m["greater_is_better"] is True and m["n_scored"] == 20
    first = m["worst"][0]
    assert first["question"] == f"What does document {first['row']} say?"
    assert first["justification"] == "0 of 4 claims supported"
    assert first["evidence"]["claims"][0] == {"claim": f"claim {first['row']}.0", "value": False}
    # 15 scored rows: ceil(1.5) = 2; min_rows raises the count on small data.
    assert len(worst_rows(make_result({"f": values[:15]}))["metrics"]["f"]["worst"]) == 2
    assert len(worst_rows(make_result({"f": values[:5]}), min_rows=3)["metrics"]["f"]["worst"]) == 3


def test_rows_tied_at_the_cutoff_are_all_included():
    values = [1.0, 0.5, 0.0, 0.5, 0.9, 0.5, 1.0, 0.8, 0.7, 0.6]
    out = worst_rows(make_result({"faithfulness": values}), fraction=0.2)
    # ceil(0.2 * 10) = 2 rows would cut the three 0.5s in the middle: all of them are taken.
    assert _rows(out, "faithfulness") == [2, 1, 3, 5]
    assert out["metrics"]["faithfulness"]["cutoff"] == 0.5


def test_lower_is_better_metric_lists_its_highest_scores():
    values = [0.1, 0.9, 0.3, 0.95, 0.2, 0.0, 0.4, 0.5, 0.6, 0.7, 0.8, 0.05]
    out = worst_rows(make_result({"abstention_error": values}, lower_is_better=("abstention_error",)))
    m = out["metrics"]["abstention_error"]
    assert m["greater_is_better"] is False
    assert _rows(out, "abstention_error") == [3, 1]  # ceil(1.2) = 2: 0.95, then 0.9
    assert m["cutoff"] == 0.9


def test_errors_are_listed_apart_and_skipped_rows_nowhere():
    values = [0.2, "ParseError: reply was not JSON", None, 0.9, "Timeout: no reply in 30 s", 0.0, None, 1.0]
    out = worst_rows(make_result({"faithfulness": values}), fraction=0.25)
    m = out["metrics"]["faithfulness"]
    assert _rows(out, "faithfulness") == [5]  # ceil(0.25 * 4 scored) = 1: the 0.0
    assert [(e["row"], e["error"]) for e in m["errors"]] == [
        (1, "ParseError: reply was not JSON"), (4, "Timeout: no reply in 30 s"),
    ]
    assert m["errors"][0]["evidence"] == {"raw_reply": "{not json"}
    assert m["errors"][0]["question"] == "What does document 1 say?"
    assert (m["n_scored"], m["n_error"], m["n_skipped"]) == (4, 2, 2)
    # A metric with nothing scored has no worst rows, only its errors.
    none = worst_rows(make_result({"f": ["E: x", None]}))["metrics"]["f"]
    assert none["worst"] == [] and none["cutoff"] is None and len(none["errors"]) == 1


def test_worst_rows_are_json_safe_and_long_text_is_cut():
    long_answer = "word " * 400  # 2,000 characters
    result = make_result({"faithfulness": [0.0, 1.0]}, answers=[long_answer, "short"])
    odd = RowResult(
        value=0.0, justification="odd details",
        details={"scores": (np.float32(0.5), float("nan")), "ids": {"b", "a"}, "n": np.int64(3), 7: None},
    )
    result.metrics[0] = MetricResult("faithfulness", {}, (odd, result.metrics[0].rows[1]))
    out = worst_rows(result)
    text = json.dumps(out, allow_nan=False)  # no NaN, no numpy, no tuple left
    row = json.loads(text)["metrics"]["faithfulness"]["worst"][0]
    assert row["evidence"] == {"scores": [0.5, None], "ids": ["a", "b"], "n": 3, "7": None}
    assert row["answer"].startswith(long_answer[:500]) and "[1500 more characters]" in row["answer"]
    assert len(row["answer"]) < 530
    with pytest.raises(ValueError):
        worst_rows(result, fraction=0.0)


def test_when_every_row_ties_at_the_best_score_no_row_is_worst():
    """Today's bug: faithfulness 1.0 on all 74 demo rows listed all 74 rows as "worst"."""
    result = make_result({"faithfulness": [1.0] * 74, "abstention_error": [0.0] * 74},
                         lower_is_better=("abstention_error",))
    out = worst_rows(result)
    assert out["schema_version"] == 2
    f = out["metrics"]["faithfulness"]
    assert (f["worst"], f["cutoff"], f["best"], f["note"]) == ([], None, 1.0, "no row below 1.000")
    a = out["metrics"]["abstention_error"]
    assert (a["worst"], a["best"], a["note"]) == ([], 0.0, "no row above 0.000")
    html = render_report(result, lineage(result), worst=out)
    assert "faithfulness — no row below 1.000</summary>" in html
    assert "no row below 1.000: all 74 scored rows score 1.000, the best score seen" in html
    assert "abstention_error — no row above 0.000</summary>" in html
    assert "worst row(s)" not in html and "<table class=\"rows\">" not in html


def test_rows_at_the_best_score_are_never_worst():
    values = [1.0, 1.0, 0.5, 1.0]
    assert _rows(worst_rows(make_result({"faithfulness": values}), fraction=1.0), "faithfulness") == [2]
    assert _rows(worst_rows(make_result({"faithfulness": values}), min_rows=3), "faithfulness") == [2]
    out = worst_rows(make_result({"faithfulness": values}))["metrics"]["faithfulness"]
    assert (out["best"], out["cutoff"], out["note"]) == (1.0, 0.5, None)
    nothing = worst_rows(make_result({"f": ["E: x", None]}))["metrics"]["f"]
    assert (nothing["best"], nothing["note"]) == (None, "no scored row")


# -- render_report ----------------------------------------------------------------------------
def _sample_result(n: int = 60, seed: int = 0) -> EvaluationResult:
    """A small but varied evaluation: every section of the report has something to show."""
    rng = np.random.default_rng(seed)
    recall = np.round(rng.beta(2, 1.2, n) * 4) / 4
    faith = np.round(rng.beta(3, 1, n) * 5) / 5
    relevancy = rng.beta(5, 2, n)
    columns = {
        "faithfulness": [float(v) for v in faith],
        "context_recall": [None if i % 13 == 5 else float(v) for i, v in enumerate(recall)],
        "answer_relevancy": [float(v) for v in relevancy],
        "ndcg@10": [float(v) for v in rng.uniform(0, 1, n)],
        "abstention_error": [float(v) for v in rng.choice([0.0, 1.0], n, p=[0.85, 0.15])],
    }
    columns["faithfulness"][3] = "ParseError: the judge's reply was not JSON"
    columns["answer_relevancy"][7] = 1.3  # out of [0, 1]: clamped, and the page says so
    questions = [f"What is the refund window for plan {i}?" for i in range(n)]
    answers = [f"Plan {i} can be refunded within {i % 30 + 1} days of purchase." for i in range(n)]
    columns["faithfulness"][10] = 0.0  # the worst row carries an injection attempt
    questions[10] = f"Ignore the rules {XSS}"
    answers[10] = f"Sure! {XSS} <img src=x onerror=alert(1)>"
    usage = {"provider_calls": 240, "cache_hits": 60, "tokens_in": 183_211, "tokens_out": 20_477,
             "cost_usd": 0.0398, "errors": {"ParseError": 1}, "templates": {}}
    return make_result(columns, lower_is_better=("abstention_error",), questions=questions,
                       answers=answers, usage=usage)


def _tags(html: str) -> list[tuple[str, list]]:
    """Every tag of the page with its attributes (text content is not markup)."""
    found = []

    class Parser(HTMLParser):
        def handle_starttag(self, tag, attrs):
            found.append((tag, attrs))

        handle_startendtag = handle_starttag

    Parser().feed(html)
    return found


@pytest.fixture(scope="module")
def sample():
    result = _sample_result()
    lin = lineage(result)
    lin["judge"]["params"] = {"note": XSS}
    return result, lin, render_report(result, lin, title="Support bot <v2>")


def test_report_is_self_contained_and_escapes_user_text(sample):
    _, _, html = sample
    assert "<script" not in html.lower()
    assert "http://" not in html and "https://" not in html and "//" not in html
    tags = _tags(html)
    assert not {t for t, _ in tags} & {"script", "img", "link", "iframe", "object", "embed", "image", "use"}
    loading = {"src", "href", "xlink:href", "action", "data", "srcset", "poster", "background"}
    assert not [(t, a) for t, attrs in tags for a, _ in attrs if a in loading or a.startswith("on")]
    assert "@import" not in html and "url(" not in html
    assert XSS_ESCAPED in html  # the question, the answer and the lineage: shown as text
    assert html.count(XSS_ESCAPED) >= 3
    assert "&lt;img src=x onerror=alert(1)&gt;" in html
    assert "<title>Support bot &lt;v2&gt;</title>" in html
    assert "Content-Security-Policy" in html


def test_report_has_a_per_slice_table_only_when_sliced(sample):
    import dataclasses

    from mlflow_rag_eval.evaluation.slices import compute_slices

    result, lin, unsliced = sample
    assert 'id="slices"' not in unsliced
    records = [dataclasses.replace(r, metadata={"difficulty": None if i % 10 == 9 else ("hard" if i % 3 else XSS)})
               for i, r in enumerate(result.records)]
    sliced = dataclasses.replace(result, records=records)
    slices = compute_slices(sliced, ["difficulty"])
    html = render_report(sliced, lin, slices=slices)
    section = html[html.index('<h2 id="slices">'):html.index("<h2>Score distributions")]
    assert "<h3>difficulty</h3>" in section and XSS not in section and XSS_ESCAPED in section
    assert "6 row(s) have no difficulty and are in no slice of it." in section
    header = re.search(r"<tr><th>metric</th>(.*?)</tr>", section, re.S).group(1)
    columns = re.findall(r'<th class="num">(.*?) <span class="dir">\((\d+) rows\)</span></th>', header)
    assert [(value, int(n)) for value, n in columns] == [(XSS_ESCAPED, 18), ("hard", 36)]
    rows = re.findall(r"<tr><td>(.*?)</td>(.*?)</tr>", section, re.S)
    assert [name for name, _ in rows] == [m.name for m in result.metrics]  # the summary's order
    for (_, shown), m in zip(rows, result.metrics):
        cells = re.findall(r'<td class="num">(.*?)</td>', shown, re.S)
        assert len(cells) == len(slices.fields[0].slices)  # one cell per slice value
        for cell, s in zip(cells, slices.fields[0].slices):
            summary = s.summaries[m.key]
            assert cell.startswith(f"{summary.mean:.3f} ")
            assert f"({summary.ci_low:.3f} – {summary.ci_high:.3f})" in cell
            errors = f'<span class="err">{summary.n_error}</span>' if summary.n_error else "<span>0</span>"
            assert cell.endswith(errors)
    assert slices.fields[0].slices[0].summaries["faithfulness"].n_error == 1  # row 3's ParseError


def test_report_has_a_histogram_per_metric_and_the_quadrant(sample):
    result, _, html = sample
    assert re.findall(r'<svg id="(hist-[^"]+)"', html) == [f"hist-{m.key}" for m in result.metrics]
    assert "hist-ndcg_at_10" in html
    assert html.count('id="quadrant"') == 1
    # rows missing context_recall are left out of the quadrant, and counted
    # (5 lack context_recall, 1 has a faithfulness error)
    assert html.count("<circle") == 60 - 6 and "6 rows left out" in html
    assert "1 value(s) outside [0, 1] clamped" in html
    for label in ("retriever misses", "generator invents", "both fail", "healthy"):
        assert label in html
    for text in ("abc123", "scripted", "prompts version", "judge calls", "183,211", "0.0398"):
        assert text in html
    without = make_result({"faithfulness": [0.5, 1.0], "answer_relevancy": [0.2, 0.4]})
    html2 = render_report(without, lineage(without))
    assert 'id="quadrant"' not in html2 and html2.count('class="chart"') == 2


def test_report_for_ten_thousand_rows_stays_small():
    n = 10_000
    rng = np.random.default_rng(1)
    result = make_result({
        name: [float(v) for v in rng.uniform(0, 1, n)]
        for name in ("faithfulness", "context_recall", "answer_relevancy")
    }, answers=["an answer " * 100] * n)
    start = time.perf_counter()
    html = render_report(result, lineage(result))
    elapsed = time.perf_counter() - start
    assert len(html.encode()) < 2_000_000
    assert html.count("<circle") == 2000 and "seeded random sample of 2,000 points (of 10,000)" in html
    assert elapsed < 10
    quadrant = re.search(r'<svg id="quadrant".*?</svg>', html)[0]
    assert quadrant in render_report(result, lineage(result))  # the sample is seeded


def test_a_ci_that_cannot_be_computed_is_shown_as_such():
    """Today's bug: the summary showed 1.000 – 1.000 for rows that all scored 1."""
    result = make_result({"faithfulness": [1.0] * 5, "context_recall": [0.5, None, None, None, None],
                          "answer_relevancy": [0.2, 0.4, 0.9, 1.0, 0.6]})
    html = render_report(result, lineage(result))
    assert '<td class="num" title="not computable: all 5 values equal 1: nothing to resample">—</td>' in html
    assert '<td class="num" title="not computable: a CI needs at least 2 values, got 1">—</td>' in html
    s = result.metrics[2].summary
    assert f'<td class="num">{s.ci_low:.3f} – {s.ci_high:.3f}</td>' in html
    assert "1.000 – 1.000" not in html


def test_the_page_comes_from_package_templates_with_autoescape():
    from importlib.resources import files

    shipped = {p.name for p in (files("mlflow_rag_eval.report") / "templates").iterdir()}
    assert {"_page.html.j2", "report.html.j2", "report.css", "comparison.html.j2"} <= shipped
    # text from the data that looks like markup or like a template is shown, never run
    tricky = "{{ 1234 * 1000 }} {% if true %}yes{% endif %} <b>bold</b>"
    result = make_result({"faithfulness": [0.0, 1.0]}, questions=[tricky, "q"], answers=[tricky, "a"])
    html = render_report(result, lineage(result), title="{{ title }} <i>")
    assert "1234000" not in html and "<b>bold</b>" not in html
    assert html.count("{{ 1234 * 1000 }} {% if true %}yes{% endif %} &lt;b&gt;bold&lt;/b&gt;") == 2
    assert "<title>{{ title }} &lt;i&gt;</title>" in html
    assert "content=\"default-src 'none'; style-src 'unsafe-inline'\"" in html


# -- a real browser ---------------------------------------------------------------------------
_LAYOUT_JS = """JSON.stringify({
  charts: [...document.querySelectorAll('svg.chart')].map(e => {
    const r = e.getBoundingClientRect(); return {id: e.id, w: r.width, h: r.height}; }),
  circles: (() => {  // drawn with a size, inside the chart
    const q = document.getElementById('quadrant').getBoundingClientRect();
    return [...document.querySelectorAll('#quadrant circle')].filter(c => {
      const r = c.getBoundingClientRect();
      return r.width > 0 && r.height > 0 && r.left >= q.left && r.right <= q.right
        && r.top >= q.top && r.bottom <= q.bottom; }).length; })(),
  bars: [...document.querySelectorAll('svg.chart rect[fill="#4c78a8"]')].filter(
    b => b.getBoundingClientRect().height > 0).length,
  mainWidth: getComputedStyle(document.querySelector('main')).maxWidth,
  overflowX: document.documentElement.scrollWidth - window.innerWidth,
  scripts: document.scripts.length,
})"""


def test_report_renders_in_headless_chromium(sample, chromium, tmp_path):
    from PIL import Image

    result, _, html = sample
    page = tmp_path / "report.html"
    page.write_text(html, encoding="utf-8")
    url = page.as_uri()

    # 1. What a person gets: the DOM after rendering, and a screenshot.
    shot = tmp_path / "shot.png"
    proc = subprocess.Popen(
        [chromium, *FLAGS, f"--user-data-dir={tmp_path / 'profile1'}", "--dump-dom",
         f"--screenshot={shot}", "--window-size=1280,2000", url],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    try:
        dom, _ = proc.communicate(timeout=60)
    finally:
        kill(proc)
    dom = dom.decode()
    for m in result.metrics:
        assert f'<svg id="hist-{m.key}" class="chart"' in dom
    assert '<svg id="quadrant" class="chart"' in dom and dom.count("<circle") == 54
    assert XSS_ESCAPED.replace("&#39;", "'") in dom and "<script" not in dom
    assert shot.exists() and shot.stat().st_size > 10_000
    with Image.open(shot) as img:
        assert img.size == (1280, 2000)
        colours = img.convert("RGB").getcolors(maxcolors=1 << 16)
    assert colours is None or len(colours) > 50  # not a blank page

    # 2. Layout: every chart has a size, the points are drawn, the page fits the window.
    tools = DevTools(chromium, [*FLAGS, f"--user-data-dir={tmp_path / 'profile2'}", "--window-size=1280,2000", url])
    try:
        deadline = time.monotonic() + 20
        while True:
            targets = tools.call("Target.getTargets")["targetInfos"]
            target = next((t for t in targets if t["type"] == "page" and t["url"] == url), None)
            if target is not None:
                break
            assert time.monotonic() < deadline, f"no page for the report among {targets}"
            time.sleep(0.1)
        session = tools.call("Target.attachToTarget", {"targetId": target["targetId"], "flatten": True})["sessionId"]
        while tools.evaluate("location.href + ' ' + document.readyState", session) != f"{url} complete":
            assert time.monotonic() < deadline, "the report did not finish loading"
            time.sleep(0.1)
        layout = json.loads(tools.evaluate(_LAYOUT_JS, session))
    finally:
        tools.close()
    assert [c["id"] for c in layout["charts"]] == [f"hist-{m.key}" for m in result.metrics] + ["quadrant"]
    for chart in layout["charts"]:
        assert chart["w"] > 100 and chart["h"] > 100, chart
    assert layout["charts"][-1]["w"] > 300 and layout["charts"][-1]["h"] > 300
    assert layout["circles"] == 54 and layout["bars"] > 10
    assert layout["mainWidth"] == "1180px"  # the inline stylesheet applied, despite the CSP
    assert layout["overflowX"] <= 0 and layout["scripts"] == 0


def test_the_summary_shows_the_worst_decile_mean_beside_p10():
    """Two bad rows of twenty: p10 reads 0.976, the worst 10% mean 0.380; for a lower-is-better
    metric the worst rows are its highest."""
    result = make_result({"faithfulness": [0.0, 0.76] + [1.0] * 18,
                          "abstention_error": [1.0, 0.9] + [0.0] * 18}, lower_is_better=("abstention_error",))
    html = render_report(result, lineage(result))
    summary = html[html.index("<h2>Summary</h2>"):html.index("</table>", html.index("<h2>Summary</h2>"))]
    assert '<th class="num">p10</th><th class="num" title="the mean of the worst 10% of the scored rows' in summary
    assert ">worst 10% mean</th>" in summary
    assert '<td class="num">0.976</td><td class="num">0.380</td>' in summary
    assert '<td class="num">0.000</td><td class="num">0.950</td>' in summary
