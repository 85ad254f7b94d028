"""A one-line chart of a unit's replay lengths over time, for the terminal report."""

from __future__ import annotations

import math
from typing import Any

from mlatrace.output.charts.regions import Region

LEVELS = "▁▂▃▄▅▆▇█"
LOG_FROM = 50   # a range whose max is this many times its min is drawn on a log scale


def scale(low: int, high: int) -> tuple[bool, Any]:
    """(log?, value -> 0..1) over [low, high]: log when the range spans LOG_FROM x or more."""
    low, high = min(low, high), max(low, high)
    if high <= low:
        return False, lambda v: 0.0
    if low >= 0 and high >= LOG_FROM * max(low, 1):
        a, b = math.log10(max(low, 1)), math.log10(high)
        return True, lambda v: (math.log10(max(v, 1)) - a) / (b - a) if b > a else 0.0
    return False, lambda v: (v - low) / (high - low)


def cells(series: dict[str, Any], width: int) -> list[tuple[int, int] | None]:
    """The series' buckets resampled to `width` cells over its time span: (min, max) of
    the points in each cell, None where no replay fell."""
    buckets = series.get("buckets") or []
    if not buckets:
        return []
    t0 = buckets[0][0]
    span = max(1, series.get("t_last_ns", buckets[-1][0]) - t0 + 1)
    width = max(1, min(width, series.get("points") or len(buckets)))
    out: list[tuple[int, int] | None] = [None] * width
    for t, lo, hi, _count in buckets:
        i = min(width - 1, (t - t0) * width // span)
        cur = out[i]
        out[i] = (lo, hi) if cur is None else (min(cur[0], lo), max(cur[1], hi))
    return out


def sparkline(series: dict[str, Any] | None, captured: int | None,
              regions: list[Region], width: int = 32) -> tuple[tuple[str, str], bool] | None:
    """((captured cell, rich markup of the replays' cells), log scale?): the series'
    per-cell maxima, the cells in a region red; the captured length takes part in the
    scale, so a graph frozen at 1 and replayed at 100K rises from the bottom. None
    without a series."""
    if not series or not series.get("buckets"):
        return None
    values = cells(series, width)
    lows = [c[0] for c in values if c is not None]
    highs = [c[1] for c in values if c is not None]
    low, high = min(lows), max(highs)
    if captured is not None:
        low, high = min(low, captured), max(high, captured)
    log, at = scale(low, high)

    def level(v: int) -> str:
        return LEVELS[min(len(LEVELS) - 1, int(at(v) * (len(LEVELS) - 1) + 0.5))]

    out = []
    for c in values:
        if c is None:
            out.append(" ")
            continue
        ch = level(c[1])
        out.append(f"[red]{ch}[/]" if any(r.holds(c[1]) for r in regions) else ch)
    return (level(captured) if captured is not None else "", "".join(out)), log


def sparkline_lines(data: dict[str, Any], limit: int | None = None,
                    far_factor: int = 8) -> list[str]:
    """`report`'s one line per capture unit with a length series (rich markup, trace text
    escaped): its replay lengths over time, against the length it was captured at; cells
    at lengths its findings say the frozen value is wrong for are red."""
    from rich.markup import escape

    from mlatrace.output.charts.regions import captured_length, regions_of, unit_findings

    lines = []
    for unit in data.get("graphs", []):
        series = (unit.get("replays") or {}).get("lengths")
        mine = unit_findings(unit, data.get("findings", []))
        captured = captured_length(unit, mine)
        regions = regions_of(mine, far_factor)
        drawn = sparkline(series, captured[0] if captured else None, regions)
        if drawn is None:
            continue
        spark, log = drawn
        rank = "" if unit.get("rank") is None else f"rank {unit['rank']} "
        key = "" if unit.get("key") is None else f" {unit['key']}"
        gid = unit["gid"]
        cap = (f"captured at {captured[0]} [{spark[0]}]" if captured
               else "capture length unknown")
        red = ("; red: " + ", ".join(sorted({r.rule for r in regions}))) if regions else ""
        lines.append(f"  {escape(f'{rank}gid {gid}{key}')}: {escape(cap)}, replayed "
                     f"▕{spark[1]}▏ {series['min']}..{series['max']} "
                     f"({'log scale, ' if log else ''}max per cell{red})")
        if limit is not None and len(lines) >= limit:
            break
    return lines
