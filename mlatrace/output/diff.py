"""`mlatrace diff A B`: topology-level differences between two traces (A -> B).

Capture units (root graphs) are matched by rank (processes without one: by their order),
batch-descriptor key and source (and their order among equals); kernels inside them by
name. Compared: split counts,
grids, stage 2 present/skipped, pointer stability, replay counts and lengths, GPU time
per replay (p50, p90, max; shown with the B/A ratio) when either trace timed replays,
and findings added/removed (matched by rule, rank, key, op).

Exit codes: 0 the diff was made (differences or not), 2 either trace is unusable.

`--json` prints schema `mlatrace.diff/1`:

    {"schema": "mlatrace.diff/1", "a": str, "b": str,
     "summary": {"matched": int, "changed": int, "only_a": int, "only_b": int,
                 "findings_added": int, "findings_removed": int},
     "graphs": [{"rank",                     # null for a process without a rank
                 "key", "src", "status": "changed"|"same"|"only_a"|"only_b",
                 "changes": [{"field": str, "a": value, "b": value}]}],
     # fields "gpu p50|p90|max ns" (values in ns) also carry "clock": [A's, B's], each
     # "gpu", "host" (a CPU host graph's host clock) or null
     # field num_kv_splits: the frozen split counts, or {"eager": [int]} for a breakable
     # capture that froze none: the counts its eager calls chose at run time
     "findings": {"added": [finding], "removed": [finding]},   # finding as in report --json
     # attention-like kernels (by short name, analysis/kernels.py) whose set of frozen
     # grids differs between A and B: [[x, y, z]] each side, [] where it is not captured
     "kernels": [{"kernel": str, "a": [[x, y, z]], "b": [[x, y, z]]}],
     "graph_use": {...}}     # graph use that changed (mlatrace.diff_graph_use)
"""

from __future__ import annotations

import json
import sys
from typing import Any

from mlatrace.analysis import Analysis, ConfigError
from mlatrace.analysis.kernels import kernel_view
from mlatrace.analysis.load import Unusable, load, resolve_config
from mlatrace.analysis.summary import units
from mlatrace.exitcodes import MlatraceError
from mlatrace.output.diff_graph_use import graph_use_diff, graph_use_diff_lines
from mlatrace.output.report import (
    gpu_time,
    make_console,
    plural,
    print_warnings,
    problems_of,
    rank_text,
)
from mlatrace.output.tables import Column, print_table

DIFF_SCHEMA = "mlatrace.diff/1"


def _rank_key(unit: dict, model: Any) -> tuple:
    """Match key of a unit's process: its rank when known, else its position among the
    processes without a rank (pids differ between runs)."""
    if unit["rank"] is not None:
        return (unit["rank"], -1)
    rankless = [p.pid for p in model.processes if p.rank is None]
    return (None, rankless.index(unit["pid"]) if unit["pid"] in rankless else -1)


def keyed_units(result: Analysis) -> dict[tuple, dict]:
    out: dict[tuple, dict] = {}
    for unit in units(result.model):
        base = (_rank_key(unit, result.model), str(unit["key"]), unit["src"])
        ordinal = 0
        while (*base, ordinal) in out:
            ordinal += 1
        out[(*base, ordinal)] = unit
    return out


