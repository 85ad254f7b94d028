"""Graph use as bars: per captured size the steps that replayed it, and the eager steps
beside them; per captured size the share of its replayed tokens that was padding
(`report --json` `graph_use.processes[]`, mlatrace.analysis.graph_use)."""

from __future__ import annotations

from typing import Any

from mlatrace.output.charts.svg import BLUE, GREY, HALF, LEFT, RED, TOP, Plot, compact, esc

MAX_BARS = 40       # sizes drawn per chart; the rest are in the table


def _bars(plot: Plot, labels: list[str], values: list[float], colours: list[str],
          tips: list[str], fmt: Any) -> None:
    bottom = TOP + plot.h
    n = max(len(values), 1)
    slot = plot.w / n
    for i, (label, value, colour, tip) in enumerate(zip(labels, values, colours, tips,
                                                        strict=True)):
        x = LEFT + i * slot + slot * 0.15
        y = plot.y(value)
        plot.add(f'<rect class="bar" x="{x:.1f}" y="{y:.1f}" width="{max(slot * 0.7, 1):.1f}" '
                 f'height="{max(bottom - y, 0):.1f}" fill="{colour}"><title>{esc(tip)}</title>'
                 "</rect>")
        if value:
            plot.add(f'<text x="{x + slot * 0.35:.1f}" y="{y - 3:.1f}" text-anchor="middle">'
                     f"{esc(fmt(value))}</text>")
        plot.add(f'<text x="{x + slot * 0.35:.1f}" y="{bottom + 16}" text-anchor="middle">'
                 f"{esc(label)}</text>")
    plot.add(f'<rect x="{LEFT}" y="{TOP}" width="{plot.w}" height="{plot.h}" fill="none" '
             f'stroke="{GREY}"/>')


def steps_chart(entry: dict[str, Any]) -> str:
    """Steps per captured size (blue: replayed; a size never replayed shows as 0) and the
    eager steps by reason (grey)."""
    sizes = entry["sizes"][:MAX_BARS]
    labels = [str(r["size"]) if r["size"] is not None else "?" for r in sizes]
    values = [float(r["steps"]) for r in sizes]
    colours = [BLUE] * len(sizes)
    tips = [f"size {label}: {r['steps']} steps, {len(r['captures'])} captures, "
            f"{r['replays']} replays" for label, r in zip(labels, sizes, strict=True)]
    for row in entry["eager_steps"]:
        labels.append("eager")
        values.append(float(row["steps"]))
        colours.append(GREY)
        tips.append(f"eager, {row['reason']}: {row['steps']} steps, real sizes "
                    f"{row['real_min']}..{row['real_max']}")
    if not values or not any(values):
        return ""
    plot = Plot(f"steps per captured size ({entry['file']})", (0.0, 1.0),
                (0, max(values)), log_y=False, width=HALF)
    _bars(plot, labels, values, colours, tips, lambda v: compact(v))
    plot.add(f'<text x="{LEFT + plot.w / 2:.1f}" y="{TOP + plot.h + 30}" text-anchor="middle" '
             f'fill="{GREY}">captured size (eager: no graph)</text>')
    return plot.svg("graph-steps", f"{entry['steps']} steps: {entry['replayed']} replayed a "
                                   f"graph, {entry['eager']} eager")


def padding_chart(entry: dict[str, Any]) -> str:
    """The share of each captured size's replayed tokens that was padding (red)."""
    sizes = [r for r in entry["sizes"] if r["padding_share"] is not None][:MAX_BARS]
    if not sizes:
        return ""
    labels = [str(r["size"]) for r in sizes]
    values = [100.0 * r["padding_share"] for r in sizes]
    tips = [f"size {r['size']}: real {r['real_min']}..{r['real_max']} (mean {r['real_mean']}), "
            f"{r['padding_tokens']} of {r['tokens']} tokens padding" for r in sizes]
    plot = Plot(f"padding per captured size ({entry['file']})", (0.0, 1.0), (0, 100),
                log_y=False, width=HALF)
    _bars(plot, labels, values, [RED] * len(sizes), tips, lambda v: f"{v:.0f}%")
    plot.add(f'<text x="{LEFT + plot.w / 2:.1f}" y="{TOP + plot.h + 30}" text-anchor="middle" '
             f'fill="{GREY}">captured size</text>')
    share = entry["padding_share"]
    return plot.svg("graph-padding", "padding = captured size - real size, as a share of the "
                                     "tokens each size replayed"
                    + (f"; all sizes: {share:.0%}" if share is not None else ""))
