"""`mlatrace report TRACE`: what capture froze, what replays needed, and the findings.

Exit codes: 0 a report was made (findings or not; `check` gives verdicts), 2 the trace
is unreadable or holds nothing usable (bad --config too).

`--json` prints one object, schema `mlatrace.report/1` (stable: fields are only added):

    {
      "schema": "mlatrace.report/1",
      "trace": str,                          # the trace directory
      "summary": {"processes": int,
                  "graphs": int,        # capture units: root graphs, each with the graphs
                                        # captured inside it (gid 1>2,3 in the table)
                  "graphs_total": int,  # every graph, nested torch graphs included
                  "replays": int,                       # steps (nested replays counted once)
                  "findings": {"error": int, "warning": int},
                  "suppressed": int,
                  "problems": int,      # len(problems): the text, check and this agree
                  "marks": int,         # mlatrace.mark() records (all, even past the kept ones)
                  "exit_code": int|null,                # the traced command's (run.json)
                  "probes_attached": int|null,          # distinct probes with a patched
                                                        # target (null: not recorded)
                  "probes_errored": int,                # distinct probes with a probe.error
                  "blind": bool},                       # coverage.blind
      "processes": [{"file", "pid", "ppid", "rank", "root", "world_size", "role", "argv",
                     "schema", "records", "dropped", "gaps", "end_reason"}],
      "graphs": [{"pid", "rank", "file", "gid", "nested_gids": [int], "src", "key", "mode",
                  "segments", "eager_breaks", "capture_seq",
                  "capture_error": str|null,   # the capture raised (graph.capture.end)
                  "frozen": {"num_kv_splits": [int], "stage2": "present"|"skipped"|null,
                             "kernels": {name: {"grids": [[x, y, z]], "num_kv_splits": [int]}},
                             "hints": {name: value}, "ops": [str], "ptrs": {name: int},
                             "graph_nodes": int, "capture_seq_len_max": int|null},
                  "replays": {"count": int, "seq_len_max": int|null, "seq_len_min": int|null,
                              "ptrs_stable": bool|null,
                              "gpu_ns": {"p50", "p90", "p99", "max", "mean",   # ns per replay
                                         "samples"}|null,              # timed replays
                              # over time (analysis/series.py), min/max per time bucket:
                              "lengths": {"points", "min", "max", "t0_ns", "t_last_ns",
                                          "bucket_ns", "buckets": [[t, min, max, n]]}|null,
                              "gpu_times": {"gid", ...as lengths}|null,  # replay.time
                              "gpu_hist": [[ns, count]]|null},  # 8 significant bits
                  "runtime": {"num_kv_splits": [int]}|null}],  # a unit with eager breaks:
                                        # split counts its process chose eagerly while replaying
      "attention": [{"file", "pid", "rank", "kind": "attn.call"|"attn.metadata",
                     "name",                 # the op (forward_mqa, ...) or the backend
                     "count", "captured", "eager", "layers",   # distinct layer names
                     "seq_len_min", "seq_len_max", "first": {"file", "seq"}}],
      "findings": [{"id", "name", "severity", "message", "hint", "pid", "rank", "gid",
                    "evidence": [{"file", "seq", "kind", "what"}], "details": {...},
                    "cost": {"replays", "timed", "replay_gpu_ns_p50", "replay_gpu_ns_p90",
                             "total_gpu_ns", "estimate": {"gpu_ns_p50", "how"}|null}|null}],
                                             # cost: MLT001/6/7 (mlatrace.analysis.cost)
      "suppressed": [same as findings],      # matched by the config's allow-list
      "problems": [{"file", "line", "reason"}],  # the reader's bad lines (line >= 1), then
                                        # per-file data loss (line 0): dropped records, no
                                        # process.end
      "marks": [{"file", "pid", "rank", "seq", "t", "name", "attrs"}]  # the first 100 per process
      "kernels": {                           # the kernel view (analysis/kernels.py)
        "graphs": [{"pid", "rank", "gid", "key", "nodes": int,   # graphs with graph.nodes
                    "device": str|null, "sms": int|null,          # from the `device` record
                    "attention": [{"name", "short", "grid": [x, y, z], "ctas": int,
                                   "attention": true, "why": "name"|"attn.call"}],
                    "largest": {...}|null,   # the attention-like kernel with the most CTAs
                    "replay_gpu_ns": {"timed": int, "min": int|null, "max": int|null}}],
        "grids_differ": [{"kernel": short name,       # attention-like kernels launched with
                          "grids": [{"grid": [x, y, z], "graphs": ["pid:gid"]}]}]
      },                                     # more than one grid between graphs
      "coverage": {                          # what the probes saw (analysis/coverage.py)
        "blind": bool, "reasons": [str],     # why the trace cannot support a clean verdict
        "notes": [str],                      # what a rule could not judge (MLT008: no SMs)
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

from rich.markup import escape

from mlatrace.analysis import Analysis, ConfigError
from mlatrace.analysis.kernels import kernel_view
from mlatrace.analysis.load import Unusable, load, resolve_config
from mlatrace.analysis.model import MAX_MARKS
from mlatrace.analysis.summary import root_graphs, units
from mlatrace.exitcodes import ExitCode
from mlatrace.tables import Column, make_console, plural, print_line, print_table, shorten

__all__ = ["Unusable", "load", "main", "render", "report_dict", "resolve_config"]

REPORT_SCHEMA = "mlatrace.report/1"
MAX_GRAPH_ROWS = 20


def problems_of(model: Any) -> list[dict[str, Any]]:
    """Every problem of a trace, once, in one order: the reader's bad lines, then each
    process's data loss (dropped records, no process.end). The summary counts these,
    the text prints them, --json lists them and check prints them: the same list."""
    out = [{"file": p.file, "line": p.line, "reason": p.reason} for p in model.problems]
    for p in model.processes:
        if p.dropped:
            out.append({"file": p.file, "line": 0, "reason": (
                f"{_plural(p.dropped, 'record')} dropped (seq gaps); replay counts come from "
                "process.end, evidence may be missing")})
        if p.end is None and p.records:
            out.append({"file": p.file, "line": 0, "reason": (
                "no process.end: a Ray worker (Ray ends workers without exit handlers); "
                "its trace holds every task it finished" if p.kinds.get("ray.worker")
                else "no process.end record (killed, or still running); the trace stops at "
                "its last flush")})
    return out


def report_dict(trace_path: str, result: Analysis,
                run: dict[str, Any] | None = None) -> dict[str, Any]:
    """The report as data (schema mlatrace.report/1, see the module docstring)."""
    model = result.model
    counts = result.counts()
    problems = problems_of(model)
    run = run or {}
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
            "problems": len(problems),
            "marks": sum(p.marks_total for p in model.processes),
            "exit_code": run.get("exit_code"),
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
        "problems": problems,
        "marks": [{"file": p.file, "pid": p.pid, "rank": p.rank, **m}
                  for p in model.processes for m in p.marks],
        "kernels": kernel_view(model, result.config.grid),
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
    if s.get("exit_code"):
        parts.append(f"the traced command exited with code {s['exit_code']}")
    return ", ".join(parts)


_plural = plural


def rank_text(rank: Any) -> str:
    """A rank as every output prints it: its number, or '-' when the process has none."""
    return "-" if rank is None else str(rank)


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


def _gpu_cell(gpu: dict | None) -> str:
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
    head = f"{f['id']} gid {_fmt(f['gid'])}: " + (plural(replays, "replay")
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


def _quiet(proc: dict, graphs: list[dict]) -> bool:
    """A process that recorded nothing but its header and end (compile workers, trackers)."""
    return proc["records"] <= 2 and not proc["dropped"] and not proc["root"] and \
        not any(g["pid"] == proc["pid"] for g in graphs)


GRAPH_COLUMNS = [
    Column("ranks", priority=2, wrap=True),
    Column("gid", justify="right"),
    Column("src", priority=6),
    Column("key", wrap=True),
    Column("mode", priority=2),
    Column("captured at", priority=1, justify="right"),
    Column("splits"),
    Column("stage-1 grid", priority=4),
    Column("stage 2", priority=3),
    Column("replays", priority=2, justify="right"),
    Column("max replay len", justify="right"),
    Column("time/replay p50/p90/max", priority=5, wrap=True),
    Column("ptrs", priority=3),
]


def graph_rows(graphs: list[dict]) -> list[tuple[list, list[str]]]:
    """Table rows of capture units; ranks whose units look the same share one row (TP).

    Processes without a rank never share a row (nothing would tell them apart)."""
    rows: dict[tuple, list] = {}
    for g in sorted(graphs, key=lambda g: (g["gid"], g["rank"] if g["rank"] is not None else -1,
                                           g["pid"] or 0)):
        frozen, rep = g["frozen"], g["replays"]
        stage1 = next((k for k in frozen["kernels"] if "stage1" in k.lower()
                       or "stage_1" in k.lower()), None)
        grid = frozen["kernels"][stage1]["grids"] if stage1 else None
        ptrs = {None: "-", True: "stable", False: "[red]drift[/]"}[rep["ptrs_stable"]]
        cells = (gid_text(g["gid"], g["nested_gids"]), _fmt(g["src"]), _fmt(g["key"]),
                 _fmt(g["mode"]), _fmt(frozen["capture_seq_len_max"]),
                 _fmt(frozen["num_kv_splits"]),
                 _fmt(grid[0] if grid and len(grid) == 1 else grid), _fmt(frozen["stage2"]),
                 str(rep["count"]), _fmt(rep["seq_len_max"]), _gpu_cell(rep["gpu_ns"])
                 + (" (host)" if rep.get("timed_via") == "host" else ""), ptrs)
        alone = ("pid", g["pid"]) if g["rank"] is None else ()
        rows.setdefault((*cells, *alone), []).append(g["rank"])
    return [(ranks, list(key[:len(GRAPH_COLUMNS) - 1])) for key, ranks in rows.items()]


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


def ranks_text(ranks: list) -> str:
    return ",".join(rank_text(r) for r in ranks) or "-"


def problem_text(p: dict[str, Any]) -> str:
    """`file:line: reason`, or `file: reason` for a problem of a whole file."""
    where = f"{p['file']}:{p['line']}" if p.get("line") else str(p["file"])
    return f"{where}: {p['reason']}"


MAX_PROBLEM_LINES = 50


def print_warnings(console: Any, problems: list[dict[str, Any]]) -> None:
    """One `warning:` line per problem (problems_of), never wrapped: CI logs grep them."""
    for p in problems[:MAX_PROBLEM_LINES]:
        console.print(f"[yellow]warning:[/] {problem_text(p)}", highlight=False, soft_wrap=True)
    if len(problems) > MAX_PROBLEM_LINES:
        console.print(f"[yellow]warning:[/] ... {len(problems) - MAX_PROBLEM_LINES} more "
                      "problems (--json lists them all)", highlight=False, soft_wrap=True)


def render(console: Any, data: dict[str, Any], verbose: bool) -> None:
    """The human report: summary line, warnings, then one table per section (rich)."""
    render_summary(console, data)
    render_coverage(console, data, verbose)
    render_processes(console, data, verbose)
    render_graphs(console, data, verbose)
    render_kernels(console, data, verbose)
    render_attention(console, data)
    render_marks(console, data, verbose)
    render_findings(console, data, verbose)


def render_summary(console: Any, data: dict[str, Any]) -> None:
    """The summary line, then every problem (the reader's and per-process data loss)."""
    errors = data["summary"]["findings"]["error"]
    style = "bold red" if errors else ("bold yellow" if data["summary"]["findings"]["warning"]
                                       else "bold green")
    console.print(f"[{style}]{summary_line(data)}[/]", highlight=False)  # wraps at spaces
    print_warnings(console, data["problems"])


PROCESS_COLUMNS = [
    Column("file"),
    Column("pid", justify="right"),
    Column("ppid", priority=3, justify="right"),
    Column("rank", priority=1, justify="right"),
    Column("role", wrap=True),
    Column("records", priority=2, justify="right"),
    Column("dropped", priority=4, justify="right"),
    Column("end", wrap=True),
]


def render_coverage(console: Any, data: dict[str, Any], verbose: bool) -> None:
    """What the probes saw: blind reasons, records per kind, packs and targets per process.

    Every line starts with "coverage" or is indented: never with a finding id.
    """
    from rich.markup import escape

    cov = data.get("coverage")
    if not cov:
        return

    def say(text: str) -> None:  # fits the width, wrapped between words and indented
        print_line(console, text)

    def listed(values: list) -> str:
        return ", ".join(map(str, values)) or "none"

    attached = cov["probes_attached"]
    killed = any(not p["ended"] for p in cov["processes"])
    head = (f"{_plural(attached, 'probe')} attached" if attached is not None
            else "process killed: coverage unknown" if killed
            else "not recorded by this trace (older mlatrace: no coverage in process.end)")
    verdict = ("[bold red]BLIND: the trace cannot support a clean verdict[/]" if cov["blind"]
               else "[green]no blind spot found[/]")
    say(f"coverage: {head}, {cov['probes_errored']} errored; {verdict}")
    for reason in cov["reasons"]:
        say(f"  [red]blind:[/] {escape(reason)}")
    for note in cov.get("notes", ()):
        say(f"  note: {escape(note)}")
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
                   else "process killed: coverage unknown (no process.end)")
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
        if p["unseen"] or p["steps_off"]:
            off = sum(p["steps_off"].values())
            say(f"    stepped aside in steady steps: {sum(p['unseen'].values())} calls not "
                "inspected" + (f", launch wrapper off in {off} steps" if off else "")
                + " (`mlatrace run --step-aside 0` inspects every call)"
                + (": " + ", ".join(f"{q} {n}" for q, n in p["unseen"].items())
                   if verbose else ""))
        if verbose and p["hits"]:
            say("    hits: " + ", ".join(f"{q} {n}" for q, n in p["hits"].items()))
    if quiet:
        say(f"  +{_plural(quiet, 'process', 'processes')} with no probe activity "
            "(-v lists them)")


