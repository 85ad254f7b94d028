"""Runs: which trace directories belong together, and which one a command means.

A run may span several directories, one per host: each host's processes write
under their own directory, every file headed by the run's `run_id`. A parent
directory may hold several runs (`mlatrace-trace/` after a few `mlatrace run`s).
`report`, `check`, `diff`, `export`, `merge` (and `watch`) hand their path
arguments to `open_run`: the directories found there that share a run_id are
one run (the ranks of all hosts, lineage per host); of several runs the newest
is opened, and the caller is told which (`find_runs` lists them).

Only headers and run.json are read here; records are streamed later.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlatrace.common import shorten
from mlatrace.trace.reader import Problem, ProcessFile, Trace, TraceError, open_trace

MAX_DEPTH = 3  # how far below a given path trace directories are looked for


@dataclass
class RunInfo:
    """One run found under the given paths: its directories (one per host, usually)."""

    run_id: str | None
    traces: list[Trace] = field(default_factory=list)

    @property
    def dirs(self) -> list[Path]:
        return [t.root for t in self.traces]

    @property
    def start_ns(self) -> int | None:
        starts = [s for t in self.traces if (s := _start_ns(t)) is not None]
        return min(starts) if starts else None

    @property
    def argv(self) -> list[str]:
        """The launcher's command (run.json), else the first process's."""
        for trace in sorted(self.traces, key=lambda t: _start_ns(t) or 0):
            if trace.run and isinstance(trace.run.get("argv"), list):
                return [str(a) for a in trace.run["argv"]]
        for trace in self.traces:
            for proc in trace.processes:
                if proc.header and isinstance(proc.header.get("argv"), list):
                    return [str(a) for a in proc.header["argv"]]
        return []

    @property
    def hosts(self) -> list[str]:
        return sorted({h for t in self.traces for h in _hosts(t)})

    @property
    def processes(self) -> int:
        return sum(len(t.processes) for t in self.traces)

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "start_ns": self.start_ns, "argv": self.argv,
                "hosts": self.hosts, "processes": self.processes,
                "dirs": [str(d) for d in self.dirs]}


def _start_ns(trace: Trace) -> int | None:
    if trace.run and isinstance(trace.run.get("start_ns"), int):
        return trace.run["start_ns"]
    walls = [p.header["wall_ns"] for p in trace.processes
             if p.header and isinstance(p.header.get("wall_ns"), int)]
    return min(walls) if walls else None


def _hosts(trace: Trace) -> set[str]:
    return {str(p.header["host"]) for p in trace.processes
            if p.header and p.header.get("host")}


def _run_id(trace: Trace) -> str | None:
    if trace.run and isinstance(trace.run.get("run_id"), str):
        return trace.run["run_id"]
    for proc in trace.processes:
        if proc.header and isinstance(proc.header.get("run_id"), str):
            return proc.header["run_id"]
    return None


def trace_dirs(path: str | Path) -> list[Path]:
    """`path` and the directories below it (MAX_DEPTH levels) that hold a trace."""
    root = Path(path)
    if not root.exists():
        raise TraceError(f"{root}: does not exist")
    if root.is_file():
        return [root]
    found = []
    base_depth = len(root.parts)
    for here, subdirs, files in os.walk(root, followlinks=True):  # depth-bounded
        if any(f == "run.json" or (f.startswith("p") and f.endswith(".jsonl")) for f in files):
            found.append(Path(here))
        subdirs[:] = sorted(d for d in subdirs if not d.startswith("."))
        if len(Path(here).parts) - base_depth >= MAX_DEPTH:
            subdirs[:] = []
    return found


def find_runs(paths: list[str | Path] | str | Path) -> list[RunInfo]:
    """The runs under `paths`, oldest first; TraceError when there is no trace at all."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    runs: dict[Any, RunInfo] = {}
    seen: set[Path] = set()
    for path in paths:
        dirs = trace_dirs(path)
        if not dirs:
            raise TraceError(f"{path}: no trace here (no run.json or p<pid>.jsonl in it or "
                             f"in its subdirectories, {MAX_DEPTH} levels down)")
        for d in dirs:
            resolved = d.resolve()
            if resolved in seen:
                continue
            seen.add(resolved)
            trace = open_trace(d)
            run_id = _run_id(trace)
            key = run_id if run_id is not None else ("dir", resolved)
            runs.setdefault(key, RunInfo(run_id)).traces.append(trace)
    return sorted(runs.values(), key=lambda r: (r.start_ns or 0, str(r.run_id)))


def describe_start(ns: int | None) -> str:
    if ns is None:
        return "start unknown"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ns / 1e9))


