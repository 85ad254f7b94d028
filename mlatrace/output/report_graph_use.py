"""The "graph use" section of the text report: per process, one line per captured size (its
steps, real sizes and padding) and per reason steps ran eagerly, at most MAX_LINES lines
each, the rest summarised (`report --json`'s `graph_use` has them all)."""

from __future__ import annotations

from typing import Any

from mlatrace.common import plural
from mlatrace.output.report_text import rank_text
from mlatrace.output.tables import print_line

MAX_LINES = 10          # bucket lines per process
MAX_PROCESSES = 4       # processes shown; the rest in one line


def _pct(share: Any) -> str:
    return "-" if share is None else f"{share:.0%}"


def _real(row: dict[str, Any]) -> str:
    lo, hi = row.get("real_min"), row.get("real_max")
    if lo is None:
        return "real sizes unknown"
    text = f"real {lo}" if lo == hi else f"real {lo}..{hi}"
    if row.get("real_mean") is not None and lo != hi:
        text += f" (mean {row['real_mean']:g})"
    return text


def size_line(row: dict[str, Any]) -> str:
    """One captured size: its steps (or that it never replayed), real sizes, padding."""
    modes = " " + "/".join(row["modes"]) if row["modes"] else ""
    captures = len(row["captures"])
    if row["size"] is None and captures == 1:   # a capture whose key names no size
        head = f"gid {row['captures'][0]['gid']} (no size in its key){modes}"
    else:
        head = f"size {row['size'] if row['size'] is not None else '?'}{modes}"
    if captures > 1:
        head += f" ({captures} captures)"
    if not row["steps"] and not row["replays"]:
        return f"{head}: never replayed" if captures else f"{head}: no capture"
    text = f"{head}: {plural(row['steps'], 'step')}"
    if not captures:
        text += " (dispatched, no capture of it recorded)"
    if row["padding_tokens"] is not None:
        text += (f", {_real(row)}, padding {row['padding_tokens']} tokens "
                 f"({_pct(row['padding_share'])})")
    return text


def mem_text(nbytes: int) -> str:
    """Bytes in the unit that reads best: 512 KiB, 40 MiB, 1.2 GiB."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= size:
            value = nbytes / size
            return f"{value:.1f} {unit}" if value < 10 else f"{value:.0f} {unit}"
    return f"{nbytes} B"


def span_text(seconds: float) -> str:
    """A duration as 45 s, 40 min or 3.5 h."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _capture_name(row: dict[str, Any]) -> str:
    key = row.get("key")
    if key is None:
        return f"gid {row['gid']}"
    text = str(key)
    return f"gid {row['gid']} (key {text if len(text) <= 40 else text[:37] + '...'})"


def never_held_line(entry: dict[str, Any]) -> str | None:
    """The captures never replayed whose memory was measured: what each held and for how
    long (the two holding most), and the memory-time in all; None when none was measured."""
    never = [n for n in entry.get("never_replayed") or () if n.get("pool_bytes") is not None]
    if not never:
        return None
    parts = []
    for n in sorted(never, key=lambda n: (-(n.get("gib_s") or 0), -n["pool_bytes"]))[:2]:
        if not n["pool_bytes"]:
            parts.append(f"{_capture_name(n)} added no memory"
                         + (" (a shared pool)" if n.get("pool_shared") else ""))
            continue
        held = f" for {span_text(n['held_s'])}" if n.get("held_s") is not None else ""
        parts.append(f"{_capture_name(n)} held {mem_text(n['pool_bytes'])}{held}")
    if len(never) > 2:
        parts.append(f"{len(never) - 2} more")
    text = "never replayed: " + "; ".join(parts)
    total = entry.get("never_replayed_gib_s")
    memory_time = f"{num_text(total)} GiB*s" if total else None
    if len(never) > 1:
        text += (f" ({mem_text(entry['never_replayed_pool_bytes'])} in all"
                 + (f", {memory_time}" if memory_time else "") + ")")
    elif memory_time:
        text += f" ({memory_time})"
    return text


