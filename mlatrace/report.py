"""`mlatrace report TRACE`: what capture froze, what replays needed, and the findings.

Exit codes: 0 a report was made (findings or not; `check` gives verdicts), 2 the trace
is unreadable or holds nothing usable (bad --config too).

`--json` prints one object, schema `mlatrace.report/1` (stable: fields are only added):

    {
      "schema": "mlatrace.report/1",
      "trace": str,                          # the trace directory
      "summary": {"processes": int, "graphs": int,      # capture units (root graphs)
                  "graphs_total": int,                  # incl. nested torch graphs
                  "replays": int,                       # steps (nested replays counted once)
                  "findings": {"error": int, "warning": int},
                  "suppressed": int, "problems": int,
                  "probes_attached": int|null,          # distinct probes with a patched
                                                        # target (null: not recorded)
                  "probes_errored": int,                # distinct probes with a probe.error
                  "blind": bool},                       # coverage.blind
      "processes": [{"file", "pid", "ppid", "rank", "root", "world_size", "role", "argv",
                     "schema", "records", "dropped", "gaps", "end_reason"}],
      "graphs": [{"pid", "rank", "file", "gid", "nested_gids": [int], "src", "key", "mode",
                  "segments", "eager_breaks", "capture_seq",
                  "frozen": {"num_kv_splits": [int], "stage2": "present"|"skipped"|null,
                             "kernels": {name: {"grids": [[x, y, z]], "num_kv_splits": [int]}},
                             "hints": {name: value}, "ops": [str], "ptrs": {name: int},
                             "graph_nodes": int, "capture_seq_len_max": int|null},
                  "replays": {"count": int, "seq_len_max": int|null, "seq_len_min": int|null,
                              "ptrs_stable": bool|null,
                              "gpu_ns": {"p50", "p90", "p99", "max", "samples"}|null}}],
      "attention": [{"file", "pid", "rank", "kind": "attn.call"|"attn.metadata",
                     "name",                 # the op (forward_mqa, ...) or the backend
                     "count", "captured", "eager", "layers",   # distinct layer names
                     "seq_len_min", "seq_len_max", "first": {"file", "seq"}}],
      "findings": [{"id", "name", "severity", "message", "hint", "pid", "rank", "gid",
                    "evidence": [{"file", "seq", "kind", "what"}], "details": {...}}],
      "suppressed": [same as findings],      # matched by the config's allow-list
      "problems": [{"file", "line", "reason"}],
      "coverage": {                          # what the probes saw (analysis/coverage.py)
        "blind": bool, "reasons": [str],     # why the trace cannot support a clean verdict
        "probes_attached": int|null, "probes_errored": int,
        "engines": {name: version},          # probed engines named in the headers
        "ranks": {"world_size": int|null, "seen": [int], "kept": [int]|null,
                  "missing": [int]},
        "expect": [{"what", "kinds": [str], "records": int, "met": bool}],
        "records": {kind: int},              # records per kind, whole run
        "probe_errors": [{"file", "seq", "probe", "target", "reason", "error"}],
        "processes": [{"file", "pid", "rank",
                       "recorded": bool,     # process.end carried coverage (newer traces)
                       "ended": bool,        # the process wrote its process.end
                       "packs": [str], "packs_attached": [str]|null,
                       "packs_skipped": {pack: why},
                       "targets": {"patched": int, "not_imported": int, "inherited": int,
                                   "missing": [str], "drifted": [str], "failed": [str]},
                       "hits": {probe: int}, "records": {kind: int},
                       "probe_errors": int}]
      }
    }
"""

from __future__ import annotations

import json
import sys
from typing import Any

from mlatrace.analysis import Analysis, Config, ConfigError, analyze, load_config
from mlatrace.analysis.summary import root_graphs, units

REPORT_SCHEMA = "mlatrace.report/1"
MAX_GRAPH_ROWS = 20


class Unusable(Exception):
    """The trace cannot be opened or has no readable record at all (exit 2)."""


def load(trace_path: str, config: Config | None = None,
         rules: list[str] | None = None) -> tuple[Any, Analysis]:
    """Open and analyse a trace; Unusable when nothing in it can be used."""
    from mlatrace.trace import TraceError, open_trace

    try:
        trace = open_trace(trace_path)
    except TraceError as exc:
        raise Unusable(str(exc)) from exc
    except OSError as exc:
        raise Unusable(f"{trace_path}: {exc.strerror or exc}") from exc
    result = analyze(trace, config, rules)
    if not any(p.records for p in result.model.processes):
        reasons = "; ".join(str(p) for p in trace.problems[:5])
        raise Unusable(f"{trace_path}: no usable records" + (f" ({reasons})" if reasons else ""))
    return trace, result


