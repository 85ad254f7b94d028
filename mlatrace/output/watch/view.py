"""The watch screen: one rich renderable built from a refreshed `LiveRun`.

Sections, top to bottom: the run (directory, command, elapsed, where the command's output
goes), coverage (`report`'s: packs, probe errors, blind reasons), the findings with the time each first
appeared (resolved ones stay listed, marked), processes with their state, graphs captured
(key, mode, frozen split and grid) with replay counts, rates and the latest replay
lengths, and the latest attention metadata lengths and calls. Plain text when printed to a pipe.
`snapshot_dict` is the same state for scripts (`watch --once --json`).
"""

from __future__ import annotations

import time
from typing import Any

from mlatrace.analysis.coverage import Coverage
from mlatrace.analysis.summary import root_graphs, topology
from mlatrace.common import shorten
from mlatrace.output.report_data import records_stood_for
from mlatrace.output.tables import DEFAULT_PIPE_WIDTH, Column, fit_table
from mlatrace.output.watch.state import LiveRun

SNAPSHOT_SCHEMA = "mlatrace.watch/1"

MAX_ROWS = 12
MESSAGE_CHARS = 150  # a finding's message in the live view: two lines of an 80-column terminal


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, (list, tuple)):
        return ",".join(_fmt(v) for v in value) or "-"
    return str(value)


