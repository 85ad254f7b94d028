"""What `mlatrace watch` knows about a run while it is written: tail, model, findings.

`LiveRun` joins the stages of the data's path for a trace still growing: the tailing
reader (`mlatrace.trace.tail`) hands each file's new records to the incremental model
(`mlatrace.analysis.builder.IncrementalBuilder`, the builder `report` uses), and each
refresh runs the rules on a snapshot of that model (cheap: the model holds aggregates,
never records). The finding log remembers when each finding first appeared and marks
it resolved when later evidence contradicts it: the rules no longer report it (e.g. the
split-deciding call turned out to run eagerly between graph segments), or its graph's
batch descriptor was captured again later and the new capture shows no such finding.
"""

from __future__ import annotations

import gc
import socket
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlatrace.analysis import Analysis, Config, Finding, analyze_model
from mlatrace.analysis.builder import IncrementalBuilder
from mlatrace.analysis.model import GraphModel, TraceModel
from mlatrace.analysis.parallel import FEED_PARALLEL_MIN_BYTES
from mlatrace.common import pid_alive
from mlatrace.trace import ProcessFile, TraceError
from mlatrace.trace.runs import find_runs
from mlatrace.trace.tail import TailReader

RATE_WINDOW_S = 5.0


def newest_run(path: str | Path) -> list[Path]:
    """The directories of the run to follow under `path`, as `report` resolves them.

    The runs are the ones `mlatrace.trace.runs.find_runs` finds (directories sharing a
    run_id are one run, a few levels down); of several, the newest. The tailing reader
    follows each directory and its direct subdirectories, so a host directory inside
    another directory of the run is not listed again. Empty when there is no trace
    (or `path` is a file: a live run is a directory).
    """
    root = Path(path)
    if not root.is_dir():
        return []
    try:
        runs = find_runs(root)
    except TraceError:
        return []
    dirs = runs[-1].dirs
    listed = set(dirs)
    return [d for d in dirs if d.parent not in listed]


def finding_key(f: Finding) -> tuple:
    """A finding's identity while its numbers (replay counts, lengths) keep growing."""
    d = f.details
    return (f.id, f.pid, f.gid, d.get("captured_gid"), str(d.get("key")), str(d.get("op")),
            str(d.get("buffer")), str(d.get("value")), d.get("capturing"))


@dataclass
class LoggedFinding:
    """A finding as the watch saw it: when it appeared, whether it still holds."""

    finding: Finding
    # wall clock (s since the epoch) of the latest record its evidence points at when it
    # first appeared (`evidence_time`); of the refresh that found it where none is dated
    first_seen: float
    resolved_at: float | None = None
    resolved_why: str | None = None

    @property
    def active(self) -> bool:
        return self.resolved_at is None


@dataclass
class ProcessState:
    proc: ProcessFile
    state: str          # running, ended (reason), gone (no process.end)
    ended: bool


