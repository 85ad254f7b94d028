"""Chrome trace-event JSON from a trace, for ui.perfetto.dev (or chrome://tracing).

One process track per traced process and one thread track per recording thread;
captures are complete slices ("X") from begin to end, kernel launches, split
decisions, attention calls and the rest are thread instants ("i") with the record's
fields as args, replays are instants on their thread, or slices on a per-process
"graph replays (GPU)" track when the record has GPU time, and findings are global
markers. Timestamps are microseconds since the earliest process start of the trace
(the epoch time of that origin is in `otherData.origin_wall_ns`); events are sorted
so that every track is monotonic.

Standard library only.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

# Records shown as instants on their thread; the rest of the known kinds have their own shape.
INSTANT_KINDS = {
    "kernel.launch", "kernel.split", "kernel.skip", "attn.call", "attn.metadata", "dispatch",
    "sync", "graph.eager_break", "graph.nodes", "mark", "probe.error", "process.rank",
}
# The replay-with-GPU-time track of a process: a tid no real thread uses (idents are addresses).
GPU_TID = 1


def _name(rec: dict) -> str:
    """A short, readable slice/instant name for a record."""
    kind = rec.get("k")
    if kind in ("kernel.launch", "kernel.skip"):
        return f"launch {rec.get('name')}" if kind == "kernel.launch" else f"skip {rec.get('name')}"
    if kind == "kernel.split":
        return f"split {rec.get('op')} = {rec.get('num_kv_splits')}"
    if kind == "attn.call":
        return f"attn {rec.get('op')}"
    if kind == "mark":
        return f"mark {rec.get('name')}"
    if kind == "graph.replay":
        return f"replay gid={rec.get('gid')}"
    if kind == "sync":
        return f"sync {rec.get('op')}"
    return str(kind)


def _args(rec: dict, *skip: str) -> dict[str, Any]:
    return {k: v for k, v in rec.items() if k not in ("k", "t", "tid", *skip)}


class _Builder:
    """Collects the events of every process, then orders them per track."""

    def __init__(self, origin_ns: int) -> None:
        self.origin_ns = origin_ns
        self.meta: list[dict] = []
        self.events: list[dict] = []
        self.where: dict[tuple[str, int], tuple[float, int, Any]] = {}  # (file, seq) -> ts,pid,tid
        self.counts: dict[str, int] = {}

    def us(self, wall_ns: int, t: int) -> float:
        return (wall_ns + t - self.origin_ns) / 1000.0

    def add_process(self, proc: Any) -> None:
        header = proc.header
        pid = header.get("pid") if isinstance(header.get("pid"), int) else proc.pid or 0
        wall_ns = int(header.get("wall_ns") or 0)
        argv = header.get("argv") or []
        rank = header.get("rank")
        label = " ".join(os.path.basename(str(a)) if i == 0 else str(a) for i, a in enumerate(argv[:4]))
        name = (f"rank {rank} · " if rank is not None else "") + f"pid {pid} {label}".strip()
        self.meta.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                          "args": {"name": name}})
        if rank is not None:
            self.meta.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                              "args": {"sort_index": int(rank)}})
        main_tid = header.get("tid")
        threads: set[Any] = set()
        open_captures: dict[Any, dict] = {}
        gpu_free = 0.0  # when the last GPU replay slice of this process ends (they run in order)
        last_ts = 0.0
        for rec in proc.records():
            kind = rec.get("k")
            self.counts[kind] = self.counts.get(kind, 0) + 1
            ts = self.us(wall_ns, int(rec.get("t") or 0))
            last_ts = max(last_ts, ts)
            tid = rec.get("tid") if isinstance(rec.get("tid"), int) else 0
            self.where[(proc.name, rec.get("seq"))] = (ts, pid, tid)
            if kind == "process":
                continue
            threads.add(tid)
            if kind == "graph.capture.begin":
                open_captures[rec.get("gid")] = {
                    "ph": "X", "cat": "graph.capture", "pid": pid, "tid": tid, "ts": ts,
                    "name": f"capture gid={rec.get('gid')} {rec.get('src') or ''} {rec.get('mode') or ''}".strip(),
                    "args": _args(rec)}
            elif kind == "graph.capture.end":
                event = open_captures.pop(rec.get("gid"), None)
                if event is not None:
                    event["dur"] = max(0.0, ts - event["ts"])
                    event["args"].update(_args(rec, "seq"))
                    self.events.append(event)
            elif kind == "graph.replay":
                gpu_ns = rec.get("gpu_ns")
                if isinstance(gpu_ns, (int, float)) and gpu_ns >= 0:
                    start = max(ts, gpu_free)
                    gpu_free = start + gpu_ns / 1000.0
                    self.events.append({"ph": "X", "cat": "graph.replay", "pid": pid, "tid": GPU_TID,
                                        "ts": start, "dur": gpu_ns / 1000.0, "name": _name(rec),
                                        "args": {**_args(rec), "host_tid": tid, "host_ts_us": ts}})
                else:
                    self.events.append({"ph": "i", "s": "t", "cat": "graph.replay", "pid": pid,
                                        "tid": tid, "ts": ts, "name": _name(rec), "args": _args(rec)})
            elif kind in INSTANT_KINDS:
                self.events.append({"ph": "i", "s": "t", "cat": kind, "pid": pid, "tid": tid,
                                    "ts": ts, "name": _name(rec), "args": _args(rec)})
                if kind == "attn.metadata" and isinstance(rec.get("seq_len_max"), int):
                    self.events.append({"ph": "C", "pid": pid, "tid": 0, "ts": ts,
                                        "name": "seq_len_max",
                                        "args": {"seq_len_max": rec["seq_len_max"]}})
            elif kind == "process.end":
                self.events.append({"ph": "i", "s": "p", "cat": kind, "pid": pid, "tid": tid,
                                    "ts": ts, "name": "process.end", "args": _args(rec)})
            else:  # a kind this version does not know: keep it visible
                self.events.append({"ph": "i", "s": "t", "cat": str(kind), "pid": pid, "tid": tid,
                                    "ts": ts, "name": str(kind), "args": _args(rec)})
        for event in open_captures.values():  # the process ended mid-capture
            event["dur"] = max(0.0, last_ts - event["ts"])
            event["args"]["incomplete"] = True
            self.events.append(event)
        for tid in sorted(threads):
            label = "main" if tid == main_tid else f"thread {tid}"
            self.meta.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                              "args": {"name": label}})
        if gpu_free:
            self.meta.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": GPU_TID,
                              "args": {"name": "graph replays (GPU time)"}})

    def add_findings(self, findings: Sequence[Any], first_pid: int) -> None:
        end = max((e["ts"] + e.get("dur", 0.0) for e in self.events), default=0.0)
        for f in findings:
            located = [self.where[(e.file, e.seq)] for e in f.evidence
                       if (e.file, e.seq) in self.where]
            ts, pid, tid = min(located, key=lambda x: x[0]) if located else (end, first_pid, 0)
            self.events.append({
                "ph": "i", "s": "g", "cat": "finding", "pid": pid, "tid": tid, "ts": ts,
                "name": f"{f.id} {getattr(f, 'name', '')}".strip(),
                "args": {"severity": f.severity, "message": f.message, "hint": f.hint,
                         "gid": f.gid, "rank": f.rank,
                         "evidence": [str(e) for e in f.evidence]}})

    def document(self, origin_ns: int) -> dict:
        # Sort per track by time; at equal times the longer slice first so nesting holds.
        self.events.sort(key=lambda e: (e["pid"], e["tid"], e["ts"], -e.get("dur", 0.0)))
        return {"traceEvents": self.meta + self.events, "displayTimeUnit": "ns",
                "otherData": {"origin_wall_ns": origin_ns, "generator": "mlatrace"}}


def build(trace: Any, findings: Sequence[Any] = ()) -> dict:
    """The trace-event document (a dict ready for json.dump) of a whole trace."""
    procs = [p for p in trace.processes if p.header]
    origin = min((int(p.header.get("wall_ns") or 0) for p in procs), default=0)
    builder = _Builder(origin)
    for proc in procs:
        builder.add_process(proc)
    first_pid = procs[0].header.get("pid") if procs else 0
    builder.add_findings(findings, first_pid if isinstance(first_pid, int) else 0)
    return builder.document(origin)


def write(trace: Any, out: str, findings: Sequence[Any] = ()) -> int:
    """Write the Perfetto JSON of a trace to `out`; returns the number of trace events."""
    doc = build(trace, findings)
    tmp = f"{out}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, separators=(",", ":"), default=str)
    os.replace(tmp, out)
    return len(doc["traceEvents"])
