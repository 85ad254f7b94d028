"""The HTML report's "Graph use" section: per process the steps per captured size and the
padding they carried (bars, mlatrace.charts.graph_use), the eager steps and why, and the
captures never replayed, from `report_dict(...)["graph_use"]`."""

from __future__ import annotations

from typing import Any

from mlatrace.output.charts.graph_use import padding_chart, steps_chart
from mlatrace.output.charts.svg import esc
from mlatrace.output.report_graph_use import mem_text, num_text, span_text

MAX_PROCESSES = 16
MAX_ROWS = 64


def _cell(value: Any) -> str:
    return "-" if value is None else esc(value)


def _pct(share: Any) -> str:
    return "-" if share is None else f"{share:.0%}"


def _mem(nbytes: Any) -> str:
    return "-" if nbytes is None else esc(mem_text(nbytes))


def _held(never: dict[str, Any]) -> str:
    """`, 1.2 GiB for 40 min` of a capture never replayed, where its memory was measured."""
    if never.get("pool_bytes") is None:
        return ""
    held = f" for {span_text(never['held_s'])}" if never.get("held_s") is not None else ""
    return f", {esc(mem_text(never['pool_bytes']))}{esc(held)}"


def _process(entry: dict[str, Any]) -> str:
    head = (f"{esc(entry['file'])} (rank {_cell(entry['rank'])}): {entry['steps']} steps, "
            f"{entry['replayed']} replayed a graph, {entry['eager']} eager; eager decode "
            f"steps {entry['decode_eager']} of {entry['decode_steps']} "
            f"({_pct(entry['eager_share'])})")
    if entry["padding_share"] is not None:
        head += (f"; padding {entry['padding_tokens']} of {entry['replayed_tokens']} replayed "
                 f"tokens ({_pct(entry['padding_share'])})")
    if not entry["graphs_on"]:
        head += "; graphs off"
    rows = []
    for r in entry["sizes"][:MAX_ROWS]:
        real = "-" if r["real_min"] is None else (
            f"{r['real_min']}" if r["real_min"] == r["real_max"]
            else f"{r['real_min']}..{r['real_max']} (mean {r['real_mean']:g})")
        rows.append(f"<tr><td class=\"num\">{_cell(r['size'])}</td>"
                    f"<td>{esc('/'.join(r['modes']) or '-')}</td>"
                    f"<td class=\"num\">{len(r['captures'])}</td>"
                    f"<td class=\"num\">{r['steps']}</td><td>{esc(real)}</td>"
                    f"<td class=\"num\">{_cell(r['padding_tokens'])}</td>"
                    f"<td class=\"num\">{_pct(r['padding_share'])}</td>"
                    f"<td class=\"num\">{_mem(r.get('pool_bytes'))}</td></tr>")
    table = ("<table class=\"graph-use\"><tr><th>captured size</th><th>mode</th>"
             "<th>captures</th><th>steps</th><th>real sizes</th><th>padding tokens</th>"
             "<th>padding</th><th>memory captured</th></tr>" + "".join(rows) + "</table>")
    if len(entry["sizes"]) > MAX_ROWS:
        table += f"<p class=\"sub\">{len(entry['sizes']) - MAX_ROWS} more sizes: --json</p>"
    eager = "".join(
        f"<li>{row['steps']} eager steps ({row['decode_steps']} decode): {esc(row['reason'])}"
        + ("" if row["real_min"] is None else f", real sizes {row['real_min']}..{row['real_max']}")
        + "</li>" for row in entry["eager_steps"])
    never = ", ".join(f"gid {g['gid']} (size {_cell(g['size'])}{_held(g)})"
                      for g in entry["never_replayed"][:MAX_ROWS])
    extra = ""
    if eager:
        extra += f"<ul>{eager}</ul>"
    if never:
        total = entry.get("never_replayed_gib_s")
        extra += (f"<p>Captured, never replayed: {never}"
                  + (f"; {num_text(total)} GiB*s held in all" if total else "") + "</p>")
    for b in entry["breakable"][:MAX_ROWS]:
        extra += (f"<p>Breakable gid {b['gid']}: {b['eager_pieces']} eager pieces "
                  f"({b['eager_breaks']} per replay x {b['replays']} replays)</p>")
    charts = steps_chart(entry) + padding_chart(entry)
    return (f'<div class="graph"><h3>{head}</h3><div class="charts">{charts}</div>'
            f"{table}{extra}</div>")


def graph_use_section(data: dict[str, Any]) -> str:
    """The section, or nothing when no process captured or dispatched."""
    view = data.get("graph_use") or {}
    processes = view.get("processes") or []
    if not processes:
        return ""
    parts = ['<section id="graph-use"><h2>Graph use: steps per captured size, padding, '
             "eager steps</h2>"]
    parts += [_process(entry) for entry in processes[:MAX_PROCESSES]]
    if len(processes) > MAX_PROCESSES:
        parts.append(f'<p class="sub">{len(processes) - MAX_PROCESSES} more processes: '
                     "report --json has them</p>")
    return "".join(parts) + "</section>"
