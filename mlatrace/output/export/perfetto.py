"""Chrome trace-event JSON from a trace, for ui.perfetto.dev (or chrome://tracing).

One process track per traced process and one thread track per recording thread;
captures are complete slices ("X") from begin to end, kernel launches, split
decisions, attention calls and the rest are thread instants ("i") with the record's
fields as args, replays are instants on their thread, or slices on a per-graph
"replays of gid N (GPU time)" track when the record has GPU time, the latest
attention metadata's seq_len_max is a counter, and findings are global markers
placed at their first evidence record. Timestamps are microseconds since the
earliest process start of the trace (its epoch ns is `otherData.origin_wall_ns`).

Clocks: each process's records are placed by its header's wall clock (time.time_ns at
start) plus its own monotonic offsets. Processes of one host share that host's clock;
hosts' clocks are not aligned by mlatrace, so order across hosts is only as good as
their NTP/PTP sync (`otherData.clock` says so). In a run of several hosts each process
track is named with its host (pids that clash across hosts are aliased by the reader,
`mlatrace.trace.runs`, so every process keeps a track of its own).

Events are streamed in record order (a thread's records are in time order), so a
trace of any size is written in constant memory. Standard library, and msgspec's
encoder when it is installed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from typing import Any

from mlatrace.kinds import (
    ATTN_CALL,
    ATTN_METADATA,
    CAPTURE_BEGIN,
    CAPTURE_END,
    KERNEL_LAUNCH,
    KERNEL_SKIP,
    KERNEL_SPLIT,
    MARK,
    PROCESS,
    PROCESS_END,
    REPLAY,
    REPLAY_TIME,
    STEADY,
    SYNC,
)

# Thread idents are addresses (> 2**32), which trace viewers may not take as tids: each
# thread's track is numbered 1, 2, ... in order of appearance, its ident in the track name.
# Replays with GPU time go on one track per graph, tid GPU_TID_BASE + gid, because a wrapper
# graph's replay and the torch graph's replay it causes overlap in time.
GPU_TID_BASE = 100_000
MAX_REPLAYS_AWAITING_TIME = 4096  # replay timestamps kept for graph.replay.time records


_NAMES = {  # kind: (the slice's word, the record fields after it)
    KERNEL_LAUNCH: ("launch", ("name",)),
    KERNEL_SKIP: ("skip", ("name",)),
    KERNEL_SPLIT: ("split", ("op", "=", "num_kv_splits")),
    ATTN_CALL: ("attn", ("op",)),
    MARK: ("mark", ("name",)),
    REPLAY: ("replay", ("gid=",)),
    SYNC: ("sync", ("op",)),
}


def _name(rec: dict) -> str:
    """A short, readable slice/instant name for a record."""
    kind = rec.get("k")
    spec = _NAMES.get(kind) if isinstance(kind, str) else None
    if spec is None:
        return str(kind)
    word, parts = spec
    text = [word]
    for part in parts:
        if part == "=":
            text.append("=")
        elif part.endswith("="):
            text.append(f"{part}{rec.get(part[:-1])}")
        else:
            text.append(str(rec.get(part)))
    return " ".join(text)


def _args(rec: dict, *skip: str) -> dict[str, Any]:
    return {k: v for k, v in rec.items() if k not in ("k", "t", "tid", *skip)}


def _order(event: dict) -> tuple:
    # By time; at equal times the longer slice first, so that nesting holds.
    return (event["ts"], -event.get("dur", 0.0))


class _Timeline:
    """Turns each process's records into trace events; remembers where evidence records are."""

    def __init__(self, origin_ns: int, wanted: set[tuple[str, int]]) -> None:
        self.origin_ns = origin_ns
        self.wanted = wanted
        self.where: dict[tuple[str, int], tuple[float, int, int]] = {}  # (file, seq) -> ts,pid,tid
        self.end_ts = 0.0
        self.first_pid = 0
        self.hosts: list[str] = []             # shown in track names when there are several

    def process_events(self, proc: Any) -> Iterator[dict]:
        """Every event of one process, in record order, monotonic per track.

        A thread's records are in time order already; only a capture slice, known at its
        end but starting at its begin, needs its thread's events held back until the
        outermost capture of that thread ends.
        """
        header = proc.header
        pid = header.get("pid") if isinstance(header.get("pid"), int) else (proc.pid or 0)
        real_pid = header.get("host_pid", pid)  # a host whose pids clash reads them aliased
        wall_ns = int(header.get("wall_ns") or 0)
        argv = [str(a) for a in header.get("argv") or []]
        label = " ".join([os.path.basename(argv[0]), *argv[1:4]]) if argv else ""
        rank = header.get("rank")
        host = f"{header.get('host')} · " if len(self.hosts) > 1 else ""
        yield {"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
               "args": {"name": host + (f"rank {rank} · " if rank is not None else "")
                        + f"pid {real_pid} {label}".strip()}}
        if isinstance(rank, int):
            yield {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                   "args": {"sort_index": rank}}
        threads: dict[Any, int] = {}  # recorded thread ident -> track number
        open_captures: dict[Any, dict] = {}
        held: dict[int, list[dict]] = {}  # track -> events held while a capture is open there
        gpu_free: dict[int, float] = {}  # GPU track -> when its last replay slice ends
        replay_ts: dict[tuple, float] = {}  # (gid, n) -> ts of graph.replay, for its timing
        last_ts = 0.0
        for rec in proc.records():
            kind = rec.get("k")
            ts = (wall_ns + int(rec.get("t") or 0) - self.origin_ns) / 1000.0
            last_ts = max(last_ts, ts)
            if kind == PROCESS:
                continue
            tid = threads.setdefault(rec.get("tid"), len(threads) + 1)
            if (proc.name, rec.get("seq")) in self.wanted:
                self.where[(proc.name, rec["seq"])] = (ts, pid, tid)
            out: list[dict] = []
            base = {"pid": pid, "tid": tid, "ts": ts}
            if kind == REPLAY:
                replay_ts[(rec.get("gid"), rec.get("n"))] = ts
                if len(replay_ts) > MAX_REPLAYS_AWAITING_TIME:
                    del replay_ts[next(iter(replay_ts))]
            if kind == CAPTURE_BEGIN:
                name = " ".join(str(p) for p in ("capture", f"gid={rec.get('gid')}",
                                                 rec.get("src"), rec.get("mode")) if p)
                open_captures[rec.get("gid")] = {"ph": "X", "cat": "graph.capture", **base,
                                                 "name": name, "args": _args(rec)}
                held.setdefault(tid, [])
            elif kind == CAPTURE_END:
                event = open_captures.pop(rec.get("gid"), None)
                if event is not None:
                    event["dur"] = max(0.0, ts - event["ts"])
                    event["args"].update(_args(rec, "seq"))
                    out.append(event)
            elif kind in (REPLAY, REPLAY_TIME) \
                    and isinstance(rec.get("gpu_ns"), (int, float)) and rec["gpu_ns"] >= 0:
                gid = rec.get("gid")
                # a timing record is read after its replay ran: start at the replay's own ts
                host_ts = replay_ts.pop((gid, rec.get("n")), ts) if kind != REPLAY else ts
                track = GPU_TID_BASE + (gid if isinstance(gid, int) and gid >= 0 else 0)
                start = max(host_ts, gpu_free.get(track, 0.0))  # a graph's replays run in order
                gpu_free[track] = start + rec["gpu_ns"] / 1000.0
                self.end_ts = max(self.end_ts, gpu_free[track])
                yield {"ph": "X", "cat": REPLAY, **base, "tid": track, "ts": start,
                       "dur": rec["gpu_ns"] / 1000.0, "name": _name(rec),
                       "args": {**_args(rec), "host_tid": tid, "host_ts_us": host_ts}}
            elif kind == STEADY:
                # a fold of steady steps: one slice over the steps it stands for, with
                # counters, never replays that were not recorded one by one
                first = rec.get("t_first") if isinstance(rec.get("t_first"), int) else rec.get("t")
                start = (wall_ns + int(first or 0) - self.origin_ns) / 1000.0
                gpu = rec.get("gpu_ns") if isinstance(rec.get("gpu_ns"), dict) else {}
                out.append({"ph": "X", "cat": "steady", **base, "ts": start,
                            "dur": max(0.0, ts - start),
                            "name": f"steady gid={rec.get('gid')} x{rec.get('replays')}",
                            "args": {k: rec.get(k) for k in ("gid", "n_first", "n_last",
                                                             "replays", "steps", "fold",
                                                             "gpu_ns", "fields", "same")}})
                counters = {"replays": rec.get("replays"), "steps": rec.get("steps")}
                counters.update({f"gpu_{k}_us": v / 1000.0 for k, v in gpu.items()
                                 if k in ("p50", "max") and isinstance(v, (int, float))})
                yield {"ph": "C", "pid": pid, "tid": 0, "ts": start,
                       "name": f"steady gid={rec.get('gid')}", "args": counters}
            elif kind == PROCESS_END:
                out.append({"ph": "i", "s": "p", "cat": kind, **base, "name": kind,
                            "args": _args(rec)})
            else:  # instants: the known kinds above, and kinds this version does not know
                out.append({"ph": "i", "s": "t", "cat": str(kind), **base, "name": _name(rec),
                            "args": _args(rec)})
                if kind == ATTN_METADATA and isinstance(rec.get("seq_len_max"), int):
                    yield {"ph": "C", "pid": pid, "tid": 0, "ts": ts, "name": "seq_len_max",
                           "args": {"seq_len_max": rec["seq_len_max"]}}
            if tid in held:
                held[tid].extend(out)
                if not any(e["tid"] == tid for e in open_captures.values()):
                    yield from sorted(held.pop(tid), key=_order)
            else:
                yield from out
        for event in open_captures.values():  # the process ended mid-capture
            event["dur"] = max(0.0, last_ts - event["ts"])
            event["args"]["incomplete"] = True
            held.setdefault(event["tid"], []).append(event)
        for events in held.values():
            yield from sorted(events, key=_order)
        self.end_ts = max(self.end_ts, last_ts)
        main_ident = header.get("main_tid", header.get("tid"))
        for ident, tid in threads.items():
            yield {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                   "args": {"name": "main" if ident == main_ident else f"thread {ident}"}}
        for track in sorted(gpu_free):
            yield {"ph": "M", "name": "thread_name", "pid": pid, "tid": track,
                   "args": {"name": f"replays of gid {track - GPU_TID_BASE} (GPU time)"}}

    def finding_events(self, findings: Sequence[Any]) -> list[dict]:
        """Findings as global instants at their first located evidence record (else the end)."""
        out = []
        for f in findings:
            located = [self.where[(e.file, e.seq)] for e in f.evidence
                       if (e.file, e.seq) in self.where]
            ts, pid, tid = min(located) if located else (self.end_ts, self.first_pid, 0)
            out.append({"ph": "i", "s": "g", "cat": "finding", "pid": pid, "tid": tid, "ts": ts,
                        "name": f"{f.id} {getattr(f, 'name', '')}".strip(),
                        "args": {"severity": f.severity, "message": f.message, "hint": f.hint,
                                 "gid": f.gid, "rank": f.rank,
                                 "evidence": [str(e) for e in f.evidence]}})
        out.sort(key=lambda e: e["ts"])
        return out