def resolve_config(config_path: str | None, trace_path: str | None = None,
                   expect: list[str] | None = None) -> Config:
    """--config FILE, else mlatrace.toml / pyproject.toml [tool.mlatrace] in the cwd;
    `expect` (--expect) adds to the config's expectations (ConfigError when unknown)."""
    cfg = load_config(config_path) if config_path else load_config(None)
    if expect:
        from dataclasses import replace

        from mlatrace.analysis import ExpectError
        from mlatrace.analysis.coverage import expect_kinds

        for what in expect:
            try:
                expect_kinds(what)
            except ExpectError as exc:
                raise ConfigError(f"--expect: {exc}") from None
        cfg = replace(cfg, expect=[*cfg.expect, *(e for e in expect if e not in cfg.expect)])
    return cfg


def report_dict(trace_path: str, result: Analysis) -> dict[str, Any]:
    model = result.model
    counts = result.counts()
    coverage = result.coverage
    return {
        "schema": REPORT_SCHEMA,
        "trace": str(trace_path),
        "summary": {
            "processes": len(model.processes),
            "graphs": len(root_graphs(model)),
            "graphs_total": len(model.graphs),
            "replays": model.total_replays(),
            "findings": counts,
            "suppressed": len(result.suppressed),
            "problems": len(model.problems),
            "probes_attached": coverage.probes_attached,
            "probes_errored": coverage.probes_errored,
            "blind": coverage.blind,
        },
        "processes": [{
            "file": p.file, "pid": p.pid, "ppid": p.ppid, "rank": p.rank,
            "root": p.ppid not in {q.pid for q in model.processes},
            "world_size": p.world_size, "role": p.role, "argv": p.argv, "schema": p.schema,
            "records": p.records, "dropped": p.dropped, "gaps": p.gaps,
            "end_reason": (p.end or {}).get("reason"),
        } for p in model.processes],
        "graphs": units(model),
        "attention": [{
            "file": p.file, "pid": p.pid, "rank": p.rank, "kind": a.kind, "name": a.name,
            "count": a.count, "captured": a.captured, "eager": a.count - a.captured,
            "layers": len(a.layers), "seq_len_min": a.seq_len_min, "seq_len_max": a.seq_len_max,
            "first": {"file": a.first.file, "seq": a.first.seq},
        } for p in model.processes for a in p.attention.values()],
        "findings": [f.to_dict() for f in result.findings],
        "suppressed": [f.to_dict() for f in result.suppressed],
        "problems": [{"file": p.file, "line": p.line, "reason": p.reason} for p in model.problems],
        "coverage": coverage.to_dict(),
    }


def summary_line(data: dict[str, Any]) -> str:
    s = data["summary"]
    parts = [_plural(s["processes"], "process", "processes"),
             _plural(s["graphs"], "graph") + " captured",
             _plural(s["replays"], "replay")]
    errors, warnings = s["findings"]["error"], s["findings"]["warning"]
    if errors or warnings:
        if errors:
            parts.append(_plural(errors, "error finding"))
        if warnings:
            parts.append(_plural(warnings, "warning finding"))
    else:
        parts.append("no findings")
    if s["problems"]:
        parts.append(_plural(s["problems"], "problem"))
    attached, errored = s.get("probes_attached"), s.get("probes_errored", 0)
    if attached is None:
        parts.append("probe coverage not recorded"
                     + (f", {_plural(errored, 'probe')} errored" if errored else ""))
    else:
        parts.append(f"{_plural(attached, 'probe')} attached, {errored} errored")
    if s.get("blind"):
        parts.append("BLIND")
    return ", ".join(parts)


def _plural(n: int, word: str, plural: str | None = None) -> str:
    return f"{n} {word if n == 1 else (plural or word + 's')}"


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, list) and len(value) == 3 and all(isinstance(v, int) for v in value):
        return "(" + ",".join(map(str, value)) + ")"  # a launch grid
    if isinstance(value, list):
        return ",".join(_fmt(v) for v in value) or "-"
    return str(value)


def _hex(value: Any) -> str:
    return hex(value) if isinstance(value, int) else str(value)


def _ms(ns: int | None) -> str:
    return "-" if ns is None else f"{ns / 1e6:.3g} ms"


def _quiet(proc: dict, graphs: list[dict]) -> bool:
    """A process that recorded nothing but its header and end (compile workers, trackers)."""
    return proc["records"] <= 2 and not proc["dropped"] and not proc["root"] and \
        not any(g["pid"] == proc["pid"] for g in graphs)


