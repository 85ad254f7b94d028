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


GID_NOTE = ("gid 1>2-4: capture unit 1 (vLLM's wrapper graph, a breakable capture) encloses "
            "the torch graphs 2 to 4 it captured; the summary counts units (--json: graphs), "
            "graphs_total counts every graph")


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