def render_processes(console: Any, data: dict[str, Any], verbose: bool) -> None:
    """One row per process; processes with no events fold into one row unless -v."""
    quiet = [] if verbose else [p for p in data["processes"] if _quiet(p, data["graphs"])]
    rows = []
    for p in data["processes"]:
        if p in quiet and len(quiet) > 1:
            continue
        rows.append([p["file"], _fmt(p["pid"]), _fmt(p["ppid"]), rank_text(p["rank"]), p["role"],
                     str(p["records"]), str(p["dropped"]), _fmt(p["end_reason"])])
    if len(quiet) > 1:
        roles = sorted({p["role"] for p in quiet})
        rows.append([f"+{len(quiet)} more", "", "", "", "no events: " + ", ".join(roles[:4])
                     + (", ..." if len(roles) > 4 else ""), str(sum(p["records"] for p in quiet)),
                     "", "(-v lists them)"])
    print_table(console, PROCESS_COLUMNS, rows, title="processes")


def render_graphs(console: Any, data: dict[str, Any], verbose: bool) -> None:
    """What each capture froze and what its replays saw; -v adds the frozen details."""
    graphs = data["graphs"]
    if not graphs:
        return
    rows = graph_rows(graphs)
    shown_rows = rows if verbose else rows[:MAX_GRAPH_ROWS]
    print_table(console, GRAPH_COLUMNS, [[ranks_text(ranks), *cells] for ranks, cells in shown_rows],
                title="graphs (what capture froze / what replays saw)")
    if len(rows) > len(shown_rows):
        console.print(f"... {len(rows) - len(shown_rows)} more rows (use -v)")
    if any(g["nested_gids"] for g in graphs):
        console.print(f"({GID_NOTE})", highlight=False)
    from mlatrace.charts.spark import sparkline_lines

    spark = sparkline_lines(data, None if verbose else MAX_GRAPH_ROWS)
    if spark:
        console.print("replay lengths over time (seq_len_max before each replay):",
                      highlight=False)
        for line in spark:
            print_line(console, line, hang=4)
    for g in graphs:
        if g["capture_error"]:
            print_line(console, escape(f"capture failed: rank {rank_text(g['rank'])} pid "
                                       f"{_fmt(g['pid'])} gid {g['gid']} {_fmt(g['key'])}: "
                                       f"{g['capture_error']}"))
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
        console.print(f"  rank {rank_text(g['rank'])} pid {_fmt(g['pid'])} gid {g['gid']} "
                      f"{_fmt(g['key'])}: ops {_fmt(frozen['ops'])}; hints {hints}; ptrs {ptrs}; "
                      f"kernels {kernels}; graph nodes {frozen['graph_nodes']}",
                      highlight=False)


