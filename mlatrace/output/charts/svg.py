"""Inline SVG charts, drawn in Python when the report is made (no script, no library).

Every piece of text that reaches the markup goes through `esc` (a trace is untrusted:
a graph key or kernel name must never become markup). Numbers are formatted here.
"""

from __future__ import annotations

import math
from html import escape
from typing import Any

from mlatrace.output.charts.regions import Region
from mlatrace.output.charts.spark import scale

WIDTH, HEIGHT = 1100, 250
HALF = 545                       # two charts side by side
LEFT, RIGHT, TOP, BOTTOM = 62, 14, 26, 64
BLUE, RED, GREY, INK = "#2b6cb0", "#c53030", "#718096", "#1a202c"


def esc(value: Any) -> str:
    """Text for markup and attribute values alike (quotes too)."""
    return escape(str(value), quote=True)


def compact(value: float) -> str:
    """1, 512, 8.2K, 100K, 1.3M: a length or count in a few characters."""
    v = abs(value)
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "K")):
        if v >= limit:
            text = f"{value / limit:.3g}"
            return text + suffix
    return f"{value:.4g}" if isinstance(value, float) and not value.is_integer() else str(int(value))


def duration(ns: float) -> str:
    """A time in ns as a short string (ns, us, ms or s)."""
    if ns >= 1e9:
        return f"{ns / 1e9:.3g} s"
    if ns >= 1e6:
        return f"{ns / 1e6:.3g} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.3g} us"
    return f"{ns:.3g} ns"


def even_labels(values: list[float], fmt: Any) -> list[str]:
    """The labels of a linear axis's ticks, every one with the same unit and decimals
    (3.58, 3.59, 3.60 ms; 14.1002, 14.1004 s), so equal steps read as equal: `fmt` is
    `duration` (ns), `compact` (lengths, counts) or any other formatter (plain numbers)."""
    top = max((abs(v) for v in values), default=0)
    if fmt is duration:
        scale, unit = next(((f, u) for f, u in ((1e9, " s"), (1e6, " ms"), (1e3, " us"))
                            if top >= f), (1, " ns"))
    elif fmt is compact:
        scale, unit = next(((f, u) for f, u in ((1e9, "G"), (1e6, "M"), (1e3, "K"))
                            if top >= f), (1, ""))
    else:
        scale, unit = 1, ""
    scaled = [v / scale for v in values]
    decimals = next((d for d in range(7) if all(
        abs(round(x, d) - x) <= 1e-9 * max(1.0, abs(x)) for x in scaled)), 6)
    return [f"{x:.{decimals}f}{unit}" for x in scaled]


def nice_ticks(low: float, high: float, count: int = 5, integer: bool = False) -> list[float]:
    """Round tick values covering [low, high] (linear); `integer`: whole numbers only
    (an axis of counts)."""
    if high <= low:
        return [low]
    raw = (high - low) / count
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    if integer:
        step = max(1, math.ceil(step))
    first = math.ceil(low / step) * step
    ticks, v = [], first
    while v <= high + step * 1e-9:
        ticks.append(round(v, 10))
        v += step
    return ticks


def _log_ticks(low: float, high: float) -> list[float]:
    a, b = math.floor(math.log10(max(low, 1))), math.ceil(math.log10(max(high, 1)))
    ticks = [10.0 ** e for e in range(a, b + 1) if low <= 10.0 ** e <= high]
    if len(ticks) < 3:  # a range within a decade or two: 1-2-5 steps
        ticks = [m * 10.0 ** e for e in range(a - 1, b + 1) for m in (1, 2, 5)
                 if low <= m * 10.0 ** e <= high]
    return ticks or [max(low, 1)]