def graph_rows(graphs: list[dict]) -> list[tuple[list, list[str]]]:
    """Table rows of capture units; ranks whose units look the same share one row (TP)."""
    rows: dict[tuple, list] = {}
    for g in sorted(graphs, key=lambda g: (g["gid"], g["rank"] if g["rank"] is not None else -1,
                                           g["pid"] or 0)):
        frozen, rep = g["frozen"], g["replays"]
        stage1 = next((k for k in frozen["kernels"] if "stage1" in k.lower()
                       or "stage_1" in k.lower()), None)
        grid = frozen["kernels"][stage1]["grids"] if stage1 else None
        ptrs = {None: "-", True: "stable", False: "[red]drift[/]"}[rep["ptrs_stable"]]
        gids = str(g["gid"]) + ("" if not g["nested_gids"] else
                                ">" + ",".join(map(str, g["nested_gids"])))
        gpu = rep["gpu_ns"]["p50"] if rep["gpu_ns"] else None
        cells = (gids, _fmt(g["src"]), _fmt(g["key"]), _fmt(g["mode"]),
                 _fmt(frozen["capture_seq_len_max"]), _fmt(frozen["num_kv_splits"]),
                 _fmt(grid[0] if grid and len(grid) == 1 else grid), _fmt(frozen["stage2"]),
                 str(rep["count"]), _fmt(rep["seq_len_max"]), ptrs, _ms(gpu))
        rows.setdefault(cells, []).append(g["rank"] if g["rank"] is not None else f"pid {g['pid']}")
    return [(ranks, list(cells)) for cells, ranks in rows.items()]


def group_findings(findings: list[dict]) -> list[dict]:
    """Findings with the same id and message (e.g. one per TP rank) shown as one row."""
    groups: dict[tuple, dict] = {}
    for f in findings:
        key = (f["id"], f["message"])
        group = groups.setdefault(key, {**f, "count": 0, "ranks": [], "pids": []})
        group["count"] += 1
        if f["rank"] not in group["ranks"]:
            group["ranks"].append(f["rank"])
        group["pids"].append(f["pid"])
    return list(groups.values())


def print_warnings(console: Any, problems: list) -> None:
    for p in problems[:50]:
        console.print(f"[yellow]warning:[/] {p.file}:{p.line}: {p.reason}", highlight=False)
    if len(problems) > 50:
        console.print(f"[yellow]warning:[/] ... {len(problems) - 50} more problems", highlight=False)


def render(console: Any, data: dict[str, Any], problems: list, verbose: bool) -> None:
    """The human report: summary line, warnings, then one table per section (rich)."""
    render_summary(console, data, problems)
    render_coverage(console, data, verbose)
    render_processes(console, data, verbose)
    render_graphs(console, data, verbose)
    render_attention(console, data)
    render_findings(console, data, verbose)


def render_summary(console: Any, data: dict[str, Any], problems: list) -> None:
    """The summary line, the reader's problems and per-process data-loss warnings."""
    errors = data["summary"]["findings"]["error"]
    style = "bold red" if errors else ("bold yellow" if data["summary"]["findings"]["warning"]
                                       else "bold green")
    console.print(f"[{style}]{summary_line(data)}[/]", highlight=False)
    print_warnings(console, problems)
    for p in data["processes"]:
        if p["dropped"]:
            console.print(f"[yellow]warning:[/] {p['file']}: {p['dropped']} records dropped "
                          "(seq gaps); replay counts come from process.end, evidence may be "
                          "missing", highlight=False)
        if p["end_reason"] is None and p["records"]:
            console.print(f"[yellow]warning:[/] {p['file']}: no process.end record (killed, "
                          "or still running); the trace stops at its last flush", highlight=False)