KERNEL_COLUMNS = [
    Column("ranks", priority=2, wrap=True),
    Column("gid", justify="right"),
    Column("key", priority=1, wrap=True),
    Column("attention-like kernel", wrap=True),
    Column("grid"),
    Column("CTAs/SMs", justify="right"),
    Column("replay GPU time min..max (timed)", wrap=True),
]


def ns_range(rng: dict) -> str:
    """`95 us..10.7 ms (160)`: a graph's fastest and slowest timed replay."""
    if not rng or not rng.get("timed"):
        return "- (none timed)"
    return f"{gpu_time(rng['min'])}..{gpu_time(rng['max'])} ({rng['timed']})"


def kernel_rows(view: dict[str, Any]) -> list[tuple[list, list[str]]]:
    """Rows of the kernel view: one per (graph, attention-like kernel); ranks whose rows
    look the same share one."""
    rows: dict[tuple, list] = {}
    for g in view["graphs"]:
        sms = g["sms"] if g["sms"] is not None else "?"
        kernels = g["attention"] or [None]
        for k in kernels:
            if k is None:
                cells = (str(g["gid"]), _fmt(g["key"]),
                         f"- (none of {g['nodes']} nodes)", "-", "-", ns_range(g["replay_gpu_ns"]))
            else:
                cells = (str(g["gid"]), _fmt(g["key"]), k["short"], _fmt(k["grid"]),
                         f"{k['ctas']}/{sms}", ns_range(g["replay_gpu_ns"]))
            alone = ("pid", g["pid"]) if g["rank"] is None else ()
            rows.setdefault((*cells, *alone), []).append(g["rank"])
    return [(ranks, list(key[:len(KERNEL_COLUMNS) - 1])) for key, ranks in rows.items()]


