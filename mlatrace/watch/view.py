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
from mlatrace.watch.state import LiveRun

SNAPSHOT_SCHEMA = "mlatrace.watch/1"

MAX_ROWS = 12


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


def render(live: LiveRun, log_path: str | None = None) -> Any:
    """The whole screen for the current state of `live` (call after `live.refresh()`)."""
    from rich.console import Group

    # findings first: a terminal too short for the whole view crops the bottom
    parts = [_run_lines(live, log_path), _coverage(live), _findings(live), _processes(live),
             _graphs(live), _attention(live)]
    return Group(*[p for p in parts if p is not None])


def _run_lines(live: LiveRun, log_path: str | None) -> Any:
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
        text.append("command: " + " ".join(str(a) for a in run["argv"])[:150] + "\n")
    if log_path:
        text.append(f"command output: {log_path}\n")
    problems = live.model.problems
    if problems:
        text.append(f"{len(problems)} problem(s): " + "; ".join(str(p) for p in problems[:3])
                    + ("; ..." if len(problems) > 3 else "") + "\n", style="yellow")
    return text


def _table(title: str, columns: tuple[str, ...]) -> Any:
    from rich.table import Table

    table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    for col in columns:
        table.add_column(col, overflow="fold")
    return table


def _processes(live: LiveRun) -> Any:
    model = live.model
    by_file = {p.file: p for p in model.processes}
    table = _table("processes", ("file", "pid", "rank", "role", "state", "records"))
    states = live.processes()
    for ps in states[:MAX_ROWS]:
        p = by_file.get(ps.proc.name)
        if p is None:  # the first line is not complete yet
            table.add_row(ps.proc.name, _fmt(ps.proc.pid), "-", "starting", ps.state, "0")
            continue
        style = "green" if ps.state == "running" else ("" if ps.state.startswith("ended")
                                                        else "yellow")
        table.add_row(p.file, _fmt(p.pid), _fmt(p.rank), p.role,
                      f"[{style}]{ps.state}[/]" if style else ps.state, str(p.records))
    if len(states) > MAX_ROWS:
        table.add_row(f"+{len(states) - MAX_ROWS} more", "", "", "", "", "")
    return table


def _graphs(live: LiveRun) -> Any:
    model = live.model
    roots = root_graphs(model)
    if not roots:
        return None
    table = _table("graphs captured (frozen at capture / replays)",
                   ("rank", "gid", "key", "mode", "splits", "stage-1 grid", "stage 2",
                    "replays", "rate/s", "latest len", "max len"))
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
        table.add_row(_fmt(model.rank_of(root.pid)) if model.rank_of(root.pid) is not None
                      else f"pid {root.pid}",
                      str(root.gid) + (">" + ",".join(map(str, sorted(nested))) if nested else ""),
                      _fmt(model.effective_key(root)), _fmt(model.effective_mode(root)),
                      _fmt(topo["num_kv_splits"]),
                      _fmt(grid[0] if grid and len(grid) == 1 else grid), _fmt(topo["stage2"]),
                      str(stats.count), "-" if rate is None else f"{rate:.1f}",
                      _span(latest.get("seq_len_min"), latest.get("seq_len_max")),
                      _fmt(stats.seq_len_max))
    if len(roots) > MAX_ROWS:
        table.caption = f"the last {MAX_ROWS} of {len(roots)} captures"
    return table


def _attention(live: LiveRun) -> Any:
    model = live.model
    procs = {p.name: p for p in live.tail.processes()}
    table = _table("attention (metadata builds by backend, calls by op)",
                   ("pid", "rank", "record", "backend / op", "count", "captured", "layers",
                    "latest len (reqs)", "len range"))
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
            table.add_row(_fmt(p.pid), _fmt(p.rank), a.kind, a.name, str(a.count),
                          str(a.captured), str(len(a.layers) or "-"), now,
                          _span(a.seq_len_min, a.seq_len_max))
    return table if rows else None


def _coverage(live: LiveRun) -> Any:
    """`report`'s coverage judgement (analysis.coverage) of the records read so far."""
    from rich.text import Text

    cov = live.analysis.coverage
    text = Text("coverage: ")
    packs = coverage_packs(cov)
    text.append(f"packs: {', '.join(packs['packs']) or 'none seen yet'}")
    if packs["attached"] is not None:  # known from process.end: processes that ended
        text.append(f" (attached: {', '.join(packs['attached']) or 'none'})")
    errors = cov.records.get("probe.error", 0)
    if errors:
        first = "; ".join(f"{e['file']}: {e.get('probe')} {e.get('target')}: "
                          f"{str(e.get('error'))[:80]}" for e in cov.probe_errors[:3])
        text.append(f"; probe errors: {errors} ({first})", style="yellow")
    else:
        text.append("; probe errors: 0")
    if cov.blind:
        text.append(f"\nblind so far: {cov.reasons[0]}"
                    + (f" (+{len(cov.reasons) - 1} more reasons)" if len(cov.reasons) > 1 else ""),
                    style="red")
    return text


def coverage_packs(cov: Coverage) -> dict[str, list[str] | None]:
    """Packs installed (headers) and, once a process ended, the packs that attached."""
    recorded = [p.packs_attached for p in cov.processes if p.packs_attached is not None]
    return {"packs": sorted({name for p in cov.processes for name in p.packs}),
            "attached": sorted({name for names in recorded for name in names})
            if recorded else None}


def _findings(live: LiveRun) -> Any:
    from rich.text import Text

    logged = live.findings()
    if not logged:
        return Text("findings: none so far" if not live.finished() else "findings: none",
                    style="green")
    table = _table("findings", ("id", "severity", "status", "first seen", "message"))
    run = live.run_json() or {}
    start = run.get("start_ns")
    began = start / 1e9 if isinstance(start, int) else None
    for lf in logged[:MAX_ROWS]:
        f = lf.finding
        sev = "[red]error[/]" if f.severity == "error" else "[yellow]warning[/]"
        status = "active" if lf.active else f"resolved ({lf.resolved_why})"
        after = None if began is None else lf.first_seen - began
        seen = _clock(lf.first_seen) + (f" (+{_elapsed(after)})"
                                        if after is not None and 0 <= after < 86400 else "")
        where = f"rank {f.rank}: " if f.rank is not None else ""
        table.add_row(f"{f.id} {f.name}", sev, status, seen, where + f.message)
    return table


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
    from mlatrace.report import report_dict

    model = live.model
    cov = live.analysis.coverage
    by_file = {p.file: p for p in model.processes}
    processes = []
    for ps in live.processes():
        p = by_file.get(ps.proc.name)
        processes.append({"file": ps.proc.name, "pid": p.pid if p else ps.proc.pid,
                          "rank": p.rank if p else None, "role": p.role if p else "starting",
                          "state": ps.state, "records": p.records if p else 0})
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
        "coverage": {**coverage_packs(cov), "blind": cov.blind, "reasons": list(cov.reasons),
                     "probe_errors": [{k: e.get(k) for k in ("file", "probe", "target", "error")}
                                      for e in cov.probe_errors]},
        "report": report_dict(str(live.roots[0]), live.analysis),
    }