def events(trace: Any, findings: Sequence[Any] = ()) -> Iterator[dict]:
    """Every trace event of a trace, process by process, findings last."""
    procs = [p for p in trace.processes if p.header]
    origin = min((int(p.header.get("wall_ns") or 0) for p in procs), default=0)
    wanted = {(e.file, e.seq) for f in findings for e in f.evidence}
    timeline = _Timeline(origin, wanted)
    timeline.hosts = hosts_of(trace)
    if procs and isinstance(procs[0].header.get("pid"), int):
        timeline.first_pid = procs[0].header["pid"]
    for proc in procs:
        yield from timeline.process_events(proc)
    yield from timeline.finding_events(findings)


def hosts_of(trace: Any) -> list[str]:
    return sorted({str(p.header.get("host")) for p in trace.processes
                   if p.header and p.header.get("host")})


def other_data(trace: Any) -> dict[str, Any]:
    """The document's otherData: time origin, hosts and what the clocks are."""
    hosts = hosts_of(trace)
    clock = ("each process placed by its host's wall clock at its start plus monotonic "
             "offsets")
    if len(hosts) > 1:
        clock += (f"; {len(hosts)} hosts whose clocks mlatrace does not align: order across "
                  "hosts is as good as their NTP/PTP sync")
    return {"origin_wall_ns": origin_wall_ns(trace), "generator": "mlatrace", "hosts": hosts,
            "clock": clock}