def render_kernels(console: Any, data: dict[str, Any], verbose: bool) -> None:
    """Per graph with kernel nodes: its attention-like kernels, their grids against the
    SMs and its replay-time range; -v adds the grids that differ between graphs."""
    view = data.get("kernels")
    if not view or not view["graphs"]:
        return
    rows = kernel_rows(view)
    shown = rows if verbose else rows[:MAX_GRAPH_ROWS]
    print_table(console, KERNEL_COLUMNS, [[ranks_text(r), *cells] for r, cells in shown],
                title="kernels (attention-like nodes of each graph)")
    if len(rows) > len(shown):
        console.print(f"... {len(rows) - len(shown)} more rows (use -v)")
    differ = view["grids_differ"]
    if not verbose:
        if differ:
            console.print(f"({plural(len(differ), 'kernel')} launched with different grids "
                          "between graphs: -v lists them)", highlight=False)
        return
    for d in differ:
        grids = "; ".join(f"{_fmt(g['grid'])} in gid(s) "
                          + ",".join(x.split(":", 1)[1] for x in g["graphs"])
                          for g in d["grids"])
        print_line(console, escape(f"  grids differ: {d['kernel']}: {grids}"))
    if not differ:
        console.print("  grids differ: none (every attention-like kernel has one grid)",
                      highlight=False)