@dataclass
class LiveRun:
    """A run followed live: feed with `poll()`, look with `refresh()`, end with `close()`."""

    roots: list[Path]
    config: Config = field(default_factory=Config)
    clock: Any = time.time
    tail: TailReader = field(init=False)
    builder: IncrementalBuilder = field(init=False)
    analysis: Analysis | None = field(default=None, init=False)
    log: dict[tuple, LoggedFinding] = field(default_factory=dict, init=False)
    records: int = field(default=0, init=False)
    started: float = field(init=False)
    closed: bool = field(default=False, init=False)
    _counts: deque = field(default_factory=deque, init=False)
    _analysed_records: int = field(default=-1, init=False)
    _analysed_problems: int = field(default=-1, init=False)

    def __post_init__(self) -> None:
        self.tail = TailReader(self.roots, typed=True)  # records for the builder
        self.builder = IncrementalBuilder(root=str(self.roots[0]))
        self.started = self.clock()

    # -- feeding -----------------------------------------------------------------
    def poll(self) -> int:
        """Read what was appended since the last poll into the model; returns how many records."""
        gc_was_enabled = gc.isenabled()
        gc.disable()  # a backlog is many short-lived dicts without cycles (as build_model)
        try:
            pieces = self.tail.poll()
            backlog = self.tail.pending >= FEED_PARALLEL_MIN_BYTES
            added = self.builder.feed_files(pieces, parallel=backlog and len(pieces) > 1)
        finally:
            if gc_was_enabled:
                gc.enable()
        self.records += added
        return added

    def close(self) -> Analysis:
        """The run is over: read the rest (truncated last lines included) and refresh."""
        if not self.closed:
            for proc, chunks in self.tail.close():
                self.records += self.builder.feed(proc, [])  # a file without records too
                for records in chunks:
                    self.records += self.builder.feed(proc, records)
            self.closed = True
            self._analysed_records = -1  # files without records are in the model now
        return self.refresh()

    # -- looking -----------------------------------------------------------------
    def refresh(self) -> Analysis:
        """Rules on the current model; updates the finding log and the replay-rate window.

        Nothing read since the last refresh: the analysis is kept (an idle trace costs no
        rule evaluation), only the rate window moves on.
        """
        now = self.clock()
        if self.analysis is not None and self.records == self._analysed_records \
                and len(self.tail.problems) == self._analysed_problems:
            self._count_replays(now, self.analysis.model)
            return self.analysis
        self._analysed_records, self._analysed_problems = self.records, len(self.tail.problems)
        model = self.builder.snapshot(self.tail.problems, self.tail.processes())
        self.analysis = analyze_model(model, self.config)
        current = {finding_key(f): f for f in self.analysis.findings}
        for key, finding in current.items():
            logged = self.log.get(key)
            if logged is None:
                self.log[key] = LoggedFinding(finding, self.evidence_time(finding) or now)
            else:
                logged.finding = finding
                logged.resolved_at = logged.resolved_why = None
        for key, logged in self.log.items():
            if key not in current and logged.active:
                logged.resolved_at, logged.resolved_why = now, "no longer holds on later records"
        for key, finding in current.items():
            newer = recaptured(model, finding)
            if newer is not None and not any(
                    f.id == finding.id and f.pid == finding.pid and f.gid in newer[1]
                    for f in current.values()):
                logged = self.log[key]
                logged.resolved_at = logged.resolved_at or now
                logged.resolved_why = f"captured again as gid {newer[0].gid}, without it"
        self._count_replays(now, model)
        return self.analysis

    def evidence_time(self, finding: Finding) -> float | None:
        """When the finding's evidence was recorded: the wall clock of the latest record it
        points at (the header's wall_ns + the record's t), None where none can be dated.
        Read from the files (trace.seek: a few reads each), once per new finding."""
        from mlatrace.trace.seek import record_at

        files = {p.name: p for p in self.tail.processes()}
        latest = None
        for e in finding.evidence:
            proc = files.get(e.file)
            wall = (proc.header or {}).get("wall_ns") if proc is not None else None
            if type(wall) is not int:
                continue
            rec = record_at(proc.path, e.seq)
            t = rec.get("t") if rec is not None else None
            if type(t) is int and (latest is None or wall + t > latest):
                latest = wall + t
        return None if latest is None else latest / 1e9

    def _count_replays(self, now: float, model: TraceModel) -> None:
        self._counts.append((now, {g_key(g): g.replays.count for g in model.graphs.values()}))
        while len(self._counts) > 2 and now - self._counts[1][0] >= RATE_WINDOW_S:
            self._counts.popleft()

    @property
    def model(self) -> TraceModel:
        assert self.analysis is not None, "refresh() first"
        return self.analysis.model

    def findings(self) -> list[LoggedFinding]:
        """Every finding seen, active first, in the order they appeared."""
        return sorted(self.log.values(), key=lambda lf: (not lf.active, lf.first_seen))

    def replay_rate(self, graph: GraphModel) -> float | None:
        """Replays per second of `graph` over the last few seconds (None before two refreshes)."""
        if len(self._counts) < 2:
            return None
        (t0, old), (t1, new) = self._counts[0], self._counts[-1]
        if t1 <= t0:
            return None
        key = g_key(graph)
        return (new.get(key, 0) - old.get(key, 0)) / (t1 - t0)

    def run_json(self) -> dict[str, Any] | None:
        return self.tail.run

    def processes(self) -> list[ProcessState]:
        """Each process file with its state: running, ended, or gone without process.end."""
        run_over = self.run_over_by_launcher()
        here = socket.gethostname()
        out = []
        for proc in self.tail.processes():
            end = proc.end
            if end is not None:
                out.append(ProcessState(proc, f"ended ({end.get('reason', '?')})", True))
                continue
            header = proc.header or {}
            pid = header.get("pid", proc.pid)  # no header yet: the pid of the file's name
            host = header.get("host", (self.tail.run or {}).get("host", here))
            gone = run_over or (host == here and isinstance(pid, int) and not pid_alive(pid))
            out.append(ProcessState(proc, "gone (no process.end)" if gone else "running", gone))
        return out

    def run_over_by_launcher(self) -> bool:
        run = self.tail.run
        return bool(run and run.get("end_ns"))

    def finished(self) -> bool:
        """Every process of the run has ended: the launcher wrote its end in run.json (it
        does so once the command and its stragglers exited); or, with no launcher (none
        wrote run.json, or the one on this host is gone: SIGKILL), every process file holds
        its process.end or its process is gone (`processes`: killed without one)."""
        run = self.tail.run
        if run is not None:
            if self.run_over_by_launcher():
                return True
            launcher = run.get("launcher_pid")
            if not isinstance(launcher, int) or run.get("host") != socket.gethostname() \
                    or pid_alive(launcher):
                return False
        procs = self.processes()
        return bool(procs) and all(p.ended for p in procs)


def g_key(graph: GraphModel) -> tuple:
    return graph.pid, graph.gid


def recaptured(model: TraceModel, finding: Finding) -> tuple[GraphModel, set[int]] | None:
    """A later capture of the finding's batch descriptor in the same process, if any:
    (its root graph, the gids of its subtree)."""
    gid = finding.details.get("captured_gid", finding.gid)
    graph = model.graph(finding.pid, gid if isinstance(gid, int) else None)
    if graph is None:
        return None
    root = model.ancestors(graph)[-1]
    key = model.effective_key(root)
    if key is None or root.begin is None:
        return None
    later = [g for g in model.graphs.values()
             if g.pid == root.pid and g is not root and model.graph(g.pid, g.parent) is None
             and g.begin is not None and g.begin.seq > root.begin.seq
             and model.effective_key(g) == key and g.end is not None]
    if not later:
        return None
    newest = max(later, key=lambda g: g.begin.seq)
    return newest, {g.gid for g in model.subtree(newest)}