def render_coverage(console: Any, data: dict[str, Any], verbose: bool) -> None:
    """What the probes saw: blind reasons, records per kind, packs and targets per process.

    Every line starts with "coverage" or is indented: never with a finding id.
    """
    from rich.markup import escape

    cov = data.get("coverage")
    if not cov:
        return

    def say(text: str) -> None:  # one line each, never folded mid-sentence by rich
        console.print(text, highlight=False, soft_wrap=True)

    def listed(values: list) -> str:
        return ", ".join(map(str, values)) or "none"

    attached = cov["probes_attached"]
    head = (f"{_plural(attached, 'probe')} attached" if attached is not None
            else "not recorded by this trace (older mlatrace: no coverage in process.end)")
    verdict = ("[bold red]BLIND: the trace cannot support a clean verdict[/]" if cov["blind"]
               else "[green]no blind spot found[/]")
    say(f"coverage: {head}, {cov['probes_errored']} errored; {verdict}")
    for reason in cov["reasons"]:
        say(f"  [red]blind:[/] {escape(reason)}")
    if cov["engines"]:
        say("  engines in the headers: "
            + ", ".join(f"{name} {version}" for name, version in cov["engines"].items()))
    ranks = cov["ranks"]
    if ranks["world_size"]:
        kept = f"; kept by --ranks: {listed(ranks['kept'])}" if ranks["kept"] is not None else ""
        missing = f"; [red]missing: {listed(ranks['missing'])}[/]" if ranks["missing"] else ""
        say(f"  ranks: world size {ranks['world_size']}, seen {listed(ranks['seen'])}"
            f"{kept}{missing}")
    for e in cov["expect"]:
        state = "met" if e["met"] else "[red]NOT met[/]"
        say(f"  expect {escape(e['what'])}: {e['records']} record(s), {state}")
    records = ", ".join(f"{kind} {n}" for kind, n in cov["records"].items()
                        if kind not in ("process", "process.end"))
    say(f"  records: {escape(records) or 'none beyond headers'}")
    quiet = 0
    for p in cov["processes"]:
        t = p["targets"]
        active = (p["packs_attached"] or p["probe_errors"] or t["missing"] or t["drifted"]
                  or t["failed"] or any(k not in ("process", "process.end")
                                        for k in p["records"]))
        if not active and not verbose:
            quiet += 1
            continue
        rank = "" if p["rank"] is None else f" rank {p['rank']}"
        where = f"  {p['file']}{rank}:"
        if not p["recorded"]:
            why = ("older trace: no coverage in process.end" if p["ended"]
                   else "no process.end: the process was killed before writing it")
            say(f"{where} packs installed {listed(p['packs'])} "
                f"(per-target coverage not recorded: {why})")
            continue
        by_reason: dict[str, list[str]] = {}
        for pack, why in p["packs_skipped"].items():
            by_reason.setdefault(why, []).append(pack)
        skipped = "; ".join(
            f"{listed(packs) if verbose or len(packs) <= 3 else _plural(len(packs), 'pack')}"
            f" ({why})" for why, packs in by_reason.items()) or "none"
        counts = [f"{t['patched']} patched", f"{t['not_imported']} not imported"]
        counts += [f"{len(t[name])} {name}" for name in ("missing", "drifted", "failed")
                   if t[name]]
        say(f"{where} packs attached {listed(p['packs_attached'])}; skipped "
            f"{escape(skipped)}; targets {', '.join(counts)}")
        for name in ("missing", "drifted", "failed"):
            for target in t[name]:
                say(f"    {name}: {escape(target)}")
        if verbose and p["hits"]:
            say("    hits: " + ", ".join(f"{q} {n}" for q, n in p["hits"].items()))
    if quiet:
        say(f"  +{_plural(quiet, 'process', 'processes')} with no probe activity "
            "(-v lists them)")


def render_processes(console: Any, data: dict[str, Any], verbose: bool) -> None:
    """One row per process; processes with no events fold into one row unless -v."""
    from rich.table import Table

    procs = Table(title="processes", title_justify="left", show_edge=False)
    for col in ("file", "pid", "ppid", "rank", "role", "records", "dropped", "end"):
        procs.add_column(col, justify="right" if col in ("pid", "ppid", "rank", "records",
                                                          "dropped") else "left")
    quiet = [] if verbose else [p for p in data["processes"] if _quiet(p, data["graphs"])]
    for p in data["processes"]:
        if p in quiet and len(quiet) > 1:
            continue
        procs.add_row(p["file"], _fmt(p["pid"]), _fmt(p["ppid"]), _fmt(p["rank"]), p["role"],
                      str(p["records"]), str(p["dropped"]), _fmt(p["end_reason"]))
    if len(quiet) > 1:
        roles = sorted({p["role"] for p in quiet})
        procs.add_row(f"+{len(quiet)} more", "", "", "", "no events: " + ", ".join(roles[:4])
                      + (", ..." if len(roles) > 4 else ""), str(sum(p["records"] for p in quiet)),
                      "", "(-v lists them)")
    console.print(procs)