class Plot:
    """One chart's frame: value -> pixel maps, axes, and the SVG elements added to it."""

    def __init__(self, title: str, x_range: tuple[float, float], y_range: tuple[float, float],
                 log_y: bool | None = None, width: int = WIDTH, height: int = HEIGHT) -> None:
        self.width, self.height = width, height
        self.w, self.h = width - LEFT - RIGHT, height - TOP - BOTTOM
        self.x0, self.x1 = x_range
        if self.x1 <= self.x0:
            self.x1 = self.x0 + 1
        y0, y1 = y_range
        self.log, at = scale(int(y0), int(y1)) if log_y is None else (log_y, None)
        if self.log:
            y0 = max(y0, 1)
            if y1 <= y0:
                y1 = y0 * 10
        elif y1 <= y0:
            y0, y1 = (0, y1 * 1.1 + 1) if y1 >= 0 else (y1 - 1, 0)
        elif not self.log and y0 > 0 and y0 < (y1 - y0):
            y0 = 0  # a linear axis starts at 0 unless the values sit far above it
        # headroom: the largest value is drawn below the frame, not on it
        y1 = y1 * 1.8 if self.log else y1 + (y1 - y0) * 0.08
        self.y0, self.y1 = y0, y1
        self.title = title
        self.parts: list[str] = []

    def x(self, value: float) -> float:
        return LEFT + (value - self.x0) / (self.x1 - self.x0) * self.w

    def y(self, value: float) -> float:
        if self.log:
            a, b = math.log10(self.y0), math.log10(self.y1)
            f = (math.log10(max(value, self.y0)) - a) / (b - a) if b > a else 0.0
        else:
            f = (value - self.y0) / (self.y1 - self.y0)
        f = min(max(f, 0.0), 1.0)
        return TOP + (1 - f) * self.h

    def add(self, element: str) -> None:
        self.parts.append(element)

    def axes(self, x_label: str, y_label: str, x_fmt: Any, y_fmt: Any) -> None:
        bottom = TOP + self.h
        ticks = _log_ticks(self.y0, self.y1) if self.log else nice_ticks(self.y0, self.y1, 4)
        labels = [y_fmt(v) for v in ticks] if self.log else even_labels(ticks, y_fmt)
        for v, label in zip(ticks, labels, strict=True):
            yy = self.y(v)
            self.add(f'<line x1="{LEFT}" x2="{LEFT + self.w}" y1="{yy:.1f}" y2="{yy:.1f}" '
                     'stroke="#e2e8f0"/>')
            self.add(f'<text x="{LEFT - 6}" y="{yy + 4:.1f}" text-anchor="end">'
                     f'{esc(label)}</text>')
        ticks = nice_ticks(self.x0, self.x1, 6)
        for v, label in zip(ticks, even_labels(ticks, x_fmt), strict=True):
            xx = self.x(v)
            self.add(f'<line x1="{xx:.1f}" x2="{xx:.1f}" y1="{bottom}" y2="{bottom + 4}" '
                     f'stroke="{GREY}"/>')
            self.add(f'<text x="{xx:.1f}" y="{bottom + 16}" text-anchor="middle">'
                     f'{esc(label)}</text>')
        self.add(f'<rect x="{LEFT}" y="{TOP}" width="{self.w}" height="{self.h}" fill="none" '
                 f'stroke="{GREY}"/>')
        self.add(f'<text x="{LEFT + self.w / 2:.1f}" y="{bottom + 30}" text-anchor="middle" '
                 f'fill="{GREY}">{esc(x_label)}</text>')
        self.add(f'<text x="14" y="{TOP + self.h / 2:.1f}" text-anchor="middle" fill="{GREY}" '
                 f'transform="rotate(-90 14 {TOP + self.h / 2:.1f})">{esc(y_label)}</text>')

    def svg(self, kind: str, note: str) -> str:
        head = (f'<svg class="chart chart-{esc(kind)}" xmlns="http://www.w3.org/2000/svg" '
                f'viewBox="0 0 {self.width} {self.height}" width="{self.width}" '
                f'height="{self.height}" role="img" aria-label="{esc(self.title)}">'
                f'<title>{esc(self.title)}</title>'
                f'<text x="{LEFT}" y="16" class="ctitle">{esc(self.title)}</text>')
        lines = _wrap(note, int((self.width - LEFT) / 5.6)) if note else []
        foot = "".join(f'<text x="{LEFT}" y="{self.height - 4 - 13 * (len(lines) - 1 - i)}" '
                       f'class="cnote">{esc(line)}</text>' for i, line in enumerate(lines))
        return head + "".join(self.parts) + foot + "</svg>"


def _wrap(text: str, width: int) -> list[str]:
    """`text` in lines of at most `width` characters (at spaces), two lines at most."""
    lines, line = [], ""
    for word in text.split(" "):
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    lines.append(line)
    if len(lines) > 2:
        lines = [lines[0], " ".join(lines[1:])]
    return lines


def _seconds(t0: int) -> Any:
    return lambda v: f"{v:.3g}"


