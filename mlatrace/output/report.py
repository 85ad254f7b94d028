"""`mlatrace report TRACE`: what capture froze, what replays needed, and the findings.

Exit codes: 0 a report was made (findings or not; `check` gives verdicts), 2 the trace
is unreadable or holds nothing usable (bad --config too).

`--json` prints `report_dict`'s object, schema `mlatrace.report/1` (stable: fields are only
added; its fields are listed in mlatrace/output/report_data.py). The text helpers shared with the
HTML page, `check` and `diff` are in mlatrace/output/report_text.py.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.markup import escape

from mlatrace.analysis import ConfigError
from mlatrace.analysis.load import Unusable, load, resolve_config
from mlatrace.analysis.model import MAX_MARKS
from mlatrace.common import plural, shorten
from mlatrace.exitcodes import MlatraceError
from mlatrace.output.report_data import REPORT_SCHEMA, problems_of, report_dict, summary_line
from mlatrace.output.report_graph_use import render_graph_use
from mlatrace.output.report_text import (
    cost_line,
    fmt,
    gid_note,
    gid_text,
    gpu_cell,
    gpu_time,
    hex_text,
    problem_text,
    rank_text,
    units_note,
)
from mlatrace.output.tables import Column, make_console, print_line, print_table

__all__ = ["REPORT_SCHEMA", "gid_note", "Unusable", "cost_line", "gid_text", "gpu_time", "load",
           "main", "make_console", "plural", "problem_text", "problems_of", "rank_text", "render",
           "report_dict", "resolve_config", "summary_line"]

MAX_GRAPH_ROWS = 20


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
        cells = (gid_text(g["gid"], g["nested_gids"]), fmt(g["src"]), fmt(g["key"]),
                 fmt(g["mode"]), fmt(frozen["capture_seq_len_max"]),
                 fmt(frozen["num_kv_splits"]),
                 fmt(grid[0] if grid and len(grid) == 1 else grid), fmt(frozen["stage2"]),
                 str(rep["count"]), fmt(rep["seq_len_max"]), gpu_cell(rep["gpu_ns"])
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


MAX_PROBLEM_LINES = 50


def print_warnings(console: Any, problems: list[dict[str, Any]]) -> None:
    """One `warning:` line per problem (problems_of), never wrapped: CI logs grep them."""
    for p in problems[:MAX_PROBLEM_LINES]:
        console.print(f"[yellow]warning:[/] {escape(problem_text(p))}", highlight=False,
                      soft_wrap=True)
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
    render_graph_use(console, data, verbose)
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
    head = (f"{plural(attached, 'probe')} attached" if attached is not None
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
    records = ", ".join(f"{kind} {n}" + units_note(kind, n, data["summary"])
                        for kind, n in cov["records"].items()
                        if kind not in ("process", "process.end", "steady"))
    say(f"  records: {escape(records) or 'none beyond headers'}")
    folds = cov["records"].get("steady")
    if folds:   # the counts above are the records the folds stand for (docs/folding.md)
        written = sum(p.get("written", p["records"]) for p in data["processes"])
        stood = sum(p["records"] for p in data["processes"])
        say(f"  folded: {plural(folds, 'steady record')} stand for "
            f"{plural(stood - written + folds, 'record')} of these (the files hold "
            f"{plural(written, 'record')})")
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
            f"{listed(packs) if verbose or len(packs) <= 3 else plural(len(packs), 'pack')}"
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
        say(f"  +{plural(quiet, 'process', 'processes')} with no probe activity "
            "(-v lists them)")


def render_processes(console: Any, data: dict[str, Any], verbose: bool) -> None:
    """One row per process; processes with no events fold into one row unless -v."""
    quiet = [] if verbose else [p for p in data["processes"] if _quiet(p, data["graphs"])]
    rows = []
    for p in data["processes"]:
        if p in quiet and len(quiet) > 1:
            continue
        rows.append([p["file"], fmt(p["pid"]), fmt(p["ppid"]), rank_text(p["rank"]), p["role"],
                     str(p["records"]), str(p["dropped"]), fmt(p["end_reason"])])
    if len(quiet) > 1:
        roles = sorted({p["role"] for p in quiet})
        rows.append([f"+{len(quiet)} more", "", "", "", "no events: " + ", ".join(roles[:4])
                     + (", ..." if len(roles) > 4 else ""), str(sum(p["records"] for p in quiet)),
                     "", "(-v lists them)"])
    print_table(console, PROCESS_COLUMNS, rows, title="processes")


def print_rank_rows(console: Any, columns: list[Column], rows: list[tuple[list, list[str]]],
                    verbose: bool, title: str) -> None:
    """A table whose rows ranks share (graph_rows, kernel_rows): the first MAX_GRAPH_ROWS
    unless -v, and how many more there are."""
    shown = rows if verbose else rows[:MAX_GRAPH_ROWS]
    print_table(console, columns, [[ranks_text(r), *cells] for r, cells in shown], title=title)
    if len(rows) > len(shown):
        console.print(f"... {len(rows) - len(shown)} more rows (use -v)")


def render_graphs(console: Any, data: dict[str, Any], verbose: bool) -> None:
    """What each capture froze and what its replays saw; -v adds the frozen details."""
    graphs = data["graphs"]
    if not graphs:
        return
    print_rank_rows(console, GRAPH_COLUMNS, graph_rows(graphs), verbose,
                    "graphs (what capture froze / what replays saw)")
    note = gid_note(graphs, data["summary"].get("graphs_total"))
    if note:
        console.print(f"({note})", highlight=False, soft_wrap=False)
    from mlatrace.output.charts.spark import sparkline_lines

    spark = sparkline_lines(data, None if verbose else MAX_GRAPH_ROWS)
    if spark:
        console.print("replay lengths over time (seq_len_max before each replay):",
                      highlight=False)
        for line in spark:
            print_line(console, line, hang=4)
    for g in graphs:
        if g["capture_error"]:
            sizes = g["frozen"].get("capture_sizes")
            at = (" (captured with " + ", ".join(f"{k}={v}" for k, v in sizes.items()) + ")"
                  if sizes else "")
            print_line(console, escape(f"capture failed: rank {rank_text(g['rank'])} pid "
                                       f"{fmt(g['pid'])} gid {g['gid']} {fmt(g['key'])}: "
                                       f"{g['capture_error']}{at}"))
    if not verbose:
        return
    for g in graphs:
        frozen = g["frozen"]
        hints = ", ".join(f"{k}={v}" for k, v in frozen["hints"].items()) or "-"
        ptrs = ", ".join(f"{k}={hex_text(v)}" for k, v in frozen["ptrs"].items()) or "-"
        kernels = "; ".join(
            f"{name} grid {fmt(k['grids'][0] if len(k['grids']) == 1 else k['grids'])}"
            + (f" NUM_KV_SPLITS {fmt(k['num_kv_splits'])}" if k["num_kv_splits"] else "")
            for name, k in frozen["kernels"].items()) or "-"
        console.print(f"  rank {rank_text(g['rank'])} pid {fmt(g['pid'])} gid {g['gid']} "
                      f"{fmt(g['key'])}: ops {fmt(frozen['ops'])}; hints {hints}; ptrs {ptrs}; "
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
                cells = (str(g["gid"]), fmt(g["key"]),
                         f"- (none of {g['nodes']} nodes)", "-", "-", ns_range(g["replay_gpu_ns"]))
            else:
                cells = (str(g["gid"]), fmt(g["key"]), k["short"], fmt(k["grid"]),
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
    print_rank_rows(console, KERNEL_COLUMNS, kernel_rows(view), verbose,
                    "kernels (attention-like nodes of each graph)")
    differ = view["grids_differ"]
    if not verbose:
        if differ:
            console.print(f"({plural(len(differ), 'kernel')} launched with different grids "
                          "between graphs: -v lists them)", highlight=False)
        return
    for d in differ:
        grids = "; ".join(f"{fmt(g['grid'])} in gid(s) "
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
                else f"{fmt(a['seq_len_min'])}..{fmt(a['seq_len_max'])}")
        rows.append([fmt(a["pid"]), rank_text(a["rank"]), a["kind"], a["name"], str(a["count"]),
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
        console.print(escape(f"  rank {rank_text(m['rank'])} pid {fmt(m['pid'])} {m['file']}:seq "
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
                console.print(f"\n[bold]{f['id']} {f['name']}[/] (pid {fmt(f['pids'])}, "
                              f"rank {ranks_text(f['ranks'])}, gid {fmt(f['gid'])})",
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
    also write the page (mlatrace.output.html_report) there (2 when it cannot be written)."""
    err = make_console(stderr=True)
    if list_runs:
        return print_runs(trace, as_json)
    try:
        cfg = resolve_config(config, trace, expect)
        opened, result = load(trace, cfg, run_id=run_id)
    except (Unusable, ConfigError) as exc:
        raise MlatraceError(f"error: {exc}") from None
    shown = trace if isinstance(trace, str) else " ".join(trace)
    data = report_dict(shown, result, run=opened.run)
    if html:
        from mlatrace.output.html_report import save

        save(html, data, result, err)
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
        raise MlatraceError(f"error: {exc}") from None
    if as_json:
        sys.stdout.write(json.dumps({"schema": "mlatrace.runs/1",
                                     "runs": [r.to_dict() for r in runs]}, indent=1) + "\n")
        return 0
    shared = _shared_args([r.argv for r in runs])
    rows = [[str(r.run_id), describe_start(r.start_ns), argv_text(r.argv, shared),
             ", ".join(r.hosts) or "-", str(r.processes), ", ".join(str(d) for d in r.dirs)]
            for r in runs]
    print_table(make_console(), RUN_COLUMNS, rows, title=f"{len(runs)} run(s), oldest first")
    return 0


ARGV_CHARS = 60


def _shared_args(argvs: list[list[str]]) -> int:
    """How many leading arguments every one of several runs' argvs shares (0 for one run)."""
    if len(argvs) < 2:
        return 0
    n = 0
    for column in zip(*argvs, strict=False):
        if any(arg != column[0] for arg in column):
            break
        n += 1
    return n


def argv_text(argv: list[str], shared: int = 0) -> str:
    """A run's command in about ARGV_CHARS: when runs share leading arguments, the command's
    first ones, then the arguments where this run differs from the others (a cut in the
    middle, never where the runs differ)."""
    text = " ".join(argv)
    if len(text) <= ARGV_CHARS:
        return text
    if 0 < shared < len(argv):
        differs = shared - 1 if argv[shared - 1].startswith("-") else shared  # its option too
        head = " ".join([argv[0].rsplit("/", 1)[-1], *argv[1:min(differs, 3)]])
        return f"{shorten(head, 30).removesuffix('…')} … {' '.join(argv[differs:])}"
    return shorten(text, ARGV_CHARS)