def num_text(value: float) -> str:
    """A positive quantity to about three digits: 1260, 60, 2.54, 0.029."""
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}" if value >= 1 else f"{value:.2g}"


def eager_line(row: dict[str, Any], largest: Any) -> str:
    reason = row["reason"]
    if reason == "above largest capture":
        reason = f"above the largest capture ({largest})"
    sizes = ("" if row["real_min"] is None else f", real {row['real_min']}" if
             row["real_min"] == row["real_max"] else f", real {row['real_min']}..{row['real_max']}")
    decode = "" if row["decode_steps"] == row["steps"] else f" ({row['decode_steps']} decode)"
    return f"eager: {plural(row['steps'], 'step')}{decode}, {reason}{sizes}"


def process_lines(entry: dict[str, Any]) -> list[str]:
    """The head line of one process and its bucket lines (at most MAX_LINES, then a sum)."""
    who = f"{entry['file']} (rank {rank_text(entry['rank'])})" if entry["rank"] is not None \
        else entry["file"]
    head = f"{who}: {plural(entry['steps'], 'step')}"
    if entry["steps_from"] == "dispatch":
        head += (f", {entry['replayed']} replayed a graph, {entry['eager']} eager; eager "
                 f"decode steps {entry['decode_eager']} of {entry['decode_steps']} "
                 f"({_pct(entry['eager_share'])})")
    else:
        head += " (replays of its captures: no dispatch probed)"
    if not entry["graphs_on"]:
        head += "; graphs off (nothing captured)"
    if entry["padding_share"] is not None:
        head += (f"; padding {entry['padding_tokens']} of {entry['replayed_tokens']} replayed "
                 f"tokens ({_pct(entry['padding_share'])})")
    lines = [eager_line(r, entry["largest_captured"]) for r in entry["eager_steps"]]
    held = never_held_line(entry)
    if held:
        lines.append(held)
    breakable = entry["breakable"]
    if len(breakable) > 3:
        lines.append(f"{len(breakable)} breakable captures: "
                     f"{sum(b['eager_pieces'] for b in breakable)} eager pieces run")
    else:
        lines += [f"breakable gid {b['gid']}: {b['eager_pieces']} eager pieces "
                  f"({b['eager_breaks']} per replay x {b['replays']} replays)"
                  for b in breakable]
    sizes = entry["sizes"]
    room = max(MAX_LINES - len(lines), 2)
    if len(sizes) > room:    # the sizes with the most steps, in size order; the rest summed
        kept_ids = {id(r) for r in sorted(sizes, key=lambda r: -r["steps"])[:room - 1]}
        kept = [r for r in sizes if id(r) in kept_ids]
        rest = [r for r in sizes if id(r) not in kept_ids]
        never = sum(1 for r in rest if not r["steps"] and not r["replays"] and r["captures"])
        summary = (f"... {plural(len(rest), 'more size')}: {plural(sum(r['steps'] for r in rest), 'step')}"
                   + (f", {never} never replayed" if never else "") + " (--json has them all)")
        lines = [size_line(r) for r in kept] + [summary] + lines
    else:
        lines = [size_line(r) for r in sizes] + lines
    return [head] + ["  " + line for line in lines]


def graph_use_lines(view: dict[str, Any]) -> list[str]:
    """The section's lines (empty when no process captured or dispatched)."""
    processes = view.get("processes") or []
    if not processes:
        return []
    out = ["graph use (steps by captured size; padding = captured size - real size):"]
    for entry in processes[:MAX_PROCESSES]:
        out += ["  " + line for line in process_lines(entry)]
    if len(processes) > MAX_PROCESSES:
        rest = processes[MAX_PROCESSES:]
        out.append(f"  ... {plural(len(rest), 'more process', 'more processes')} "
                   f"({plural(sum(p['steps'] for p in rest), 'step')}): --json has them")
    return out


def render_graph_use(console: Any, data: dict[str, Any], verbose: bool = False) -> None:
    """Print the section (report's text output)."""
    from rich.markup import escape

    for line in graph_use_lines(data.get("graph_use") or {}):
        print_line(console, escape(line), hang=4)
