"""Text pieces every output prints the same way: ranks, values, graph ids, GPU times, a
finding's cost line and a problem's `file:line: reason` (the text report, the HTML page,
`check` and `diff`)."""

from __future__ import annotations

from typing import Any

from mlatrace.common import plural


def rank_text(rank: Any) -> str:
    """A rank as every output prints it: its number, or '-' when the process has none."""
    return "-" if rank is None else str(rank)


def fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, list) and len(value) == 3 and all(isinstance(v, int) for v in value):
        return "(" + ",".join(map(str, value)) + ")"  # a launch grid
    if isinstance(value, list):
        return ",".join(fmt(v) for v in value) or "-"
    return str(value)


def hex_text(value: Any) -> str:
    return hex(value) if isinstance(value, int) else str(value)


def gid_text(gid: int, nested: list[int]) -> str:
    """`1>2-4,6`: capture unit 1 and the graphs nested in it (runs of ids shortened)."""
    if not nested:
        return str(gid)
    runs: list[list[int]] = []
    for n in sorted(nested):
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    parts = [str(r[0]) if len(r) == 1 else (f"{r[0]},{r[1]}" if len(r) == 2 else f"{r[0]}-{r[-1]}")
             for r in runs]
    return f"{gid}>{','.join(parts)}"


def gid_note(graphs: list[dict], total: int | None = None) -> str | None:
    """What `1>2` means, told with the trace's own first nested unit; None when no unit of
    the trace encloses another graph (nothing to explain)."""
    unit = next((g for g in graphs if g.get("nested_gids")), None)
    if unit is None:
        return None
    nested = unit["nested_gids"]
    inner = (f"the graph {nested[0]}" if len(nested) == 1 else
             f"the graphs {gid_text(unit['gid'], nested).partition('>')[2]}")
    what = " ".join(str(v) for v in (unit.get("src") or "?", unit.get("mode")) if v)
    breaks = unit.get("eager_breaks")
    if breaks:
        what += f", a breakable capture with {plural(breaks, 'eager break')}"
    counted = (f"; the summary counts {plural(len(graphs), 'capture unit')} (--json: graphs), "
               f"graphs_total {total} counts every graph" if total is not None else "")
    return (f"gid {gid_text(unit['gid'], nested)}: capture unit {unit['gid']} ({what}) "
            f"encloses {inner} it captured{counted}")


def units_note(kind: str, n: int, summary: dict[str, Any]) -> str:
    """` (1 capture unit, 1 nested)` after the capture records' count where graphs nest:
    a wrapper capture and the torch capture it triggers are 2 begins, 1 graph to a user."""
    if kind not in ("graph.capture.begin", "graph.capture.end"):
        return ""
    units, total = summary.get("graphs"), summary.get("graphs_total")
    if not isinstance(units, int) or not isinstance(total, int) or total <= units \
            or n != total:
        return ""
    return f" ({plural(units, 'capture unit')}, {total - units} nested)"


def gpu_time(ns: Any) -> str:
    """A GPU time in ns as a short string: us, ms, s, or minutes and seconds from a minute."""
    if not isinstance(ns, (int, float)) or isinstance(ns, bool):
        return "-"
    if ns >= 60e9:
        seconds = round(ns / 1e9)
        hours, minutes = divmod(seconds // 60, 60)
        return (f"{hours} h {minutes:02d} min" if hours
                else f"{minutes} min {seconds % 60:02d} s")
    if ns >= 1e9:
        return f"{ns / 1e9:.3g} s"
    return f"{ns / 1e6:.3g} ms" if ns >= 1e6 else f"{ns / 1e3:.3g} us"


def gpu_cell(gpu: dict | None) -> str:
    """p50 / p90 / max GPU time per replay, in one unit."""
    if not gpu:
        return "-"
    values = [gpu.get(q) for q in ("p50", "p90", "max")]
    if not all(isinstance(v, (int, float)) for v in values):
        return "-"
    scale, unit = (1e6, "ms") if max(values) >= 1e6 else (1e3, "us")
    return "/".join(f"{v / scale:.3g}" for v in values) + f" {unit}"


def cost_line(f: dict) -> str | None:
    """One line with what a finding's graph costs in GPU time (None when it has no cost)."""
    cost = f.get("cost")
    if not isinstance(cost, dict):
        return None
    replays = cost.get("replays")
    head = f"{f['id']} gid {fmt(f['gid'])}: " + (plural(replays, "replay")
                                                   if isinstance(replays, int) else f"{replays} replays")
    if not cost.get("timed"):
        return head + ", none timed (GPU time unknown: --replay-timing was off or no CUDA)"
    clock = "host time (CPU host graph)" if cost.get("timed_via") == "host" else "GPU"
    line = (f"{head}, {clock} per replay p50 {gpu_time(cost.get('replay_gpu_ns_p50'))}, "
            f"p90 {gpu_time(cost.get('replay_gpu_ns_p90'))}; about "
            f"{gpu_time(cost.get('total_gpu_ns'))} in all ({cost.get('timed')} timed)")
    est = cost.get("estimate")
    if isinstance(est, dict):
        line += f"; with the fix about {gpu_time(est.get('gpu_ns_p50'))} p50 ({est.get('how')})"
    return line


def problem_text(p: dict[str, Any]) -> str:
    """`file:line: reason`, or `file: reason` for a problem of a whole file."""
    where = f"{p['file']}:{p['line']}" if p.get("line") else str(p["file"])
    return f"{where}: {p['reason']}"

