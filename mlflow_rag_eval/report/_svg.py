"""Hand-built inline SVG charts: a score histogram and the retrieval-vs-generation quadrant.

No plotting library and no script: the page must render in a sandboxed iframe with JS off, and
stay small. Every chart has fixed ``width``/``height`` attributes (so it has a layout size
before any CSS applies) and a ``viewBox`` (so CSS may scale it down). Hover text uses SVG
``<title>`` elements, which browsers show natively without script.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

import numpy as np

__all__ = ["histogram_svg", "quadrant_svg", "QuadrantData", "quadrant_data", "MAX_POINTS"]

#: the quadrant draws at most this many points (a seeded sample beyond), keeping the page small
MAX_POINTS = 2000
#: the quadrant's split between "low" and "high" on both axes; a score equal to it is "high"
SPLIT = 0.5

_BAR = "#4c78a8"
_MEAN = "#d6452f"
_AXIS = "#6b7280"
_GRID = "#e5e7eb"
_TEXT = "#374151"
_FONT = 'font-family="system-ui, -apple-system, Segoe UI, Roboto, sans-serif"'


def _num(x: float) -> str:
    """Coordinates with one decimal: enough on screen, and half the bytes of repr."""
    return f"{x:.1f}".rstrip("0").rstrip(".")


def histogram_svg(
    values: Sequence[float], mean: float | None, *, chart_id: str, label: str, bins: int = 10
) -> tuple[str, int]:
    """A histogram of ``values`` over [0, 1] with the mean marked.

    Values outside [0, 1] are clamped into the edge bins; the number clamped is returned so
    the caller can say so.
    """
    width, height = 340, 190
    left, right, top, bottom = 40, 14, 24, 34
    pw, ph = width - left - right, height - top - bottom
    arr = np.asarray(values, dtype=float)
    n_clamped = int(np.count_nonzero((arr < 0.0) | (arr > 1.0)))
    counts, _ = np.histogram(np.clip(arr, 0.0, 1.0), bins=bins, range=(0.0, 1.0))
    peak = int(counts.max()) if len(arr) else 0
    parts = [
        f'<svg id="{escape(chart_id)}" class="chart" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(label)}" {_FONT} font-size="11">',
        f"<title>{escape(label)}</title>",
    ]
    step, y_top = _nice_axis(peak)
    for tick in range(0, y_top + 1, step):
        y = top + ph - ph * tick / y_top
        parts.append(
            f'<line x1="{left}" x2="{left + pw}" y1="{_num(y)}" y2="{_num(y)}" '
            f'stroke="{_GRID if tick else _AXIS}" stroke-width="1"/>'
        )
        if peak:
            parts.append(f'<text x="{left - 6}" y="{_num(y + 4)}" text-anchor="end" fill="{_AXIS}">{tick:,}</text>')
    if not len(arr):
        parts.append(
            f'<text x="{left + pw / 2}" y="{top + ph / 2}" text-anchor="middle" fill="{_AXIS}">'
            "no scored rows</text>"
        )
    bw = pw / bins
    total = max(len(arr), 1)
    for b, count in enumerate(counts):
        lo, hi = b / bins, (b + 1) / bins
        h = ph * count / y_top
        x = left + b * bw
        tip = f"{lo:.1f}–{hi:.1f}: {count} rows ({100 * count / total:.1f}%)"
        # A zero-height bar keeps its tooltip: an invisible full-height hit area.
        parts.append(
            f'<g><title>{tip}</title>'
            f'<rect x="{_num(x)}" y="{top}" width="{_num(bw)}" height="{ph}" fill="transparent"/>'
            f'<rect x="{_num(x + 1)}" y="{_num(top + ph - h)}" width="{_num(bw - 2)}" '
            f'height="{_num(h)}" fill="{_BAR}" rx="1.5"/></g>'
        )
    for t in range(0, 11, 2):
        x = left + pw * t / 10
        parts.append(
            f'<line x1="{_num(x)}" x2="{_num(x)}" y1="{top + ph}" y2="{top + ph + 4}" stroke="{_AXIS}"/>'
            f'<text x="{_num(x)}" y="{top + ph + 16}" text-anchor="middle" fill="{_AXIS}">'
            f"{t / 10:g}</text>"
        )
    if mean is not None:
        x = left + pw * min(max(mean, 0.0), 1.0)
        anchor, dx = ("end", -4) if mean > 0.6 else ("start", 4)
        parts.append(
            f'<line class="mean" x1="{_num(x)}" x2="{_num(x)}" y1="{top - 6}" y2="{top + ph}" '
            f'stroke="{_MEAN}" stroke-width="2" stroke-dasharray="4 3"/>'
            f'<text x="{_num(x + dx)}" y="{top - 10}" text-anchor="{anchor}" fill="{_MEAN}" '
            f'font-weight="600">mean {mean:.3f}</text>'
        )
    parts.append("</svg>")
    return "".join(parts), n_clamped


def _nice_axis(peak: int) -> tuple[int, int]:
    """A round tick step (1, 2 or 5 x 10^k) giving at most four intervals, and the axis top."""
    if peak <= 0:
        return 1, 1
    raw = peak / 4
    magnitude = 10 ** math.floor(math.log10(raw)) if raw >= 1 else 1
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    return step, math.ceil(peak / step) * step


@dataclass(frozen=True)
class QuadrantData:
    """Rows scored on both axes, the sample drawn, and the counts per quadrant (all rows)."""

    rows: np.ndarray  # row indices with both scores
    x: np.ndarray
    y: np.ndarray
    drawn: np.ndarray  # positions into rows/x/y that are drawn
    n_missing: int  # rows lacking either score

    def counts(self) -> dict[str, int]:
        hx, hy = self.x >= SPLIT, self.y >= SPLIT
        return {
            "healthy": int(np.count_nonzero(hx & hy)),
            "retriever misses": int(np.count_nonzero(~hx & hy)),
            "generator invents": int(np.count_nonzero(hx & ~hy)),
            "both fail": int(np.count_nonzero(~hx & ~hy)),
        }


def quadrant_data(
    x_values: Sequence[float | None] | np.ndarray, y_values: Sequence[float | None] | np.ndarray, *,
    max_points: int = MAX_POINTS,
) -> QuadrantData:
    """Pair the two metrics' scores per row (None or NaN: the row is not scored); sample
    ``max_points`` of them with a fixed seed. Vectorised: a Spark run passes millions of rows."""
    n = min(len(x_values), len(y_values))
    xs = np.asarray(x_values[:n], dtype=float)  # None -> NaN
    ys = np.asarray(y_values[:n], dtype=float)
    rows = np.flatnonzero(~np.isnan(xs) & ~np.isnan(ys))
    x, y = xs[rows], ys[rows]
    if len(rows) > max_points:
        drawn = np.sort(np.random.default_rng(0).choice(len(rows), size=max_points, replace=False))
    else:
        drawn = np.arange(len(rows))
    return QuadrantData(rows, x, y, drawn, n_missing=max(len(x_values), len(y_values)) - len(rows))


def quadrant_svg(data: QuadrantData, *, x_label: str, y_label: str) -> str:
    """Scatter of retrieval (x) against generation (y) with the quadrants named.

    The quadrant names sit outside the plot (above it for the top two, under the axis for the
    bottom two): scores pile up at 0 and 1, exactly where names inside the corners would go.
    """
    left, right, top, bottom, side = 56, 16, 30, 66, 340
    width, height = left + side + right, top + side + bottom
    pad = 0.04  # points at 0 and 1 stay off the frame
    sx = lambda v: left + side * (v + pad) / (1 + 2 * pad)  # noqa: E731
    sy = lambda v: top + side * (1 + pad - v) / (1 + 2 * pad)  # noqa: E731
    counts = data.counts()
    total = max(len(data.rows), 1)
    what = f"{escape(y_label)} against {escape(x_label)} per row"
    parts = [
        f'<svg id="quadrant" class="chart" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{what}" {_FONT} font-size="11">',
        f"<title>{what}</title>",
    ]
    mid_x, mid_y, right_x, bottom_y = sx(SPLIT), sy(SPLIT), left + side, top + side
    for x0, y0, x1, y1, colour in (
        (left, top, mid_x, mid_y, "#fff7e6"), (mid_x, top, right_x, mid_y, "#ecfdf3"),
        (left, mid_y, mid_x, bottom_y, "#fdecec"), (mid_x, mid_y, right_x, bottom_y, "#fff7e6"),
    ):
        parts.append(
            f'<rect x="{_num(x0)}" y="{_num(y0)}" width="{_num(x1 - x0)}" height="{_num(y1 - y0)}" fill="{colour}"/>'
        )
    parts.append(
        f'<rect x="{left}" y="{top}" width="{side}" height="{side}" fill="none" stroke="{_AXIS}"/>'
        f'<line x1="{_num(mid_x)}" x2="{_num(mid_x)}" y1="{top}" y2="{bottom_y}" stroke="{_AXIS}" stroke-dasharray="5 4"/>'
        f'<line x1="{left}" x2="{right_x}" y1="{_num(mid_y)}" y2="{_num(mid_y)}" stroke="{_AXIS}" stroke-dasharray="5 4"/>'
    )
    for t in (0.0, 0.25, 0.5, 0.75, 1.0):
        parts.append(
            f'<text x="{_num(sx(t))}" y="{bottom_y + 15}" text-anchor="middle" fill="{_AXIS}">{t:g}</text>'
            f'<text x="{left - 6}" y="{_num(sy(t) + 4)}" text-anchor="end" fill="{_AXIS}">{t:g}</text>'
        )
    parts.append(
        f'<text x="{left + side / 2}" y="{height - 8}" text-anchor="middle" fill="{_TEXT}" font-size="12" '
        f'font-weight="600">{escape(x_label)} (retrieval) →</text>'
        f'<text transform="translate(16 {top + side / 2}) rotate(-90)" text-anchor="middle" fill="{_TEXT}" '
        f'font-size="12" font-weight="600">{escape(y_label)} (generation) →</text>'
    )
    # Scores are often a few discrete fractions: a small seeded jitter keeps ties visible, and
    # never moves a point across the split, so the picture agrees with the counts.
    rng = np.random.default_rng(1)
    xs, ys = data.x[data.drawn], data.y[data.drawn]
    jx = _jitter(np.clip(xs, 0.0, 1.0), rng)
    jy = _jitter(np.clip(ys, 0.0, 1.0), rng)
    parts.append(
        f'<g class="points" fill="{_BAR}" fill-opacity="0.35" stroke="{_BAR}" stroke-opacity="0.8" stroke-width="0.6">'
    )
    for pos, px, py, vx, vy in zip(data.drawn, jx, jy, xs, ys):
        parts.append(
            f'<circle cx="{_num(sx(px))}" cy="{_num(sy(py))}" r="3">'
            f"<title>row {data.rows[pos]}: {vx:.2f}, {vy:.2f}</title></circle>"
        )
    parts.append("</g>")
    for name, x, y, anchor, colour in (
        ("retriever misses", left, top - 9, "start", "#92400e"),
        ("healthy", right_x, top - 9, "end", "#166534"),
        ("both fail", left, bottom_y + 33, "start", "#991b1b"),
        ("generator invents", right_x, bottom_y + 33, "end", "#92400e"),
    ):
        share = 100 * counts[name] / total
        parts.append(
            f'<text x="{x}" y="{y}" text-anchor="{anchor}" fill="{colour}" font-size="12" font-weight="600">'
            f'{name}<tspan font-weight="400" fill="{_AXIS}"> · {share:.0f}% ({counts[name]:,})</tspan></text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _jitter(v: np.ndarray, rng: np.random.Generator, amount: float = 0.02) -> np.ndarray:
    j = v + rng.uniform(-amount, amount, size=len(v))
    high = v >= SPLIT
    j = np.where(high, np.maximum(j, SPLIT + 0.005), np.minimum(j, SPLIT - 0.005))
    return np.clip(j, 0.0, 1.0)