def compare_units(a: dict, b: dict) -> list[dict]:
    """Field-by-field changes of one matched capture unit."""
    changes = []

    def cmp(field: str, va: Any, vb: Any) -> None:
        if va != vb:
            changes.append({"field": field, "a": va, "b": vb})

    fa, fb = a["frozen"], b["frozen"]
    cmp("num_kv_splits", splits_view(a), splits_view(b))
    cmp("stage2", fa["stage2"], fb["stage2"])
    for name in sorted(set(fa["kernels"]) | set(fb["kernels"])):
        ka, kb = fa["kernels"].get(name), fb["kernels"].get(name)
        if ka is None or kb is None:
            cmp(f"kernel {name}", "launched" if ka else None, "launched" if kb else None)
            continue
        cmp(f"{name} grid", ka["grids"], kb["grids"])
        cmp(f"{name} NUM_KV_SPLITS", ka["num_kv_splits"], kb["num_kv_splits"])
    cmp("graph nodes", fa["graph_nodes"], fb["graph_nodes"])
    cmp("mode", a["mode"], b["mode"])
    cmp("eager_breaks", a["eager_breaks"], b["eager_breaks"])
    cmp("capture seq_len_max", fa["capture_seq_len_max"], fb["capture_seq_len_max"])
    for name in sorted(set(fa["hints"]) | set(fb["hints"])):
        cmp(f"hint {name}", fa["hints"].get(name), fb["hints"].get(name))
    ra, rb = a["replays"], b["replays"]
    cmp("pointers at replay", _stable(ra["ptrs_stable"]), _stable(rb["ptrs_stable"]))
    cmp("replays", ra["count"], rb["count"])
    cmp("max replay seq_len", ra["seq_len_max"], rb["seq_len_max"])
    ga, gb = ra["gpu_ns"] or {}, rb["gpu_ns"] or {}
    for q in ("p50", "p90", "max"):
        if ga.get(q) is not None or gb.get(q) is not None:
            cmp(f"gpu {q} ns", ga.get(q), gb.get(q))
            if changes and changes[-1]["field"] == f"gpu {q} ns":
                changes[-1]["clock"] = [ra.get("timed_via"), rb.get("timed_via")]
    return changes


def splits_view(unit: dict) -> Any:
    """The split counts a unit runs with: frozen at capture, or, for a breakable capture
    that froze none, {"eager": [...]}: what its eager calls chose at run time."""
    frozen = unit["frozen"]["num_kv_splits"]
    runtime = (unit.get("runtime") or {}).get("num_kv_splits")
    if not frozen and runtime:
        return {"eager": runtime}
    return frozen


def _stable(value: bool | None) -> str | None:
    return None if value is None else ("stable" if value else "drift")


def diff_dict(a_path: str, a: Analysis, b_path: str, b: Analysis) -> dict[str, Any]:
    ua, ub = keyed_units(a), keyed_units(b)
    graphs = []
    for key in sorted(set(ua) | set(ub), key=lambda k: tuple(str(x) for x in k)):
        (rank, _position), gkey, src, _ordinal = key
        row = {"rank": rank, "key": None if gkey == "None" else gkey, "src": src}
        if key not in ub:
            graphs.append({**row, "status": "only_a", "changes": []})
        elif key not in ua:
            graphs.append({**row, "status": "only_b", "changes": []})
        else:
            changes = compare_units(ua[key], ub[key])
            graphs.append({**row, "status": "changed" if changes else "same", "changes": changes})
    sig_a = {f.signature(): f for f in a.findings}
    sig_b = {f.signature(): f for f in b.findings}
    added = [f.to_dict() for s, f in sig_b.items() if s not in sig_a]
    removed = [f.to_dict() for s, f in sig_a.items() if s not in sig_b]
    count = {s: sum(1 for g in graphs if g["status"] == s)
             for s in ("changed", "same", "only_a", "only_b")}
    return {
        "schema": DIFF_SCHEMA, "a": str(a_path), "b": str(b_path),
        "summary": {"matched": count["changed"] + count["same"], "changed": count["changed"],
                    "only_a": count["only_a"], "only_b": count["only_b"],
                    "findings_added": len(added), "findings_removed": len(removed)},
        "graphs": graphs,
        "findings": {"added": added, "removed": removed},
        "kernels": kernel_grids_diff(a, b),
        "graph_use": graph_use_diff(a.model, b.model),
    }


def kernel_grids_diff(a: Analysis, b: Analysis) -> list[dict[str, Any]]:
    """Attention-like kernels whose frozen grids differ between the two traces."""
    def grids(result: Analysis) -> dict[str, set]:
        out: dict[str, set] = {}
        for g in kernel_view(result.model, result.config.grid)["graphs"]:
            for k in g["attention"]:
                out.setdefault(k["short"], set()).add(tuple(k["grid"]))
        return out

    ga, gb = grids(a), grids(b)
    return [{"kernel": name, "a": [list(x) for x in sorted(ga.get(name, ()))],
             "b": [list(x) for x in sorted(gb.get(name, ()))]}
            for name in sorted(set(ga) | set(gb)) if ga.get(name) != gb.get(name)]


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, dict) and set(value) == {"eager"}:
        return f"{_fmt(value['eager'])} (chosen eagerly at run time)"
    if isinstance(value, list) and value and all(isinstance(v, int) for v in value) \
            and len(value) == 3:
        return "(" + ",".join(map(str, value)) + ")"  # a launch grid
    if isinstance(value, list):
        return ", ".join(_fmt(v) for v in value) if value else "[]"
    return str(value)