def origin_wall_ns(trace: Any) -> int:
    """Epoch ns of timestamp 0: the earliest process start."""
    return min((int(p.header.get("wall_ns") or 0) for p in trace.processes if p.header), default=0)


def build(trace: Any, findings: Sequence[Any] = ()) -> dict:
    """The whole trace-event document as a dict (small traces, tests)."""
    return {"traceEvents": list(events(trace, findings)), "displayTimeUnit": "ns",
            "otherData": other_data(trace)}


def _encoder() -> Any:
    """bytes of one event: msgspec when installed (several times faster), else json."""
    try:
        import msgspec

        return msgspec.json.Encoder(enc_hook=str).encode
    except ImportError:
        return lambda event: json.dumps(event, separators=(",", ":"), default=str).encode()


def write(trace: Any, out: str, findings: Sequence[Any] = ()) -> int:
    """Write the Perfetto JSON of a trace to `out`, streaming; returns the number of events."""
    encode = _encoder()
    tmp = f"{out}.tmp"
    count = 0
    with open(tmp, "wb") as f:
        f.write(b'{"traceEvents":[\n')
        for event in events(trace, findings):
            if count:
                f.write(b",\n")
            f.write(encode(event))
            count += 1
        other = other_data(trace)
        f.write(b'],"displayTimeUnit":"ns","otherData":' + encode(other) + b"}\n")
    os.replace(tmp, out)
    return count