def render_graphs(console: Any, data: dict[str, Any], verbose: bool) -> None:
    """What each capture froze and what its replays saw; -v adds the frozen details."""
    from rich.table import Table

    graphs = data["graphs"]
    if not graphs:
        return
    table = Table(title="graphs (what capture froze / what replays saw)", title_justify="left",
                  show_edge=False)
    for col in ("ranks", "gid", "src", "key", "mode", "captured at", "splits", "stage-1 grid",
                "stage 2", "replays", "max replay len", "ptrs", "gpu p50"):
        table.add_column(col, overflow="fold")
    rows = graph_rows(graphs)
    shown_rows = rows if verbose else rows[:MAX_GRAPH_ROWS]
    for ranks, cells in shown_rows:
        table.add_row(_fmt(ranks), *cells)
    console.print(table)
    if len(rows) > len(shown_rows):
        console.print(f"... {len(rows) - len(shown_rows)} more rows (use -v)")
    if not verbose:
        return
    for g in graphs:
        frozen = g["frozen"]
        hints = ", ".join(f"{k}={v}" for k, v in frozen["hints"].items()) or "-"
        ptrs = ", ".join(f"{k}={_hex(v)}" for k, v in frozen["ptrs"].items()) or "-"
        kernels = "; ".join(
            f"{name} grid {_fmt(k['grids'][0] if len(k['grids']) == 1 else k['grids'])}"
            + (f" NUM_KV_SPLITS {_fmt(k['num_kv_splits'])}" if k["num_kv_splits"] else "")
            for name, k in frozen["kernels"].items()) or "-"
        console.print(f"  rank {_fmt(g['rank'])} gid {g['gid']} {_fmt(g['key'])}: "
                      f"ops {_fmt(frozen['ops'])}; hints {hints}; ptrs {ptrs}; "
                      f"kernels {kernels}; graph nodes {frozen['graph_nodes']}",
                      highlight=False)


def render_attention(console: Any, data: dict[str, Any]) -> None:
    """Attention calls by op and metadata builds by backend."""
    from rich.table import Table

    if not data["attention"]:
        return
    table = Table(title="attention (calls by op, metadata builds by backend)",
                  title_justify="left", show_edge=False)
    for col in ("pid", "rank", "record", "op / backend", "count", "captured", "eager",
                "layers", "seq len min..max"):
        table.add_column(col, justify="right" if col in ("count", "captured", "eager",
                                                          "layers") else "left")
    for a in data["attention"]:
        lens = ("-" if a["seq_len_max"] is None
                else f"{_fmt(a['seq_len_min'])}..{_fmt(a['seq_len_max'])}")
        table.add_row(_fmt(a["pid"]), _fmt(a["rank"]), a["kind"], a["name"], str(a["count"]),
                      str(a["captured"]), str(a["eager"]), str(a["layers"] or "-"), lens)
    console.print(table)


def render_findings(console: Any, data: dict[str, Any], verbose: bool) -> None:
    """Findings grouped by rule; -v adds each one's evidence and fix hint."""
    from rich.table import Table

    if data["findings"]:
        table = Table(title="findings", title_justify="left", show_edge=False)
        for col in ("id", "severity", "count", "ranks", "message"):
            table.add_column(col, overflow="fold")
        for f in group_findings(data["findings"]):
            sev = "[red]error[/]" if f["severity"] == "error" else "[yellow]warning[/]"
            table.add_row(f"{f['id']} {f['name']}", sev, str(f["count"]), _fmt(f["ranks"]),
                          f["message"])
        console.print(table)
        if verbose:
            for f in group_findings(data["findings"]):
                console.print(f"\n[bold]{f['id']} {f['name']}[/] (pid {_fmt(f['pids'])}, "
                              f"rank {_fmt(f['ranks'])}, gid {_fmt(f['gid'])})", highlight=False)
                for e in f["evidence"]:
                    console.print(f"  {e['file']}:seq {e['seq']} ({e['kind']}) {e['what']}",
                                  highlight=False)
                console.print(f"  fix: {f['hint']}", highlight=False)
        else:
            console.print("(-v shows evidence and fix hints)")
    if data["summary"]["suppressed"]:
        console.print(f"{data['summary']['suppressed']} finding(s) suppressed by the config's "
                      "allow-list")


def make_console(stderr: bool = False) -> Any:
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else 160
    return Console(file=stream, width=width, highlight=False)


def main(trace: str, as_json: bool = False, verbose: bool = False,
         config: str | None = None, expect: list[str] | None = None) -> int:
    """Print the report of TRACE; 0 when made, 2 when the trace (or config) is unusable."""
    err = make_console(stderr=True)
    try:
        cfg = resolve_config(config, trace, expect)
        _trace, result = load(trace, cfg)
    except (Unusable, ConfigError) as exc:
        err.print(f"[red]error:[/] {exc}", highlight=False)
        return 2
    data = report_dict(trace, result)
    if as_json:
        print_warnings(err, result.problems)
        sys.stdout.write(json.dumps(data, indent=1, default=str) + "\n")
        return 0
    render(make_console(), data, result.problems, verbose)
    return 0