ATTENTION_COLUMNS = [
    Column("pid", priority=2, justify="right"),
    Column("rank", priority=1, justify="right"),
    Column("record", priority=3),
    Column("op / backend"),
    Column("count", justify="right"),
    Column("captured", priority=1, justify="right"),
    Column("eager", priority=2, justify="right"),
    Column("layers", priority=4, justify="right"),
    Column("seq len min..max"),
]


def render_attention(console: Any, data: dict[str, Any]) -> None:
    """Attention calls by op and metadata builds by backend."""
    if not data["attention"]:
        return
    rows = []
    for a in data["attention"]:
        lens = ("-" if a["seq_len_max"] is None
                else f"{_fmt(a['seq_len_min'])}..{_fmt(a['seq_len_max'])}")
        rows.append([_fmt(a["pid"]), rank_text(a["rank"]), a["kind"], a["name"], str(a["count"]),
                     str(a["captured"]), str(a["eager"]), str(a["layers"] or "-"), lens])
    print_table(console, ATTENTION_COLUMNS, rows,
                title="attention (calls by op, metadata builds by backend)")


MAX_MARK_LINES = 20
MAX_VALUE_CHARS = 80   # a mark's attribute value in the text report (--json has it whole)


def clip(value: Any, limit: int = MAX_VALUE_CHARS) -> str:
    """`value` as text, cut to `limit` characters with how long it was: `abc… (10,485,760
    chars)`."""
    text = str(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text):,} chars)"