DIFF_COLUMNS = [
    Column("rank", priority=1, justify="right"),
    Column("graph key", wrap=True),
    Column("src", priority=2),
    Column("what", wrap=True),
    Column("A", wrap=True),
    Column("B", wrap=True),
]


def _ratio(a: Any, b: Any) -> str:
    """ " (x0.27)": B over A, for two positive numbers."""
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a > 0 \
            and not isinstance(a, bool) and not isinstance(b, bool):
        return f" (x{b / a:.3g})"
    return ""


def replay_time_label(quantile: str, clocks: list) -> str:
    """`replay GPU time p50`, or `replay host time (CPU host graph) p50` where the replays
    ran on the CPU host graph (the report's words; the value is shown in ms or us)."""
    names = {"host": "host time (CPU host graph)", "gpu": "GPU time"}
    seen = [names[c] for c in clocks if c in names]
    if len(set(seen)) > 1:
        return f"replay time {quantile} (A {seen[0]}, B {seen[1]})"
    return f"replay {seen[0] if seen else 'GPU time'} {quantile}"


def render(console: Any, data: dict[str, Any]) -> None:
    s = data["summary"]
    console.print(f"[bold]{plural(s['matched'], 'graph')} matched, {s['changed']} changed, "
                  f"{s['only_a']} only in A, {s['only_b']} only in B; findings: "
                  f"{s['findings_removed']} removed, {s['findings_added']} added[/]",
                  soft_wrap=True)
    console.print(f"A = {data['a']}\nB = {data['b']}", soft_wrap=True)
    rows = []
    for g in data["graphs"]:
        if g["status"] == "same":
            continue
        if g["status"] in ("only_a", "only_b"):
            rows.append([rank_text(g["rank"]), _fmt(g["key"]), _fmt(g["src"]), "captured",
                         "yes" if g["status"] == "only_a" else "-",
                         "yes" if g["status"] == "only_b" else "-"])
            continue
        for i, c in enumerate(g["changes"]):
            first = i == 0
            va, vb = _fmt(c["a"]), _fmt(c["b"])
            what = c["field"]
            if what.startswith("gpu "):
                va, vb = gpu_time(c["a"]), gpu_time(c["b"]) + _ratio(c["a"], c["b"])
                what = replay_time_label(what.split()[1], c.get("clock") or [])
            rows.append([rank_text(g["rank"]) if first else "", _fmt(g["key"]) if first else "",
                         _fmt(g["src"]) if first else "", what, va, vb])
    if rows:
        print_table(console, DIFF_COLUMNS, rows)
    for k in data.get("kernels", ()):
        console.print(f"kernel grids differ: {k['kernel']}: A {_fmt(k['a']) if k['a'] else '-'}"
                      f" -> B {_fmt(k['b']) if k['b'] else '-'}", soft_wrap=True,
                      highlight=False)
    for line in graph_use_diff_lines(data.get("graph_use") or {}):
        console.print(line, soft_wrap=True, highlight=False, markup=False)
    for label, colour, items in (("removed", "green", data["findings"]["removed"]),
                                 ("added", "red", data["findings"]["added"])):
        for f in items:
            console.print(f"[{colour}]{label}[/] {f['id']} {f['name']} (rank "
                          f"{rank_text(f['rank'])}): {f['message']}", soft_wrap=True)


def main(a: str, b: str, as_json: bool = False) -> int:
    """Print the differences A -> B; 0 when made, 2 when a trace is unusable.

    A and B are each a run: a trace directory, or a parent holding one run's host
    directories (of several runs there, the newest, as `report` says)."""
    err = make_console(stderr=True)
    results = []
    try:
        cfg = resolve_config(None)
        for path in (a, b):
            _trace, result = load(path, cfg)
            print_warnings(err, problems_of(result.model))
            results.append(result)
    except (Unusable, ConfigError) as exc:
        raise MlatraceError(f"error: {exc}") from None
    data = diff_dict(a, results[0], b, results[1])
    if as_json:
        sys.stdout.write(json.dumps(data, indent=1, default=str) + "\n")
    else:
        render(make_console(), data)
    return 0
