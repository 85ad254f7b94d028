"""`mlatrace diff A B`: topology-level differences between two traces (A -> B).

Capture units (root graphs) are matched by rank, batch-descriptor key and source (and
their order among equals); kernels inside them by name. Compared: split counts,
grids, stage 2 present/skipped, pointer stability, replay counts and lengths, GPU-time
percentiles when present, and findings added/removed (matched by rule, rank, key, op).

Exit codes: 0 the diff was made (differences or not), 2 either trace is unusable.

`--json` prints schema `mlatrace.diff/1`:

    {"schema": "mlatrace.diff/1", "a": str, "b": str,
     "summary": {"matched": int, "changed": int, "only_a": int, "only_b": int,
                 "findings_added": int, "findings_removed": int},
     "graphs": [{"rank", "key", "src", "status": "changed"|"same"|"only_a"|"only_b",
                 "changes": [{"field": str, "a": value, "b": value}]}],
     "findings": {"added": [finding], "removed": [finding]}}   # finding as in report --json
"""

from __future__ import annotations

import json
import sys
from typing import Any

from mlatrace.analysis import Analysis, ConfigError
from mlatrace.analysis.summary import units
from mlatrace.report import Unusable, load, make_console, print_warnings, resolve_config

DIFF_SCHEMA = "mlatrace.diff/1"


def _rank_key(unit: dict, model: Any) -> Any:
    """Rank when known, else the process's position among rankless processes (stable)."""
    if unit["rank"] is not None:
        return unit["rank"]
    rankless = [p.pid for p in model.processes if p.rank is None]
    return f"proc{rankless.index(unit['pid'])}" if unit["pid"] in rankless else f"pid{unit['pid']}"


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
    cmp("num_kv_splits", fa["num_kv_splits"], fb["num_kv_splits"])
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
    for q in ("p50", "p99"):
        if ga.get(q) is not None or gb.get(q) is not None:
            cmp(f"gpu {q} ns", ga.get(q), gb.get(q))
    return changes


def _stable(value: bool | None) -> str | None:
    return None if value is None else ("stable" if value else "drift")


def diff_dict(a_path: str, a: Analysis, b_path: str, b: Analysis) -> dict[str, Any]:
    ua, ub = keyed_units(a), keyed_units(b)
    graphs = []
    for key in sorted(set(ua) | set(ub), key=lambda k: tuple(str(x) for x in k)):
        rank, gkey, src, _ordinal = key
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
    }


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, list) and value and all(isinstance(v, int) for v in value) \
            and len(value) == 3:
        return "(" + ",".join(map(str, value)) + ")"  # a launch grid
    if isinstance(value, list):
        return ", ".join(_fmt(v) for v in value) if value else "[]"
    return str(value)


def render(console: Any, data: dict[str, Any]) -> None:
    from rich.table import Table

    s = data["summary"]
    console.print(f"[bold]{s['matched']} graphs matched, {s['changed']} changed, "
                  f"{s['only_a']} only in A, {s['only_b']} only in B; findings: "
                  f"{s['findings_removed']} removed, {s['findings_added']} added[/]")
    console.print(f"A = {data['a']}\nB = {data['b']}")
    rows = [g for g in data["graphs"] if g["status"] != "same"]
    if rows:
        table = Table(show_edge=False)
        for col in ("rank", "graph key", "src", "what", "A", "B"):
            table.add_column(col, overflow="fold")
        for g in rows:
            if g["status"] in ("only_a", "only_b"):
                table.add_row(_fmt(g["rank"]), _fmt(g["key"]), _fmt(g["src"]), "captured",
                              "yes" if g["status"] == "only_a" else "-",
                              "yes" if g["status"] == "only_b" else "-")
                continue
            for i, c in enumerate(g["changes"]):
                first = i == 0
                table.add_row(_fmt(g["rank"]) if first else "", _fmt(g["key"]) if first else "",
                              _fmt(g["src"]) if first else "", c["field"], _fmt(c["a"]),
                              _fmt(c["b"]))
        console.print(table)
    for label, colour, items in (("removed", "green", data["findings"]["removed"]),
                                 ("added", "red", data["findings"]["added"])):
        for f in items:
            console.print(f"[{colour}]{label}[/] {f['id']} {f['name']} (rank {_fmt(f['rank'])}): "
                          f"{f['message']}")


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
            print_warnings(err, result.problems)
            results.append(result)
    except (Unusable, ConfigError) as exc:
        err.print(f"[red]error:[/] {exc}")
        return 2
    data = diff_dict(a, results[0], b, results[1])
    if as_json:
        sys.stdout.write(json.dumps(data, indent=1, default=str) + "\n")
    else:
        render(make_console(), data)
    return 0