def render_marks(console: Any, data: dict[str, Any], verbose: bool) -> None:
    """`mlatrace.mark()` annotations: their count, and with -v each one."""
    total = data["summary"]["marks"]
    if not total:
        return
    if not verbose:
        console.print(f"{plural(total, 'mark')} (mlatrace.mark annotations; -v lists them)",
                      highlight=False)
        return
    console.print(f"[bold]marks[/] ({plural(total, 'mlatrace.mark annotation')})", highlight=False)
    from rich.markup import escape

    for m in data["marks"]:
        attrs = " ".join(f"{clip(k)}={clip(v)}" for k, v in (m["attrs"] or {}).items()
                         ) if isinstance(m["attrs"], dict) else clip(m["attrs"])
        console.print(escape(f"  rank {rank_text(m['rank'])} pid {_fmt(m['pid'])} {m['file']}:seq "
                             f"{m['seq']} {clip(m['name'])}" + (f" {attrs}" if attrs else "")),
                      highlight=False, soft_wrap=True)
    if total > len(data["marks"]):
        console.print(f"  ... {total - len(data['marks'])} more (the first {MAX_MARKS} of each "
                      "process are kept)", highlight=False)


FINDING_COLUMNS = [
    Column("id", wrap=True),
    Column("severity", priority=2),   # left out before the message folds a long path
    Column("count", priority=3, justify="right"),
    Column("ranks", priority=1, wrap=True),
    Column("message", wrap=True, want=40),
]


