"""`diff`'s graph-use part: A's and B's graph use side by side (mlatrace.analysis.graph_use):
the run's totals, then per captured size (over the run's processes) its steps and padding,
and the eager steps by reason.

`--json` (`mlatrace.diff/1`) `graph_use`:

    {"totals": [{"field", "a", "b"}],      # steps, replayed, eager, decode_eager,
                                           # eager_share, padding_share, captures,
                                           # never_replayed: the changed ones
     "sizes": [{"size", "a": {"steps", "padding_share", "captures"}|null,
                "b": {...}|null}],          # sizes whose steps, padding or captures changed
     "eager": [{"reason", "a": int, "b": int}]}   # eager steps by reason, where they differ
"""

from __future__ import annotations

from typing import Any

from mlatrace.analysis.graph_use import graph_use
from mlatrace.common import plural

TOTALS = ("steps", "replayed", "eager", "decode_eager", "eager_share", "padding_share",
          "captures", "never_replayed")
MAX_LINES = 12


def _by_size(view: dict[str, Any]) -> dict[Any, dict[str, Any]]:
    out: dict[Any, dict[str, Any]] = {}
    for proc in view["processes"]:
        for row in proc["sizes"]:
            entry = out.setdefault(row["size"], {"steps": 0, "captures": 0, "_tokens": 0,
                                                 "_padding": 0, "padding_share": None})
            entry["steps"] += row["steps"]
            entry["captures"] += len(row["captures"])
            if row["padding_tokens"] is not None:
                entry["_tokens"] += row["tokens"]
                entry["_padding"] += row["padding_tokens"]
    for entry in out.values():
        tokens, padding = entry.pop("_tokens"), entry.pop("_padding")
        entry["padding_share"] = round(padding / tokens, 4) if tokens else None
    return out


def _eager(view: dict[str, Any]) -> dict[str, int]:
    out: dict[str, int] = {}
    for proc in view["processes"]:
        for row in proc["eager_steps"]:
            out[row["reason"]] = out.get(row["reason"], 0) + row["steps"]
    return out


def graph_use_diff(model_a: Any, model_b: Any) -> dict[str, Any]:
    """What changed in graph use from A to B."""
    va, vb = graph_use(model_a), graph_use(model_b)
    totals = [{"field": name, "a": va["run"][name], "b": vb["run"][name]} for name in TOTALS
              if va["run"][name] != vb["run"][name]]
    sa, sb = _by_size(va), _by_size(vb)
    sizes = [{"size": size, "a": sa.get(size), "b": sb.get(size)}
             for size in sorted(set(sa) | set(sb), key=lambda s: (s is None, s or 0))
             if sa.get(size) != sb.get(size)]
    ea, eb = _eager(va), _eager(vb)
    eager = [{"reason": r, "a": ea.get(r, 0), "b": eb.get(r, 0)}
             for r in sorted(set(ea) | set(eb)) if ea.get(r, 0) != eb.get(r, 0)]
    return {"totals": totals, "sizes": sizes, "eager": eager}


def _value(value: Any, share: bool) -> str:
    if value is None:
        return "-"
    return f"{value:.1%}" if share else str(value)


def _size(entry: dict[str, Any] | None) -> str:
    if entry is None:
        return "not captured or dispatched"
    text = plural(entry["steps"], "step")
    if entry["padding_share"] is not None:
        text += f", padding {entry['padding_share']:.0%}"
    return text


def graph_use_diff_lines(data: dict[str, Any]) -> list[str]:
    """The diff's text lines for graph use (none when nothing changed)."""
    if not data or not (data["totals"] or data["sizes"] or data["eager"]):
        return []
    lines = ["graph use A -> B:"]
    if data["totals"]:
        lines.append("  " + ", ".join(
            f"{t['field']} {_value(t['a'], t['field'].endswith('share'))} -> "
            f"{_value(t['b'], t['field'].endswith('share'))}" for t in data["totals"]))
    rows = [f"  size {s['size'] if s['size'] is not None else '?'}: {_size(s['a'])} -> "
            f"{_size(s['b'])}" for s in data["sizes"]]
    rows += [f"  eager ({e['reason']}): {e['a']} -> {e['b']} steps" for e in data["eager"]]
    if len(rows) > MAX_LINES:
        rows = rows[:MAX_LINES - 1] + [f"  ... {len(rows) - MAX_LINES + 1} more: --json"]
    return lines + rows