def series_chart(series: dict[str, Any], *, kind: str, title: str, y_label: str,
                 y_fmt: Any, count: int | None = None, captured: tuple[int, str] | None = None,
                 regions: list[Region] | None = None, what: str = "value",
                 width: int = WIDTH) -> str:
    """Min/max bars of a Series (analysis.series, `to_dict`) over the process's time.

    Each bar spans the smallest and largest value of its time bucket, so downsampling
    never hides an extreme; the note under the chart says how many points each bar holds.
    `captured`: a dashed line at that value; `regions`: value bands shaded red, and the
    bars reaching into them drawn red.
    """
    regions = regions or []
    buckets = series["buckets"]
    t_first, t_last = buckets[0][0], max(series["t_last_ns"], buckets[-1][0])
    width_ns = series["bucket_ns"]
    lo = min(b[1] for b in buckets)
    hi = max(b[2] for b in buckets)
    if captured is not None:
        lo, hi = min(lo, captured[0]), max(hi, captured[0])
    for r in regions:  # a region's edge in view, so the shading shows where it begins
        if r.lo > 0 and r.lo <= hi * 4:
            hi = max(hi, r.lo)
            lo = min(lo, r.lo)
    plot = Plot(title, (t_first / 1e9, (t_last + width_ns) / 1e9), (lo, hi), width=width)
    plot.axes("seconds since the process started", y_label, _seconds(0), y_fmt)
    for r in regions:
        top = plot.y(r.hi) if r.hi is not None else TOP
        bottom = plot.y(r.lo)
        if bottom - top < 1:
            continue
        plot.add(f'<rect class="frozen-region" x="{LEFT}" y="{top:.1f}" width="{plot.w}" '
                 f'height="{bottom - top:.1f}" fill="{RED}" fill-opacity="0.10">'
                 f'<title>{esc(r.rule)}: {esc(r.label)}</title></rect>')
        label_y = bottom - 5 if bottom - top > 16 else top - 3
        plot.add(f'<text x="{LEFT + plot.w - 6}" y="{label_y:.1f}" text-anchor="end" '
                 f'fill="{RED}" class="rlabel">{esc(r.rule)}: {esc(r.label)}</text>')
    bar_w = max(4.0, width_ns / 1e9 / (plot.x1 - plot.x0) * plot.w)
    trend = " ".join(f"{plot.x(t / 1e9) + bar_w / 2:.1f},{plot.y(b_hi):.1f}"
                     for t, _lo, b_hi, _n in buckets)
    plot.add(f'<polyline points="{trend}" fill="none" stroke="{BLUE}" stroke-opacity="0.45" '
             'stroke-width="1"/>')
    bars: dict[str, list[str]] = {BLUE: [], RED: []}   # one path per colour: a small file
    for t, b_lo, b_hi, _n in buckets:
        x = plot.x(t / 1e9)
        y_top, y_bottom = plot.y(b_hi), plot.y(b_lo)
        if y_bottom - y_top < 4:
            y_top, y_bottom = y_top - 2, y_top + 2
        bad = any(r.holds(b_hi) or r.holds(b_lo) for r in regions)
        bars[RED if bad else BLUE].append(f"M{x:.1f} {y_top:.1f}h{bar_w:.1f}"
                                          f"v{y_bottom - y_top:.1f}h-{bar_w:.1f}z")
    for colour, cls in ((BLUE, "bars"), (RED, "bars frozen-bars")):
        if bars[colour]:
            plot.add(f'<path class="{cls}" fill="{colour}" d="{"".join(bars[colour])}"/>')
    if captured is not None:
        yy = plot.y(captured[0])
        plot.add(f'<line class="captured" x1="{LEFT}" x2="{LEFT + plot.w}" y1="{yy:.1f}" '
                 f'y2="{yy:.1f}" stroke="{INK}" stroke-width="1.5" stroke-dasharray="6 4"/>')
        label_y = yy - 5 if yy - 5 > TOP + 10 else yy + 14
        plot.add(f'<text x="{LEFT + 6}" y="{label_y:.1f}" class="caplabel">captured at '
                 f'{esc(y_fmt(captured[0]))}<title>{esc(captured[1])}</title></text>')
    points = series["points"]
    of = f" (of {count}: the others were not recorded)" if count and count > points else ""
    held = max(b[3] for b in buckets)
    if held > 1:
        note = (f"{points} {what}s{of} as {len(buckets)} bars, each the min..max of the "
                f"{what}s in a {duration(width_ns)} slice of the time axis (up to {held} a "
                "bar): downsampled, every extreme kept")
    else:
        note = f"{points} {what}s{of}, each one drawn (not downsampled)"
    if plot.log:
        note += "; log scale"
    return plot.svg(kind, note)