def render_findings(console: Any, data: dict[str, Any], verbose: bool) -> None:
    """Findings grouped by rule; -v adds each one's evidence and fix hint."""
    from rich.markup import escape

    if data["findings"]:
        rows = []
        for f in group_findings(data["findings"]):
            sev = "[red]error[/]" if f["severity"] == "error" else "[yellow]warning[/]"
            rows.append([f"{f['id']} {f['name']}", sev, str(f["count"]),
                         ranks_text(f["ranks"]), f["message"]])
        print_table(console, FINDING_COLUMNS, rows, title="findings")
        costs = [line for f in data["findings"] if (line := cost_line(f))]
        if costs:
            console.print("cost (time of the graph's replays):", highlight=False)
            for line in costs:
                print_line(console, f"  {escape(line)}")
        if verbose:
            for f in group_findings(data["findings"]):
                console.print(f"\n[bold]{f['id']} {f['name']}[/] (pid {_fmt(f['pids'])}, "
                              f"rank {ranks_text(f['ranks'])}, gid {_fmt(f['gid'])})",
                              highlight=False)
                for e in f["evidence"]:
                    console.print(f"  {e['file']}:seq {e['seq']} ({e['kind']}) {e['what']}",
                                  highlight=False)
                console.print(f"  fix: {f['hint']}", highlight=False)
        else:
            console.print("(-v shows evidence and fix hints)")
    if data["summary"]["suppressed"]:
        console.print(f"{plural(data['summary']['suppressed'], 'finding')} suppressed by the "
                      "config's allow-list")


def main(trace: str | list[str], as_json: bool = False, verbose: bool = False,
         config: str | None = None, expect: list[str] | None = None,
         run_id: str | None = None, list_runs: bool = False, html: str | None = None) -> int:
    """Print the report of TRACE (one or several paths: one run); 0 when made, 2 when the
    trace (or config) is unusable. `list_runs`: the runs under the paths instead; `html`:
    also write the page (mlatrace.html_report) there (2 when it cannot be written)."""
    err = make_console(stderr=True)
    if list_runs:
        return print_runs(trace, as_json)
    try:
        cfg = resolve_config(config, trace, expect)
        opened, result = load(trace, cfg, run_id=run_id)
    except (Unusable, ConfigError) as exc:
        err.print(f"[red]error:[/] {exc}", highlight=False, soft_wrap=True)
        return ExitCode.UNUSABLE
    shown = trace if isinstance(trace, str) else " ".join(trace)
    data = report_dict(shown, result, run=opened.run)
    if html:
        from mlatrace.html_report import save

        if not save(html, data, result, err):
            return ExitCode.UNUSABLE
    if as_json:
        print_warnings(err, data["problems"])
        sys.stdout.write(json.dumps(data, indent=1, default=str) + "\n")
        return 0
    render(make_console(), data, verbose)
    return 0


# `report --list`: the run id and its directories are what `--run` and the paths need
RUN_COLUMNS = [
    Column("run_id"),
    Column("start", priority=2),
    Column("argv", priority=3, wrap=True, want=20),
    Column("hosts", priority=1, wrap=True),
    Column("processes", justify="right"),
    Column("directories", wrap=True),
]


def print_runs(paths: str | list[str], as_json: bool = False) -> int:
    """`report --list`: one line per run under the paths (run_id, start, argv, hosts, processes)."""
    from mlatrace.trace import TraceError, find_runs
    from mlatrace.trace.runs import describe_start

    try:
        runs = find_runs([paths] if isinstance(paths, str) else paths)
    except TraceError as exc:
        make_console(stderr=True).print(f"[red]error:[/] {exc}", highlight=False,
                                            soft_wrap=True)
        return ExitCode.UNUSABLE
    if as_json:
        sys.stdout.write(json.dumps({"schema": "mlatrace.runs/1",
                                     "runs": [r.to_dict() for r in runs]}, indent=1) + "\n")
        return 0
    rows = [[str(r.run_id), describe_start(r.start_ns), shorten(" ".join(r.argv), 60),
             ", ".join(r.hosts) or "-", str(r.processes), ", ".join(str(d) for d in r.dirs)]
            for r in runs]
    print_table(make_console(), RUN_COLUMNS, rows, title=f"{len(runs)} run(s), oldest first")
    return 0