def _span(low: Any, high: Any) -> str:
    if low is None and high is None:
        return "-"
    return str(high) if low == high or low is None else f"{low}..{high}"


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def _elapsed(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


NARROW = 100   # below this many columns a finding shows its id without its name


def render(live: LiveRun, log_path: str | None = None, width: int | None = None,
           height: int | None = None) -> Any:
    """The whole screen for the current state of `live` (call after `live.refresh()`), its
    tables fitted to `width` (the console's) as `report`'s are: the least important columns
    left out, never a word split inside a cell. `height` (a live terminal's): as many
    findings as leave the graphs rows on the screen below them."""
    from rich.console import Group

    width = width or DEFAULT_PIPE_WIDTH
    # about 3 lines a finding; the run, coverage and graphs take some 16 lines
    rows = MAX_ROWS if height is None else max(1, min(MAX_ROWS, (height - 16) // 3))
    # findings, then graphs, first: a terminal too short for the whole view crops the
    # bottom (at 80x24 the processes and attention tables are the ones cut)
    parts = [_run_lines(live, log_path, width), _coverage(live), _findings(live, width, rows),
             _graphs(live, width), _processes(live, width), _attention(live, width)]
    return Group(*[p for p in parts if p is not None])


def _fitted(title: str, columns: list[Column], rows: list[list[str]], width: int,
            caption: str | None = None) -> Any:
    """A table of `rows` fitted to `width` (mlatrace.output.tables), naming what it left out."""
    from types import SimpleNamespace

    table, dropped = fit_table(SimpleNamespace(width=width), columns, rows, title=title)
    notes = ([caption] if caption else []) + (
        [f"not shown at {width} columns: {', '.join(dropped)}"] if dropped else [])
    if notes:
        table.caption, table.caption_justify = "; ".join(notes), "left"
    return table




def _run_lines(live: LiveRun, log_path: str | None, width: int = DEFAULT_PIPE_WIDTH) -> Any:
    from rich.text import Text

    run = live.run_json() or {}
    now = live.clock()
    start = run.get("start_ns")
    began = start / 1e9 if isinstance(start, int) else live.started
    if live.run_over_by_launcher():
        end = run.get("end_ns") / 1e9
        state = f"run ended after {_elapsed(end - began)}, exit code {run.get('exit_code')}"
    elif live.finished():
        state = "every process ended"
    else:
        state = f"running for {_elapsed(now - began)}"
    text = Text()
    text.append("mlatrace watch ", style="bold")
    text.append(", ".join(str(r) for r in live.roots))
    if run.get("run_id"):
        text.append(f" (run {run['run_id']})")
    text.append(f": {state}, {live.records} records read\n")
    if run.get("argv"):
        lines = 1 if width < NARROW else 2
        text.append("command: " + shorten(" ".join(str(a) for a in run["argv"]),
                                          max(20, lines * width - 10)) + "\n")
    if log_path:  # a path is never broken by the wrap: on its own line when it is long
        head = "command output:"
        text.append(f"{head} {log_path}\n" if len(head) + 1 + len(log_path) <= width
                    else f"{head}\n  {log_path}\n")
    problems = live.model.problems
    if problems:
        text.append(f"{len(problems)} problem(s): " + "; ".join(str(p) for p in problems[:3])
                    + ("; ..." if len(problems) > 3 else "") + "\n", style="yellow")
    return text


PROCESS_COLUMNS = [Column("file"), Column("pid", priority=2, justify="right"),
                   Column("rank", priority=3, justify="right"), Column("role", wrap=True),
                   Column("state", wrap=True), Column("records", priority=1, justify="right")]


def _processes(live: LiveRun, width: int = DEFAULT_PIPE_WIDTH) -> Any:
    model = live.model
    by_file = {p.file: p for p in model.processes}
    rows = []
    states = live.processes()
    for ps in states[:MAX_ROWS]:
        p = by_file.get(ps.proc.name)
        if p is None:  # the first line is not complete yet
            rows.append([ps.proc.name, _fmt(ps.proc.pid), "-", "starting", ps.state, "0"])
            continue
        style = "green" if ps.state == "running" else ("" if ps.state.startswith("ended")
                                                        else "yellow")
        rows.append([p.file, _fmt(p.pid), _fmt(p.rank), p.role,
                     f"[{style}]{ps.state}[/]" if style else ps.state,
                     str(records_stood_for(p))])
    if len(states) > MAX_ROWS:
        rows.append([f"+{len(states) - MAX_ROWS} more", "", "", "", "", ""])
    return _fitted("processes", PROCESS_COLUMNS, rows, width)


GRAPH_COLUMNS = [Column("process"), Column("gid"), Column("key", wrap=True),
                 Column("mode", priority=3), Column("splits"), Column("stage-1 grid", priority=2),
                 Column("stage 2", priority=4), Column("replays", justify="right"),
                 Column("rate/s", priority=5, justify="right"),
                 Column("latest len", priority=6, justify="right"),
                 Column("max len", priority=1, justify="right")]


def _graphs(live: LiveRun, width: int = DEFAULT_PIPE_WIDTH) -> Any:
    model = live.model
    roots = root_graphs(model)
    if not roots:
        return None
    rows = []
    for root in roots[-MAX_ROWS:]:
        topo = topology(model, root)
        replayed = root if root.replays.count else next(
            (g for g in model.subtree(root) if g.replays.count), root)
        stats = replayed.replays
        stage1 = next((k for k in topo["kernels"] if "stage1" in k.lower()
                       or "stage_1" in k.lower()), None)
        grid = topo["kernels"][stage1]["grids"] if stage1 else None
        latest = stats.latest_md or {}
        rate = live.replay_rate(replayed)
        nested = [g.gid for g in model.subtree(root) if g is not root]
        rank = model.rank_of(root.pid)   # the process: its rank, or its pid without one
        rows.append([f"rank {rank}" if rank is not None else f"pid {root.pid}",
                     str(root.gid) + (">" + ",".join(map(str, sorted(nested))) if nested else ""),
                     _fmt(model.effective_key(root)), _fmt(model.effective_mode(root)),
                     _fmt(topo["num_kv_splits"]),
                     _fmt(grid[0] if grid and len(grid) == 1 else grid), _fmt(topo["stage2"]),
                     str(stats.count), "-" if rate is None else f"{rate:.1f}",
                     _span(latest.get("seq_len_min"), latest.get("seq_len_max")),
                     _fmt(stats.seq_len_max)])
    notes = [f"the last {MAX_ROWS} of {len(roots)} captures"] if len(roots) > MAX_ROWS else []
    lag = fold_lag(live)
    if lag:
        notes.append(f"steady steps arrive folded, every {lag:g} s (`run --watch` folds "
                     "every second)")
    caption = "; ".join(notes) or None
    return _fitted("graphs captured (frozen at capture / replays)", GRAPH_COLUMNS, rows,
                   width, caption)


def fold_lag(live: LiveRun) -> float | None:
    """The fold interval of a running process whose folds close more slowly than `run
    --watch` makes them (the view's counts of its steady steps move that often)."""
    from mlatrace.settings import WATCH_FOLD_S

    running = {ps.proc.name for ps in live.processes() if ps.state == "running"}
    lags = [p.fold_s for p in live.model.processes
            if p.file in running and p.fold_s and p.fold_s > WATCH_FOLD_S]
    return max(lags) if lags else None


ATTENTION_COLUMNS = [Column("pid", priority=2, justify="right"),
                     Column("rank", priority=3, justify="right"), Column("record"),
                     Column("backend / op"), Column("count", justify="right"),
                     Column("captured", priority=4, justify="right"),
                     Column("layers", priority=5, justify="right"),
                     Column("latest len (reqs)", priority=6, wrap=True),
                     Column("len range", priority=1)]


def _attention(live: LiveRun, width: int = DEFAULT_PIPE_WIDTH) -> Any:
    model = live.model
    procs = {p.name: p for p in live.tail.processes()}
    table: list[list[str]] = []
    rows = 0
    for p in model.processes:
        latest = latest_metadata(live, procs.get(p.file))
        for a in p.attention.values():
            if rows >= MAX_ROWS:
                break
            rows += 1
            md = latest.get(a.name) if a.kind == "attn.metadata" else None
            now = "-" if md is None else (f"{_span(md.get('seq_len_min'), md.get('seq_len_max'))}"
                                          f" ({_fmt(md.get('num_reqs'))})")
            table.append([_fmt(p.pid), _fmt(p.rank), a.kind, a.name, str(a.count),
                          str(a.captured), str(len(a.layers) or "-"), now,
                          _span(a.seq_len_min, a.seq_len_max)])
    return (_fitted("attention (metadata builds by backend, calls by op)", ATTENTION_COLUMNS,
                    table, width) if rows else None)


def _coverage(live: LiveRun) -> Any:
    """`report`'s coverage judgement (analysis.coverage) of the records read so far."""
    from rich.text import Text

    cov = live.analysis.coverage
    text = Text("coverage: ")
    packs = coverage_packs(cov)
    installed = len(packs["packs"])
    many = f"{installed} pack" + ("" if installed == 1 else "s")
    if packs["attached"] is not None:  # known from process.end: processes that ended
        text.append(f"attached {', '.join(packs['attached']) or 'none'} (of {many})")
    else:  # only the attached ones are worth a line: which they are is known at an end
        text.append(f"{many} installed, attached known once a process ends"
                    if installed else "packs: none seen yet")
    errors = cov.records.get("probe.error", 0)
    if errors:
        first = "; ".join(f"{e['file']}: {e.get('probe')} {e.get('target')}: "
                          f"{str(e.get('error'))[:80]}" for e in cov.probe_errors[:3])
        text.append(f"; probe errors: {errors} ({first})", style="yellow")
    else:
        text.append("; 0 probe errors")
    reasons = live_reasons(live)
    if reasons:
        text.append(f"\nblind so far: {reasons[0]}"
                    + (f" (+{len(reasons) - 1} more reasons)" if len(reasons) > 1 else ""),
                    style="red")
    return text


def live_reasons(live: LiveRun) -> list[str]:
    """The blind reasons, less "process killed" for a process that is still running (its
    process.end is still to come)."""
    running = [ps.proc.name for ps in live.processes() if ps.state == "running"]
    return [r for r in live.analysis.coverage.reasons
            if not (r.startswith("process killed") and any(f"({name}," in r for name in running))]


def coverage_packs(cov: Coverage) -> dict[str, list[str] | None]:
    """Packs installed (headers) and, once a process ended, the packs that attached."""
    recorded = [p.packs_attached for p in cov.processes if p.packs_attached is not None]
    return {"packs": sorted({name for p in cov.processes for name in p.packs}),
            "attached": sorted({name for names in recorded for name in names})
            if recorded else None}


# severity is the column a user needs: never left out (status and first seen go first)
FINDING_COLUMNS = [Column("id", wrap=True), Column("severity"),
                   Column("status", priority=2, wrap=True),
                   Column("first seen", priority=3, wrap=True),
                   Column("message", wrap=True, want=30)]


def _findings(live: LiveRun, width: int = DEFAULT_PIPE_WIDTH, max_rows: int = MAX_ROWS) -> Any:
    from rich.text import Text

    logged = live.findings()
    if not logged:
        return Text("findings: none so far" if not live.finished() else "findings: none",
                    style="green")
    rows = []
    run = live.run_json() or {}
    start = run.get("start_ns")
    began = start / 1e9 if isinstance(start, int) else None
    for lf in logged[:max_rows]:
        f = lf.finding
        sev = "[red]error[/]" if f.severity == "error" else "[yellow]warning[/]"
        status = "active" if lf.active else f"resolved ({lf.resolved_why})"
        after = None if began is None else lf.first_seen - began
        seen = _clock(lf.first_seen) + (f" (+{_elapsed(after)})"
                                        if after is not None and 0 <= after < 86400 else "")
        where = f"rank {f.rank}: " if f.rank is not None else ""
        # narrow: the id alone and a message of about two lines of what is left for it
        narrow = width < NARROW
        rows.append([f.id if narrow else f"{f.id} {f.name}", sev, status, seen,
                     shorten(where + f.message,
                             max(40, 2 * (width - 50)) if narrow else MESSAGE_CHARS)])
    return _fitted("findings", FINDING_COLUMNS, rows, width,
                   f"{len(logged) - max_rows} more: see the final report"
                   if len(logged) > max_rows else None)


def latest_metadata(live: LiveRun, proc_file: Any) -> dict[str, dict]:
    """backend -> the latest attn.metadata record of that process (any thread)."""
    builder = live.builder.builder_of(proc_file) if proc_file is not None else None
    latest: dict[str, dict] = {}
    if builder is not None:
        for rec, *_fields in builder.metadata.values():
            name = str(rec.get("backend"))
            if name not in latest or rec.get("seq", 0) > latest[name].get("seq", 0):
                latest[name] = rec
    return latest


def snapshot_dict(live: LiveRun, log_path: str | None = None) -> dict[str, Any]:
    """`watch --once --json`, schema `mlatrace.watch/1` (fields are only added):

        {"schema", "trace", "run": run.json | null, "finished": bool, "records": int,
         "log": str | null,                  # run --watch: the command's output
         "processes": [{"file", "pid", "rank", "role", "state", "records"}],
         "findings": [{"id", "name", "severity", "pid", "rank", "gid", "message",
                       "status": "active" | "resolved", "resolved_why", "first_seen"}],
         "metadata": [{"file", "pid", "backend", "count",      # attn.metadata builds
                       "latest": {"seq_len_min", "seq_len_max", "num_reqs", "seq"}}],
         "coverage": {"packs": [str], "attached": [str] | null,   # report's coverage
                      "blind": bool, "reasons": [str],                # (analysis.coverage)
                      "probe_errors": [{"file", "probe", "target", "error"}]},
         "report": {...}}                    # report --json of the records read so far
    """
    from mlatrace.output.report import report_dict

    model = live.model
    cov = live.analysis.coverage
    by_file = {p.file: p for p in model.processes}
    processes = []
    for ps in live.processes():
        p = by_file.get(ps.proc.name)
        processes.append({"file": ps.proc.name, "pid": p.pid if p else ps.proc.pid,
                          "rank": p.rank if p else None, "role": p.role if p else "starting",
                          "state": ps.state, "records": records_stood_for(p) if p else 0})
    findings = [{"id": lf.finding.id, "name": lf.finding.name, "severity": lf.finding.severity,
                 "pid": lf.finding.pid, "rank": lf.finding.rank, "gid": lf.finding.gid,
                 "message": lf.finding.message, "status": "active" if lf.active else "resolved",
                 "resolved_why": lf.resolved_why, "first_seen": lf.first_seen}
                for lf in live.findings()]
    procs = {p.name: p for p in live.tail.processes()}
    metadata = []
    for p in model.processes:
        latest = latest_metadata(live, procs.get(p.file))
        for a in p.attention.values():
            if a.kind == "attn.metadata":
                md = latest.get(a.name) or {}
                metadata.append({"file": p.file, "pid": p.pid, "backend": a.name, "count": a.count,
                                 "latest": {k: md.get(k) for k in ("seq_len_min", "seq_len_max",
                                                                   "num_reqs", "seq")}})
    return {
        "schema": SNAPSHOT_SCHEMA,
        "trace": str(live.roots[0]),
        "run": live.run_json(),
        "finished": live.finished(),
        "records": live.records,
        "log": log_path,
        "processes": processes,
        "findings": findings,
        "metadata": metadata,
        "coverage": {**coverage_packs(cov), "blind": bool(live_reasons(live)),
                     "reasons": live_reasons(live),
                     "probe_errors": [{k: e.get(k) for k in ("file", "probe", "target", "error")}
                                      for e in cov.probe_errors]},
        "report": report_dict(str(live.roots[0]), live.analysis),
    }
