"""The report's stylesheet, inline in the page: system fonts only, nothing fetched.

The Content-Security-Policy forbids every load (no script, no font, no remote image): the page
keeps working offline and in a sandboxed iframe, and a slip in escaping cannot run anything.
"""

CSP = "default-src 'none'; style-src 'unsafe-inline'"

CSS = """
:root { color-scheme: light; --ink:#1f2937; --muted:#6b7280; --line:#e5e7eb; --soft:#f8fafc;
  --accent:#4c78a8; --bad:#b42318; }
* { box-sizing: border-box; }
body { margin:0; background:#fff; color:var(--ink); font:14px/1.5 system-ui, -apple-system,
  "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
main { max-width:1180px; margin:0 auto; padding:24px 28px 48px; }
h1 { font-size:22px; margin:0; }
p.sub { margin:2px 0 12px; }
h2 { font-size:17px; margin:32px 0 10px; padding-bottom:6px; border-bottom:1px solid var(--line); }
p.note, .note { color:var(--muted); font-size:12.5px; margin:4px 0; }
code, pre, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size:12px; }
.meta { display:grid; grid-template-columns:repeat(auto-fill, minmax(160px, 1fr)); gap:8px 16px;
  background:var(--soft); border:1px solid var(--line); border-radius:8px; padding:12px 16px; margin:0; }
.meta dt { color:var(--muted); font-size:11.5px; text-transform:uppercase; letter-spacing:.04em; }
.meta dd { margin:0; font-weight:600; overflow-wrap:anywhere; }
table { border-collapse:collapse; width:100%; }
th, td { text-align:left; padding:6px 10px; border-bottom:1px solid var(--line); vertical-align:top; }
th { font-size:12px; color:var(--muted); font-weight:600; background:var(--soft); }
td.num, th.num { text-align:right; font-variant-numeric:tabular-nums; white-space:nowrap; }
td.bad { color:var(--bad); font-weight:600; }
.dir { color:var(--muted); font-size:12px; }
.charts { display:grid; grid-template-columns:repeat(auto-fill, minmax(350px, 1fr)); gap:14px; }
figure { margin:0; border:1px solid var(--line); border-radius:8px; padding:10px 12px; background:#fff; }
figcaption { font-weight:600; margin-bottom:4px; }
svg.chart { display:block; max-width:100%; height:auto; }
.quad { display:flex; flex-wrap:wrap; gap:20px; align-items:flex-start; }
.quad ul { margin:6px 0; padding-left:18px; }
.quad .legend { flex:1 1 300px; max-width:520px; }
details { border:1px solid var(--line); border-radius:8px; margin:8px 0; background:#fff; }
details > summary { cursor:pointer; padding:8px 12px; font-weight:600; background:var(--soft); border-radius:8px; }
details[open] > summary { border-bottom:1px solid var(--line); border-radius:8px 8px 0 0; }
details .body { padding:4px 12px 10px; }
details details { border:none; margin:4px 0 0; }
details details > summary { background:none; padding:0; font-weight:400; color:var(--accent); font-size:12.5px; }
.qa .q { font-weight:600; }
.qa .a, .just { white-space:pre-wrap; overflow-wrap:anywhere; }
.qa .a { color:#374151; margin-top:4px; }
pre.evidence { max-height:300px; font-size:11.5px; }
pre { background:var(--soft); border:1px solid var(--line); border-radius:6px; padding:8px 10px;
  overflow:auto; max-height:420px; white-space:pre-wrap; overflow-wrap:anywhere; margin:6px 0; }
.err { color:var(--bad); }
.usage { display:flex; flex-wrap:wrap; gap:10px; margin:8px 0 12px; }
table.rows th.idx { width:56px; } table.rows th.score { width:70px; } table.rows th.qa { width:45%; }
.usage div { border:1px solid var(--line); border-radius:8px; padding:6px 12px; background:var(--soft); min-width:110px; }
.usage b { display:block; font-size:16px; }
.usage span { color:var(--muted); font-size:11.5px; }
"""