def histogram_chart(hist: list[list[int]], *, title: str, marks: dict[str, int] | None = None,
                    bins: int = 36, width: int = HALF,
                    x_label: str = "GPU time per replay") -> str:
    """Counts of GPU times per replay (`gpu_hist`: [[ns, count]], values rounded to 8
    significant bits), in log-spaced bins; `marks` (p50, p90, max) as vertical lines."""
    values = [(v, c) for v, c in hist if c > 0]
    if not values:
        return ""
    low, high = min(v for v, _ in values), max(v for v, _ in values)
    log_x = high >= 2 * max(low, 1)
    if log_x:
        a, b = math.log10(max(low, 1)), math.log10(high)
        edges = [10 ** (a + (b - a) * i / bins) for i in range(bins + 1)]
    else:
        span = max(high - low, 1)
        edges = [low + span * i / bins for i in range(bins + 1)]
    counts = [0] * bins
    for v, c in values:
        i = next((j for j in range(bins) if v < edges[j + 1]), bins - 1)
        counts[i] += c
    x_lo, x_hi = edges[0], edges[-1] if edges[-1] > edges[0] else edges[0] + 1
    plot = Plot(title, (0.0, 1.0), (0, max(counts)), log_y=False, width=width)

    def fx(v: float) -> float:
        if log_x:
            return (math.log10(max(v, 1)) - math.log10(max(x_lo, 1))) / \
                max(math.log10(x_hi) - math.log10(max(x_lo, 1)), 1e-12)
        return (v - x_lo) / (x_hi - x_lo)

    bottom = TOP + plot.h
    counted = nice_ticks(0, max(counts), 4, integer=True)   # replays: whole numbers
    for v, label in zip(counted, even_labels(counted, compact), strict=True):
        yy = plot.y(v)
        plot.add(f'<line x1="{LEFT}" x2="{LEFT + plot.w}" y1="{yy:.1f}" y2="{yy:.1f}" '
                 'stroke="#e2e8f0"/>')
        plot.add(f'<text x="{LEFT - 6}" y="{yy + 4:.1f}" text-anchor="end">{esc(label)}</text>')
    for i, c in enumerate(counts):
        if not c:
            continue
        x, x2 = plot.x(fx(edges[i])), plot.x(fx(edges[i + 1]))
        yy = plot.y(c)
        plot.add(f'<rect x="{x:.1f}" y="{yy:.1f}" width="{max(x2 - x - 1, 1):.1f}" '
                 f'height="{bottom - yy:.1f}" fill="{BLUE}"><title>{esc(duration(edges[i]))}..'
                 f'{esc(duration(edges[i + 1]))}: {c} replays</title></rect>')
    tick_values = _log_ticks(x_lo, x_hi) if log_x else nice_ticks(x_lo, x_hi, 5)
    if len(tick_values) < 2:   # a range within one 1-2-5 step: linear ticks inside it
        tick_values = [v for v in nice_ticks(x_lo, x_hi, 4) if x_lo <= v <= x_hi] \
            or [x_lo, x_hi]
    tick_labels = ([duration(v) for v in tick_values] if log_x
                   else even_labels(tick_values, duration))
    for v, label in zip(tick_values, tick_labels, strict=True):
        xx = plot.x(fx(v))
        anchor = ("end" if xx > LEFT + plot.w * 0.95 else
                  "start" if xx < LEFT + plot.w * 0.05 else "middle")
        plot.add(f'<text x="{xx:.1f}" y="{bottom + 16}" text-anchor="{anchor}">'
                 f'{esc(label)}</text>')
    for n, (name, v) in enumerate((marks or {}).items()):
        if not isinstance(v, (int, float)):
            continue
        xx = plot.x(fx(v))
        plot.add(f'<line class="pmark" x1="{xx:.1f}" x2="{xx:.1f}" y1="{TOP}" y2="{bottom}" '
                 f'stroke="{RED if name == "max" else INK}" stroke-dasharray="3 3"/>')
        right = xx > LEFT + plot.w * 0.6
        plot.add(f'<text x="{xx - 3 if right else xx + 3:.1f}" y="{TOP + 12 + 12 * n}" '
                 f'text-anchor="{"end" if right else "start"}" class="plabel">'
                 f'{esc(name)} {esc(duration(v))}</text>')
    plot.add(f'<rect x="{LEFT}" y="{TOP}" width="{plot.w}" height="{plot.h}" fill="none" '
             f'stroke="{GREY}"/>')
    plot.add(f'<text x="{LEFT + plot.w / 2:.1f}" y="{bottom + 30}" text-anchor="middle" '
             f'fill="{GREY}">{esc(x_label)}{" (log scale)" if log_x else ""}</text>')
    total = sum(counts)
    return plot.svg("gpu-hist", f"{total} timed replays in {bins} bins (times kept to 8 "
                                "significant bits, under 0.8% off)")