def select_run(runs: list[RunInfo], run_id: str | None = None,
               where: str = "") -> tuple[RunInfo, str | None]:
    """The run a command means: `run_id`, else the only one, else the newest (and a note)."""
    if run_id is not None:
        chosen = [r for r in runs if r.run_id == run_id]
        if not chosen:
            known = ", ".join(str(r.run_id) for r in runs)
            raise TraceError(f"{where}: no run {run_id!r} here (runs: {known})")
        return chosen[0], None
    newest = runs[-1]
    if len(runs) == 1:
        return newest, None
    note = (f"{where} holds {len(runs)} runs: opened the newest, run {newest.run_id} "
            f"({describe_start(newest.start_ns)}, {shorten(' '.join(newest.argv), 60)}) in "
            f"{', '.join(str(d) for d in newest.dirs)}; `mlatrace report --list {where}` "
            "lists them, `--run ID` picks one")
    return newest, note


def combine(run: RunInfo) -> Trace:
    """One Trace of every directory of `run`: files named by their path from the common root."""
    if len(run.traces) == 1:
        return run.traces[0]
    dirs = [t.root.resolve() for t in run.traces]
    root = Path(os.path.commonpath(dirs))
    problems: list[Problem] = []
    processes: list[ProcessFile] = []
    for trace in sorted(run.traces, key=lambda t: str(t.root.resolve())):
        rel = trace.root.resolve().relative_to(root)
        prefix = "" if str(rel) == "." else f"{rel.as_posix()}/"
        for p in trace.problems:  # run.json problems; the files' are found again below
            if p.file == "run.json":
                problems.append(Problem(prefix + p.file, p.line, p.reason))
        for old in trace.processes:
            proc = ProcessFile(old.path, problems, label=prefix + old.path.name)
            proc.read_header()
            processes.append(proc)
    _pid_clashes(processes, problems)
    primary = min((t for t in run.traces if t.run),
                  key=lambda t: _start_ns(t) or 0, default=None)
    return Trace(root, primary.run if primary else None, processes, problems,
                 dirs=[t.root for t in run.traces], runs=[t.run for t in run.traces if t.run])


PID_HOST_STRIDE = 10_000_000  # above Linux's largest pid (2**22): host N's pid p is N*stride+p


def _pid_clashes(processes: list[ProcessFile], problems: list[Problem]) -> None:
    """Give processes of a host whose pids another host also has (containers: every pod
    starts at pid 1) pids of their own: host N's pid p (and ppid) read as N*10,000,000 + p,
    the real pid kept in the header's `host_pid`. The analysis, the report and the
    exports key processes by pid; lineage stays within each host."""
    by_host: dict[str, list[ProcessFile]] = {}
    for proc in processes:
        if proc.header is not None and isinstance(proc.header.get("pid"), int):
            by_host.setdefault(str(proc.header.get("host")), []).append(proc)
    taken: set[int] = set()
    for index, host in enumerate(sorted(by_host)):
        procs = by_host[host]
        pids = {p.header["pid"] for p in procs}
        if pids & taken:
            for proc in procs:
                proc.header_overrides = alias_pids(proc.header, index)
                proc.header.update(proc.header_overrides)
            problems.append(Problem(procs[0].name.rsplit("/", 1)[0] if "/" in procs[0].name
                                    else procs[0].name, 0,
                                    f"host {host} has pids another host has too: its pids "
                                    f"read as {index}*{PID_HOST_STRIDE:,} + pid (the real "
                                    "pid is the header's host_pid)"))
            pids = {p.header["pid"] for p in procs}
        taken |= pids


def alias_pids(header: dict[str, Any], index: int) -> dict[str, Any]:
    """The header fields that give host number `index` its own pids."""
    out: dict[str, Any] = {"host_pid": header["pid"],
                           "pid": index * PID_HOST_STRIDE + header["pid"]}
    if isinstance(header.get("ppid"), int):
        out["ppid"] = index * PID_HOST_STRIDE + header["ppid"]
    return out


def open_run(paths: list[str | Path] | str | Path,
             run_id: str | None = None) -> tuple[Trace, RunInfo, str | None]:
    """Resolve CLI path arguments to one run: (its Trace, the RunInfo, a note for the user).

    `paths`: trace directories, parents holding them (a host directory per host, or
    several runs), or one process file. Directories sharing a run_id are one run; of
    several runs the newest is opened unless `run_id` names one, and the note says so.
    TraceError when no trace is found.
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    if len(paths) == 1 and Path(paths[0]).is_file():
        trace = open_trace(paths[0])
        return trace, RunInfo(_run_id(trace), [trace]), None
    runs = find_runs(paths)
    chosen, note = select_run(runs, run_id, " ".join(str(p) for p in paths))
    return combine(chosen), chosen, note


__all__ = ["RunInfo", "combine", "find_runs", "open_run", "select_run", "trace_dirs"]
