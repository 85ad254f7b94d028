"""Streaming builder: one pass over each process file of a trace fills the TraceModel."""

from __future__ import annotations

import gc
import json
import os
import pickle
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from mlatrace.analysis.model import (
    GPU_HIST_BITS,
    MAX_DISTINCT,
    MAX_MARKS,
    MAX_NODES,
    MAX_SYNC_SITES,
    REPLAY_INPUTS,
    AttentionStats,
    CallShape,
    DecisionShape,
    EagerDecision,
    GraphModel,
    LaunchShape,
    ProcessModel,
    Ref,
    ReplayStats,
    SplitDecision,
    SyncSite,
    TraceModel,
    Unpickled,
    _int,
)
from mlatrace.analysis.parallel import _build_parallel, _default_workers, _pid_groups
from mlatrace.analysis.series import FLUSH_AT, Series, add_point
from mlatrace.common import hashable
from mlatrace.trace import Problem, RecordChunk
from mlatrace.trace.typed import TYPED_KINDS, Record, to_record

MAX_PROBE_ERRORS = 200     # probe.error records kept per process (all are counted in kinds)
_GPU_ROUNDED_FROM = 1 << GPU_HIST_BITS   # GPU times from here on lose their low bits


def _flush_ptr_run(stats: ReplayStats) -> None:
    """Add the replays that repeated the last pointer set to its per-name counts."""
    if stats.ptr_run_count and stats.ptr_run is not None:
        for name, ptr in stats.ptr_run.items():
            entry = stats.ptrs.get(name, {}).get(ptr)
            if entry is not None:
                entry[0] += stats.ptr_run_count
    stats.ptr_run_count = 0




def _add_step_syncs(sites: dict, pid: int | None, file: str,
                    records: Iterable[tuple[dict, str]]) -> None:
    """Count (sync record, side) pairs into per-(pid, op, where) sites (at most
    MAX_SYNC_SITES * 4); a site keeps the side of its first sync."""
    for rec, side in records:
        op, where = _text(rec.get("op")), rec.get("where")
        key = (pid, op, hashable(where))
        site = sites.get(key)
        if site is not None:
            site.count += 1
        elif len(sites) < MAX_SYNC_SITES * 4:
            seq = rec.get("seq")
            sites[key] = SyncSite(Ref(file, seq if isinstance(seq, int) else -1, "sync"),
                                  op, where, False, None, side=side)


def _text(value: Any) -> str | None:
    """A name-like field: strings pass, None stays None, anything else becomes its str()."""
    if value is None or isinstance(value, str):
        return value
    return str(value)


def _key_text(key: Any) -> str | int | None:
    """A batch descriptor as one short string: {"num_tokens": 2} -> "num_tokens=2"."""
    if key is None or isinstance(key, (str, int)):
        return key
    if isinstance(key, dict):
        return ", ".join(f"{k}={json.dumps(v) if not isinstance(v, str) else v}"
                         for k, v in key.items())
    return json.dumps(key) if isinstance(key, list) else str(key)


def _in_capture_setup(where: Any) -> bool:
    """A sync whose stack is torch.cuda.graph's own capture set-up (torch/cuda/graphs.py)."""
    frames = where if isinstance(where, list) else [where]
    return any(isinstance(f, str) and "torch/cuda/graphs.py" in f.replace("\\", "/")
               for f in frames[:1])


def _dict(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def _grid(value: Any) -> tuple | None:
    if isinstance(value, (list, tuple)):
        return tuple(value)
    return None


def _infer_role(proc: ProcessModel, pids: set[int | None], captured: bool) -> str:
    """A short name for what the process is, from its rank, argv and lineage."""
    argv = proc.argv
    text = " ".join(argv)
    suffix = ", captures graphs" if captured else ""
    if proc.rank is not None:
        role = f"rank {proc.rank}" + (f"/{proc.world_size}" if proc.world_size else "")
    elif "resource_tracker" in text:
        role = "resource tracker"
    elif "spawn_main" in text or "--multiprocessing-fork" in text or "forkserver" in text:
        role = "mp spawn child"
    elif any(a.endswith("vllm") for a in argv[:3]) and "serve" in argv:
        role = "vllm serve"
    elif "-m" in argv[:-1]:
        role = "-m " + argv[argv.index("-m") + 1]
    elif "-c" in argv:
        role = "python -c"
    elif len(argv) > 1:
        role = os.path.basename(argv[1])
    else:
        role = "process"
    if proc.ppid not in pids and proc.rank is None:
        role += " (root)"
    return role + suffix


class _ProcessBuilder(Unpickled):
    """Streams one process file into the model (per-thread host state, capture stacks)."""

    def __init__(self, model: TraceModel, proc_file: Any) -> None:
        self.model = model
        self.file = getattr(proc_file, "name", None) or str(getattr(proc_file, "path", "?"))
        header = proc_file.header if isinstance(getattr(proc_file, "header", None), dict) else None
        pid = _int(getattr(proc_file, "pid", None))
        if pid is None and header:
            pid = _int(header.get("pid"))
        self.pid = pid
        self.proc = ProcessModel(file=self.file, pid=pid)
        self.stacks: dict[Any, list[int]] = {}
        # tid -> its latest attn.metadata record, with the fields every replay reads
        # (seq_len_max, seq_len_min: ints or None; ptrs: a dict or None), read once
        self.metadata: dict[Any, tuple[dict, int | None, int | None, dict | None]] = {}
        # tid -> {ptr name: (ptr, record)} of the step's earlier metadata records: one step
        # may fill buffers in several builds (an engine's runner, then its attention backend,
        # or the reverse); the replay after them sees every buffer named
        self.step_ptrs: dict[Any, dict[str, tuple[Any, dict]]] = {}
        self.md_since_replay: set[Any] = set()  # tids with metadata no replay has read yet
        self.md_stats: dict[str, AttentionStats] = {}  # backend -> its attn.metadata stats
        self.by_gid: dict[Any, GraphModel] = {}
        self.replaying: set[Any] = set()
        self.eager_decisions: dict[Any, dict[str, dict]] = {}  # tid -> name -> latest eager record
        self.last_replay_seq: dict[Any, int] = {}  # tid -> seq of its latest replay or capture begin
        self.pending_syncs: dict[Any, list[tuple[dict, str]]] = {}  # tid -> (sync, side)
        # since its last replay
        # this process's decode-step syncs, confirmed by a later replay; finish() publishes
        # them with the pending ones into model.step_syncs
        self.step_syncs: dict[tuple[int | None, Any, Any], SyncSite] = {}
        # replay input ranges are only read for captured decisions, which precede replays
        self.track_inputs = False
        # tid -> the set-up records of its latest fold (`steady` with a pattern), as the
        # [lo, hi] record pair each replay of that fold saw (read by the fold's other graphs)
        self.fold_setup: dict[Any, list[tuple[str, dict, dict]]] = {}

    # -- helpers -------------------------------------------------------------
    def _ref(self, rec: dict, kind: str) -> Ref:
        seq = rec.get("seq")
        return Ref(self.file, seq if isinstance(seq, int) else -1, kind)

    def _graph(self, gid: int) -> GraphModel:
        key = (self.pid, gid)
        graph = self.model.graphs.get(key)
        if graph is None:
            graph = GraphModel(pid=self.pid, file=self.file, gid=gid)
            self.model.graphs[key] = graph
        return graph

    def _capture_gid(self, rec: dict) -> int | None:
        """The innermost capture a record belongs to, or None when it ran eagerly."""
        capturing = rec.get("capturing")
        if capturing is False:
            return None
        gid = _int(rec.get("gid"))
        if gid is not None:
            return gid
        stack = self.stacks.get(rec.get("tid"))
        if stack:
            return stack[-1]
        return None

    # -- records -------------------------------------------------------------
    def header(self, rec: dict) -> None:
        p = self.proc
        p.has_header = True
        p.schema = rec.get("schema") if isinstance(rec.get("schema"), str) else None
        if p.pid is None:
            p.pid = self.pid = _int(rec.get("pid"))
        p.ppid = _int(rec.get("ppid"))
        p.rank = _int(rec.get("rank"))
        p.world_size = _int(rec.get("world_size"))
        argv = rec.get("argv")
        p.argv = [str(a) for a in argv] if isinstance(argv, list) else []
        p.versions = _dict(rec.get("versions"))
        p.device = _dict(rec.get("device"))
        kept = rec.get("ranks_kept")
        if isinstance(kept, list):
            p.ranks_kept = [r for r in (_int(v) for v in kept) if r is not None]
        probes = rec.get("probes")
        p.packs = [str(name) for name in probes] if isinstance(probes, list) else []
        fold_s = rec.get("fold_s")
        p.fold_s = float(fold_s) if type(fold_s) in (int, float) and fold_s > 0 else None

    def handlers(self) -> dict[str, Any]:
        """Kind -> handler; dispatch, probe.error and unknown kinds need nothing here."""
        return {
            "graph.replay": self.replay,
            "graph.replay.time": self.replay_time,
            "attn.metadata": self.attn_metadata,
            "attn.call": self.attn_call,
            "kernel.launch": self.kernel_launch,
            "kernel.split": self.kernel_split,
            "kernel.skip": self.kernel_skip,
            "sync": self.sync,
            "host.decision": self.host_decision,
            "graph.capture.begin": self.capture_begin,
            "graph.capture.end": self.capture_end,
            "graph.nodes": self.graph_nodes,
            "device": self.device,
            "process": self.header,
            "process.rank": self.process_info,
            "process.info": self.process_info,
            "process.end": self.process_end,
            "probe.error": self.probe_error,
            "mark": self.mark,
            "steady": self.steady,
        }

    def probe_error(self, rec: dict) -> None:
        if len(self.proc.probe_errors) < MAX_PROBE_ERRORS:
            self.proc.probe_errors.append({
                "file": self.file, "seq": rec.get("seq"), "probe": _text(rec.get("probe")),
                "target": _text(rec.get("target")), "reason": _text(rec.get("reason")),
                "error": _text(rec.get("error"))})


    def mark(self, rec: dict) -> None:
        """A user annotation (`mlatrace.mark`): the first MAX_MARKS kept, all counted."""
        p = self.proc
        p.marks_total += 1
        if len(p.marks) < MAX_MARKS:
            p.marks.append({"seq": rec.get("seq"), "t": rec.get("t"),
                            "name": _text(rec.get("name")), "attrs": _dict(rec.get("attrs"))})

    def kernel_skip(self, rec: dict) -> None:
        gid = self._capture_gid(rec)
        if gid is not None and len(self._graph(gid).skips) < MAX_DISTINCT:
            self._graph(gid).skips.append((self._ref(rec, "kernel.skip"), _text(rec.get("name")),
                                           _text(rec.get("reason"))))

    def graph_nodes(self, rec: dict) -> None:
        gid = _int(rec.get("gid"))
        kernels = rec.get("kernels")
        if gid is not None and isinstance(kernels, list):
            graph = self._graph(gid)
            distinct: dict[tuple, dict] = {}
            for node in kernels:
                if isinstance(node, dict) and len(distinct) < MAX_NODES:
                    distinct.setdefault((str(node.get("name")), hashable(node.get("grid"))), node)
            graph.nodes = list(distinct.values())
            graph.nodes_total = len(kernels)
            graph.nodes_ref = self._ref(rec, "graph.nodes")

    def device(self, rec: dict) -> None:
        """A `device` record (the reader checked its fields): the SM count of one GPU."""
        index = _int(rec.get("index"))
        if index is not None and index not in self.proc.devices:
            self.proc.devices[index] = {
                "index": index, "name": _text(rec.get("name")), "arch": _text(rec.get("arch")),
                "sms": _int(rec.get("sms")), "ref": self._ref(rec, "device")}

    def process_info(self, rec: dict) -> None:
        rank = _int(rec.get("rank"))
        if rank is not None:
            self.proc.rank = rank
        ws = _int(rec.get("world_size"))
        if ws is not None:
            self.proc.world_size = ws

    def process_end(self, rec: dict) -> None:
        self.proc.end = rec
        kept, rank = self.proc.ranks_kept, self.proc.rank
        if kept and rank is not None and rank not in kept:
            return  # a rank left out by --ranks: its replays are not this trace's
        for gid, count in _dict(rec.get("replays")).items():
            gid_i = int(gid) if isinstance(gid, str) and gid.lstrip("-").isdigit() else _int(gid)
            count_i = _int(count)
            if gid_i is not None and count_i is not None:
                self._graph(gid_i).replays.exact = count_i

    def capture_begin(self, rec: dict) -> None:
        gid = _int(rec.get("gid"))
        if gid is None:
            return
        graph = self._graph(gid)
        graph.parent = _int(rec.get("parent"))
        graph.src = _text(rec.get("src"))
        graph.key = _key_text(rec.get("key"))
        graph.mode = _text(rec.get("mode"))
        graph.begin = self._ref(rec, "graph.capture.begin")
        graph.device = _int(rec.get("device"))
        tid = rec.get("tid")
        graph.capture_tid = tid
        if graph.parent is None:
            stack = self.stacks.get(tid)
            if stack:
                graph.parent = stack[-1]
        # syncs since the last replay were this capture's set-up (torch.cuda.graph and
        # engines synchronize before capturing), not the decode step path
        self.pending_syncs.pop(tid, None)
        current = self.metadata[tid][0] if tid in self.metadata else None
        if current is not None:
            graph.capture_metadata = current
            graph.capture_metadata_ref = self._ref(current, "attn.metadata")
        # decisions made eagerly for this capture (plan() / a metadata build run just before
        # it, as FlashInfer and vLLM's builders do): the latest of each name since this
        # thread's last replay or capture begin is what the capture froze
        pending = self.eager_decisions.get(tid) if self.eager_decisions else None
        if pending:
            since = self.last_replay_seq.get(tid, -1)
            for drec in pending.values():
                seq = drec.get("seq")
                if isinstance(seq, int) and seq > since:
                    self._add_decision(graph, drec)
        seq = rec.get("seq")
        if isinstance(seq, int):
            self.last_replay_seq[tid] = seq
        self.stacks.setdefault(tid, []).append(gid)

    def capture_end(self, rec: dict) -> None:
        gid = _int(rec.get("gid"))
        if gid is None:
            return
        graph = self._graph(gid)
        graph.end = self._ref(rec, "graph.capture.end")
        graph.segments = _int(rec.get("segments"))
        graph.eager_breaks = _int(rec.get("eager_breaks"))
        graph.dur_ns = _int(rec.get("dur_ns"))
        graph.capture_error = _text(rec.get("error"))
        stack = self.stacks.get(rec.get("tid"))
        if stack and gid in stack:
            del stack[stack.index(gid):]

    def _count_attention(self, rec: dict, kind: str, name: str,
                         capturing: Any = None) -> AttentionStats:
        key = f"{kind}:{name}"
        stats = self.proc.attention.get(key)
        if stats is None:
            stats = self.proc.attention[key] = AttentionStats(kind, name, self._ref(rec, kind))
        stats.add(rec, bool(rec.get("capturing") if capturing is None else capturing))
        return stats

    def attn_metadata(self, rec: Record) -> None:
        # one per decode step: the stats of a backend named by a string are looked up by it
        backend, capturing = rec.backend, rec.capturing
        smin, smax, ptrs = rec.seq_len_min, rec.seq_len_max, rec.ptrs
        stats = self.md_stats.get(backend) if type(backend) is str else None
        if stats is None:
            stats = self._count_attention(rec, "attn.metadata", str(backend), capturing)
            if type(backend) is str:
                self.md_stats[backend] = stats
        else:
            stats.add_fields(rec.layer, smin, smax, bool(capturing))
        tid = rec.tid
        if tid in self.md_since_replay:
            prev, _smax, _smin, prev_ptrs = self.metadata[tid]
            if prev_ptrs:
                held = self.step_ptrs.setdefault(tid, {})
                for name, ptr in prev_ptrs.items():
                    held[name] = (ptr, prev)
        else:
            if self.step_ptrs:
                self.step_ptrs.pop(tid, None)  # a replay read them: a new step begins
            self.md_since_replay.add(tid)
        self.metadata[tid] = (rec, smax if type(smax) is int else None,
                              smin if type(smin) is int else None,
                              ptrs if ptrs and type(ptrs) is dict else None)
        gid = self._capture_gid(rec) if capturing else None
        if gid is not None:
            ref = self._ref(rec, "attn.metadata")
            graph = self._graph(gid)
            for name, ptr in _dict(ptrs).items():
                if isinstance(ptr, int) and name not in graph.capture_ptrs:
                    graph.capture_ptrs[name] = (ptr, ref)
            if graph.capture_metadata is None:
                graph.capture_metadata, graph.capture_metadata_ref = rec, ref

    def _eager(self, rec: dict, name: str, kind: str) -> None:
        if rec.get("tid") in self.replaying:
            entry = self.model.runtime_eager.get((self.pid, name))
            if entry is None:
                self.model.runtime_eager[(self.pid, name)] = [1, self._ref(rec, kind)]
            else:
                entry[0] += 1

    def _runtime_split(self, rec: dict, splits: int | None) -> None:
        """A split count chosen eagerly while this thread replays graphs (bounded set)."""
        if splits is not None and rec.get("tid") in self.replaying:
            seen = self.model.runtime_splits.setdefault(self.pid, set())
            if len(seen) < MAX_DISTINCT:
                seen.add(splits)

    def attn_call(self, rec: dict) -> None:
        self._count_attention(rec, "attn.call", str(rec.get("op")))
        gid = self._capture_gid(rec)
        if gid is None:
            self._eager(rec, str(rec.get("op")), "attn.call")
            return
        graph = self._graph(gid)
        ref = self._ref(rec, "attn.call")
        op = str(rec.get("op"))
        layer = hashable(rec.get("layer"))
        hints, ptrs = _dict(rec.get("hints")), _dict(rec.get("ptrs"))
        for name, ptr in ptrs.items():
            if isinstance(ptr, int) and name not in graph.capture_ptrs:
                graph.capture_ptrs[name] = (ptr, ref)
        for call in graph.calls:
            if call.op == op and call.layer == layer and call.hints == hints:
                call.count += 1
                return
        if len(graph.calls) < 4 * MAX_DISTINCT:
            extra = {k: rec[k] for k in ("num_prefills", "num_decodes", "dtype") if k in rec}
            graph.calls.append(CallShape(ref, op, layer, _text(rec.get("backend")), hints, ptrs,
                                         _dict(rec.get("shapes")), extra=extra))

    def kernel_split(self, rec: dict) -> None:
        gid = self._capture_gid(rec)
        op = _text(rec.get("op"))
        splits = _int(rec.get("num_kv_splits"))
        if gid is None:  # an eager policy evaluation (maybe not even a launch): nothing frozen
            self._runtime_split(rec, splits)
            return
        graph = self._graph(gid)
        fields = (op, splits, _int(rec.get("block_n")), _text(rec.get("policy")),
                  _int(rec.get("min_kv_seq_len")))
        for decision in graph.splits:
            if (decision.op, decision.num_kv_splits, decision.block_n, decision.policy,
                    decision.min_kv_seq_len) == fields:
                decision.count += 1
                return
        if len(graph.splits) < MAX_DISTINCT:
            graph.splits.append(SplitDecision(
                self._ref(rec, "kernel.split"), *fields, batch=_int(rec.get("batch")),
                qlen=_int(rec.get("qlen")), nhead=_int(rec.get("nhead")), regime=_text(rec.get("regime"))))

    def kernel_launch(self, rec: dict) -> None:
        gid = self._capture_gid(rec)
        if gid is None:
            self._eager(rec, str(rec.get("name")), "kernel.launch")
            self._runtime_split(rec, _int(_dict(rec.get("const")).get("NUM_KV_SPLITS")))
            return
        graph = self._graph(gid)
        name = str(rec.get("name"))
        grid = _grid(rec.get("grid"))
        const = _dict(rec.get("const"))
        for launch in graph.launches:
            if launch.name == name and launch.grid == grid and launch.const == const:
                launch.count += 1
                return
        if len(graph.launches) < 4 * MAX_DISTINCT:
            graph.launches.append(LaunchShape(self._ref(rec, "kernel.launch"), name, grid, const))

    def host_decision(self, rec: dict) -> None:
        name = _text(rec.get("name"))
        if name is None:
            return
        gid = self._capture_gid(rec)
        if gid is None:  # eager: the host's current intent, compared at the next replays
            self.eager_decisions.setdefault(rec.get("tid"), {})[name] = rec
            return
        self._add_decision(self._graph(gid), rec)

    def _add_decision(self, graph: GraphModel, rec: dict) -> None:
        name = _text(rec.get("name"))
        self.track_inputs = True
        value, inputs = rec.get("value"), _dict(rec.get("inputs"))
        layer = hashable(rec.get("layer"))
        for d in graph.decisions:
            if d.name == name and d.value == value and d.inputs == inputs and d.layer == layer:
                d.count += 1
                return
        if len(graph.decisions) < 4 * MAX_DISTINCT:
            valid = rec.get("valid") if isinstance(rec.get("valid"), dict) else None
            graph.decisions.append(DecisionShape(self._ref(rec, "host.decision"), name, value,
                                                 inputs, valid, layer))

    def _replay_decisions(self, graph: GraphModel, stats: ReplayStats, pending: dict) -> None:
        """Count the eager decisions made since this graph's capture ended, for this replay."""
        after = graph.end.seq if graph.end is not None else -1
        for name, rec in pending.items():
            seq = rec.get("seq")
            if not isinstance(seq, int) or seq <= after:
                continue
            value = rec.get("value")
            values = stats.decisions.setdefault(name, {})
            key = hashable(value)
            entry = values.get(key)
            if entry is None:
                if len(values) >= MAX_DISTINCT:
                    continue
                entry = values[key] = EagerDecision(self._ref(rec, "host.decision"), value,
                                                    _dict(rec.get("inputs")))
            entry.count += 1

    def _replay_inputs(self, stats: ReplayStats, md: dict) -> None:
        ranges = stats.inputs
        for name in REPLAY_INPUTS:
            value = md.get(name)
            if type(value) is not int:
                continue
            entry = ranges.get(name)
            if entry is None:
                ref = self._ref(md, "attn.metadata")
                ranges[name] = [value, ref, value, ref]
            elif value < entry[0]:
                entry[0], entry[1] = value, self._ref(md, "attn.metadata")
            elif value > entry[2]:
                entry[2], entry[3] = value, self._ref(md, "attn.metadata")

    def sync(self, rec: dict) -> None:
        gid = self._capture_gid(rec)
        tid = rec.get("tid")
        op, where = _text(rec.get("op")), rec.get("where")
        if _in_capture_setup(where):
            return  # torch.cuda.graph's own synchronize before it captures
        if gid is not None:
            graph = self._graph(gid)
            for site in graph.syncs:
                if site.op == op and hashable(site.where) == hashable(where):
                    site.count += 1
                    return
            if len(graph.syncs) < MAX_SYNC_SITES:
                graph.syncs.append(SyncSite(self._ref(rec, "sync"), op, where, True, gid))
        elif tid in self.replaying:
            pending = self.pending_syncs.setdefault(tid, [])
            if len(pending) < MAX_SYNC_SITES:
                side = ("input" if tid in self.md_since_replay else
                        "output" if tid in self.metadata else "unknown")
                pending.append((rec, side))

    def _flush_syncs(self, tid: Any) -> None:
        """Syncs between replays that no capture followed: the decode step path (MLT004)."""
        _add_step_syncs(self.step_syncs, self.pid, self.file, self.pending_syncs.pop(tid, ()))

    def _publish_syncs(self) -> None:
        """model.step_syncs of this process: the confirmed sites plus the pending syncs.

        Pending syncs are counted as they would be if the file ended here, without
        consuming them: a capture that begins later still claims them as its set-up.
        """
        model_syncs = self.model.step_syncs
        for key in [k for k in model_syncs if k[0] == self.pid]:
            del model_syncs[key]
        sites = self.step_syncs
        if any(self.pending_syncs.values()):
            sites = {key: replace(site) for key, site in sites.items()}
            for pending in self.pending_syncs.values():
                _add_step_syncs(sites, self.pid, self.file, pending)
        model_syncs.update(sites)

    def replay(self, rec: Record) -> None:
        # the hottest path of a trace (one or two per decode step): keep it lean; what
        # only some traces have (eager decisions, syncs, a step's earlier buffers) is
        # tested once and handled out of line
        gid = rec.gid
        graph = self.by_gid.get(gid)
        if graph is None:
            if type(gid) is not int:
                return
            graph = self.by_gid[gid] = self._graph(gid)
        stats = graph.replays
        tid = rec.tid
        stats.records += 1
        n = rec.n
        if type(n) is int and n > stats.max_n:
            stats.max_n = n
        if stats.first is None:
            stats.first = self._ref(rec, "graph.replay")
            if self.proc.first_replay_seq is None:
                self.proc.first_replay_seq = stats.first.seq
        if tid not in self.replaying:
            self.replaying.add(tid)
        if self.eager_decisions or self.pending_syncs:
            self._replay_host_state(graph, stats, rec, tid)
        gpu = rec.gpu_ns
        if type(gpu) is int and gpu >= 0:  # stats.add_gpu_ns(gpu), inlined
            if stats.gpu_rounded and gpu >= _GPU_ROUNDED_FROM:
                shift = gpu.bit_length() - GPU_HIST_BITS
                gpu = gpu >> shift << shift
            try:
                stats.gpu_hist[gpu] += 1
            except KeyError:  # a value not seen before (few once rounded: 8 significant bits)
                stats.add_gpu_ns(gpu)
            if type(n) is int and graph.parent is not None:
                self._legacy_time_to_wrappers(graph, n, gpu)
        current = self.metadata.get(tid)
        if current is None:
            return
        md, smax, smin, ptrs = current
        stats.with_metadata += 1
        if self.track_inputs and md is not stats.last_md:  # a wrapper and its graph share a build
            stats.last_md = md
            self._replay_inputs(stats, md)
        stats.latest_md = md
        if smax is not None and graph.parent not in self.by_gid:  # the parent never replayed
            series = stats.lengths  # the unit's lengths over time (analysis.series)
            if series is None:
                add_point(stats, "lengths", rec.t, smax)
            else:  # series.add, inlined
                series.ts.append(rec.t)
                series.vs.append(smax)
                if len(series.vs) >= FLUSH_AT:
                    series.flush()
        if smax is not None and (stats.seq_len_max is None or smax > stats.seq_len_max):
            stats.seq_len_max, stats.seq_len_max_md = smax, md
        if smin is not None:
            if stats.seq_len_min_max is None or smin > stats.seq_len_min_max:
                stats.seq_len_min_max, stats.seq_len_min_max_md = smin, md
            if stats.seq_len_min_min is None or smin < stats.seq_len_min_min:
                stats.seq_len_min_min = smin
        if tid in self.md_since_replay:
            self.md_since_replay.discard(tid)
        if self.step_ptrs and self.step_ptrs.get(tid):
            self._replay_step_ptrs(stats, ptrs, md, self.step_ptrs[tid])
        elif ptrs is not None:
            if ptrs == stats.ptr_run:  # the usual case: the same static buffers every step
                stats.ptr_run_count += 1
            else:
                self._count_ptrs(stats, ptrs, md)

    def _replay_host_state(self, graph: GraphModel, stats: ReplayStats, rec: Record,
                           tid: Any) -> None:
        """A replay of a thread with eager decisions or syncs pending: they are this step's."""
        if self.eager_decisions:
            self.last_replay_seq[tid] = rec.seq
        if self.pending_syncs and tid in self.pending_syncs:
            self._flush_syncs(tid)
        if self.eager_decisions:
            pending = self.eager_decisions.get(tid)
            if pending:
                self._replay_decisions(graph, stats, pending)

    def _replay_step_ptrs(self, stats: ReplayStats, ptrs: Any, md: dict,
                          held: dict[str, tuple[Any, dict]]) -> None:
        """The replay sees the buffers of the step's earlier metadata builds too."""
        own = ptrs or {}
        sources = {name: entry[1] for name, entry in held.items() if name not in own}
        ptrs = {**{name: entry[0] for name, entry in held.items()}, **own}
        if ptrs == stats.ptr_run:
            stats.ptr_run_count += 1
        else:
            self._count_ptrs(stats, ptrs, md, sources)

    def _legacy_time_to_wrappers(self, graph: GraphModel, n: int, gpu: int) -> None:
        """An older trace's `gpu_ns` on a nested graph's replay: the graphs around it take
        it as a graph.replay.time of that replay (docs/trace-format.md)."""
        seen = {graph.gid}
        graph = self.model.graph(self.pid, graph.parent)
        while graph is not None and graph.gid not in seen:
            seen.add(graph.gid)
            graph.replays.add_timed(n, gpu)
            graph = self.model.graph(self.pid, graph.parent)

    def steady(self, rec: dict) -> None:
        """A fold of steady steps (mlatrace.record.fold): the records it stands for, taken
        in aggregate, so that every count, range and finding is what they would give."""
        steps, replays = rec.get("steps"), rec.get("replays")
        if type(steps) is not int or steps < 1 or type(replays) is not int or replays < 0:
            return      # malformed: the reader said where
        tid = rec.get("tid")
        pattern = rec.get("pattern")
        if isinstance(pattern, list):
            self._steady_setup(rec, tid, pattern, steps)
        gid = _int(rec.get("gid"))
        if gid is None or not replays:
            return
        self.proc.kinds["graph.replay"] += replays
        graph = self.by_gid.get(gid)
        if graph is None:
            graph = self.by_gid[gid] = self._graph(gid)
        stats = graph.replays
        stats.records += replays
        n_last = _int(rec.get("n_last"))
        if n_last is not None and n_last > stats.max_n:
            stats.max_n = n_last
        if stats.first is None:
            stats.first = self._ref(rec, "graph.replay")
            if self.proc.first_replay_seq is None:
                self.proc.first_replay_seq = stats.first.seq
        self.replaying.add(tid)
        if self.pending_syncs and tid in self.pending_syncs:
            self._flush_syncs(tid)
        if self.eager_decisions:
            self.last_replay_seq[tid] = rec.get("seq")
            pending = self.eager_decisions.get(tid)
            if pending:
                self._replay_decisions(graph, stats, pending)
                for name, drec in pending.items():   # the fold's other replays
                    entry = stats.decisions.get(name, {}).get(hashable(drec.get("value")))
                    seq = drec.get("seq")
                    after = graph.end.seq if graph.end is not None else -1
                    if entry is not None and isinstance(seq, int) and seq > after:
                        entry.count += replays - 1
        mds = [(lo, hi) for kind, lo, hi in self.fold_setup.get(tid, ())
               if kind == "attn.metadata"]
        if mds:
            lo, hi = mds[-1]
            ptrs: Any = {}
            for _, md_hi in mds:
                more = md_hi.get("ptrs")
                if isinstance(more, dict):
                    ptrs.update(more)
            ptrs = ptrs or None
            smax, smin_hi, smin_lo = (_int(hi.get("seq_len_max")), _int(hi.get("seq_len_min")),
                                      _int(lo.get("seq_len_min")))
        else:
            current = self.metadata.get(tid)
            if current is None:
                return
            lo = hi = current[0]
            smax, smin_hi, ptrs = current[1], current[2], current[3]
            smin_lo = smin_hi
        stats.with_metadata += replays
        low, t_first, t_last = _int(lo.get("seq_len_max")), rec.get("t_first"), rec.get("t_last")
        if smax is not None and low is not None and graph.parent not in self.by_gid \
                and type(t_first) is int and type(t_last) is int:   # the unit's lengths
            if stats.lengths is None:
                stats.lengths = Series(t0=t_first)
            stats.lengths.add_span(t_first, t_last, low, smax, replays)
        if self.track_inputs and hi is not stats.last_md:
            stats.last_md = hi
            self._replay_inputs(stats, lo)
            self._replay_inputs(stats, hi)
        stats.latest_md = hi
        if smax is not None and (stats.seq_len_max is None or smax > stats.seq_len_max):
            stats.seq_len_max, stats.seq_len_max_md = smax, hi
        if smin_hi is not None and (stats.seq_len_min_max is None
                                    or smin_hi > stats.seq_len_min_max):
            stats.seq_len_min_max, stats.seq_len_min_max_md = smin_hi, hi
        if smin_lo is not None and (stats.seq_len_min_min is None
                                    or smin_lo < stats.seq_len_min_min):
            stats.seq_len_min_min = smin_lo
        self.md_since_replay.discard(tid)
        if ptrs is not None:
            if ptrs != stats.ptr_run:
                self._count_ptrs(stats, ptrs, hi)
                replays -= 1
            stats.ptr_run_count += replays

    def _steady_setup(self, rec: dict, tid: Any, pattern: list, steps: int) -> None:
        """The set-up and eager records of a fold's steps (its pattern), `steps` of each."""
        setup: list[tuple[str, dict, dict]] = []
        kinds = self.proc.kinds
        for entry in pattern:
            if not isinstance(entry, dict) or entry.get("k") == "graph.replay":
                continue
            kind = str(entry.get("k"))
            same, ranges = _dict(entry.get("same")), _dict(entry.get("range"))
            lo, hi = _fold_record(rec, kind, same, ranges, 0), _fold_record(rec, kind, same,
                                                                              ranges, 1)
            setup.append((kind, lo, hi))
            kinds[kind] = kinds.get(kind, 0) + steps
            if kind == "attn.metadata":
                stats = self._count_attention(lo, kind, str(lo.get("backend")), False)
                stats.add_fields(lo.get("layer"), lo.get("seq_len_min"), hi.get("seq_len_max"),
                                 False)
                stats.count += steps - 2
            elif kind == "attn.call":
                stats = self._count_attention(lo, kind, str(lo.get("op")), False)
                stats.count += steps - 1
                self._eager_steps(lo, str(lo.get("op")), kind, steps)
            elif kind == "kernel.split":
                self._runtime_split(lo, _int(lo.get("num_kv_splits")))
            elif kind == "kernel.launch":
                self._eager_steps(lo, str(lo.get("name")), kind, steps)
                self._runtime_split(lo, _int(_dict(lo.get("const")).get("NUM_KV_SPLITS")))
            elif kind == "host.decision":
                name = _text(lo.get("name"))
                if name is not None:
                    self.eager_decisions.setdefault(tid, {})[name] = hi
        self.fold_setup[tid] = setup
        mds = [entry for entry in setup if entry[0] == "attn.metadata"]
        if mds:
            hi = mds[-1][2]
            ptrs = hi.get("ptrs")
            self.metadata[tid] = (hi, _int(hi.get("seq_len_max")), _int(hi.get("seq_len_min")),
                                  ptrs if ptrs and type(ptrs) is dict else None)
            self.step_ptrs.pop(tid, None)
            self.md_since_replay.discard(tid)

    def _eager_steps(self, rec: dict, name: str, kind: str, steps: int) -> None:
        """`_eager` of `steps` records alike."""
        if rec.get("tid") in self.replaying:
            entry = self.model.runtime_eager.get((self.pid, name))
            if entry is None:
                self.model.runtime_eager[(self.pid, name)] = [steps, self._ref(rec, kind)]
            else:
                entry[0] += steps

    def replay_time(self, rec: Record) -> None:
        """graph.replay.time: the GPU time of replay n of gid, and of each graph around it."""
        gid, n, gpu = rec.gid, rec.n, rec.gpu_ns
        if type(gid) is not int or type(n) is not int or type(gpu) is not int or gpu < 0:
            return
        graph, seen = self._graph(gid), set()
        add_point(graph.replays, "gpu_times", rec.t, gpu)
        host = rec.get("via") == "host"
        ref = None
        while graph is not None and graph.gid not in seen:
            seen.add(graph.gid)
            stats = graph.replays
            stats.add_timed(n, gpu)
            if host:
                stats.host_timed = True
            if n != 1 and gpu > 0:   # the first replay also uploads the graph
                if stats.gpu_fastest is None or gpu < stats.gpu_fastest:
                    ref = ref or self._ref(rec, "graph.replay.time")
                    stats.gpu_fastest, stats.gpu_fastest_ref = gpu, ref
                if stats.gpu_slowest is None or gpu > stats.gpu_slowest:
                    ref = ref or self._ref(rec, "graph.replay.time")
                    stats.gpu_slowest, stats.gpu_slowest_ref = gpu, ref
            graph = self.model.graph(self.pid, graph.parent)

    def _count_ptrs(self, stats: ReplayStats, ptrs: dict, md: dict,
                    sources: dict[str, dict] | None = None) -> None:
        _flush_ptr_run(stats)
        seen_all = stats.ptrs
        for name, ptr in ptrs.items():
            seen = seen_all.get(name)
            src = sources.get(name, md) if sources else md
            if seen is None:
                if type(ptr) is int:
                    seen_all[name] = {ptr: [1, self._ref(src, "attn.metadata")]}
            elif ptr in seen:
                seen[ptr][0] += 1
            elif type(ptr) is int and len(seen) < MAX_DISTINCT:
                seen[ptr] = [1, self._ref(src, "attn.metadata")]
        stats.ptr_run, stats.ptr_run_count = ptrs, 0

    def finish(self, proc_file: Any) -> ProcessModel:
        """Close the per-process aggregates as of the records fed so far.

        It runs again at every snapshot of a trace still being written, so it only
        derives: nothing it does changes what later records will do.
        """
        self._publish_syncs()
        for graph in self.model.graphs.values():
            if graph.pid != self.pid:
                continue
            stats = graph.replays
            _flush_ptr_run(stats)
            stats.fold_timed()
            # resolve whichever record changed since the last snapshot
            if stats.seq_len_max_md is not None:
                stats.seq_len_max_ref = self._ref(stats.seq_len_max_md, "attn.metadata")
                stats.seq_len_max_md = None
            if stats.seq_len_min_max_md is not None:
                stats.seq_len_min_max_ref = self._ref(stats.seq_len_min_max_md, "attn.metadata")
                stats.seq_len_min_max_md = None
        p = self.proc
        p.gaps = _int(getattr(proc_file, "gaps", 0)) or 0
        p.dropped = _int(getattr(proc_file, "dropped", 0)) or 0
        end = getattr(proc_file, "end", None)
        if isinstance(end, dict) and p.end is None:
            p.end = end
        if p.end is not None:
            p.dropped = max(p.dropped, _int(p.end.get("dropped")) or 0)
        return p


class IncrementalBuilder:
    """The model of a trace, updated record by record as records arrive.

    `build_model` feeds every file of a finished trace through it in one go; `mlatrace
    watch` feeds each piece of each file as the tailing reader finds it and takes a
    `snapshot()` whenever it refreshes. Both go through the same `_ProcessBuilder`
    handlers, so the model after the last record is the one `report` builds. Files are
    independent (gids are per process): pieces of different files may interleave.
    """

    def __init__(self, root: str = "") -> None:
        self.model = TraceModel(root=root)
        self.problems: list[Problem] = []   # what the builder itself found (bad field types)
        self._builders: dict[int, tuple[Any, _ProcessBuilder, dict[str, Any]]] = {}

    def feed(self, proc_file: Any, records: Iterable[dict]) -> int:
        """Apply `records` (the next ones of `proc_file`, in file order); returns how many."""
        entry = self._builders.get(id(proc_file))
        if entry is None:
            builder = _ProcessBuilder(self.model, proc_file)
            header = getattr(proc_file, "header", None)
            if isinstance(header, dict):
                builder.header(header)
            handlers = builder.handlers()
            entry = self._builders[id(proc_file)] = (proc_file, builder, handlers)
            self.model.processes.append(builder.proc)
        _, builder, handlers = entry
        count = _feed(builder, handlers, records, self.problems)
        builder.proc.records += count
        return count

    def feed_files(self, pieces: list[tuple[Any, Iterable[list[dict]]]],
                   parallel: bool = False) -> int:
        """Feed each file's next records (lists of them, in file order); returns how many.

        `parallel`: files of different pids are independent, so a large backlog is fed
        over worker processes (forked, one bucket of pids each, the parent taking one
        too) whose builders then replace this process's builders of those pids; where
        no worker can run, or one fails, the rest is fed here.
        """
        if parallel:
            from mlatrace.analysis.parallel import feed_parallel

            done = feed_parallel(self, pieces)
            if done is not None:
                return done
        return sum(self.feed(proc_file, chunk) for proc_file, chunks in pieces
                   for chunk in chunks)

    def export_pids(self, pids: set[Any], proc_files: list[Any], reader_from: int,
                    own_from: int) -> bytes:
        """A worker's result: the builders of `pids` with their part of the model, and
        the reader state of `proc_files`, pickled together (so shared objects stay shared)."""
        builders = [(key, proc_file, builder) for key, (proc_file, builder, _h)
                    in self._builders.items() if builder.pid in pids]
        for _key, _file, builder in builders:
            builder.model = None  # the parent's model takes the parts below
        model = self.model
        state = {
            "builders": [(key, builder) for key, _file, builder in builders],
            "graphs": {k: g for k, g in model.graphs.items() if k[0] in pids},
            "runtime_eager": {k: v for k, v in model.runtime_eager.items() if k[0] in pids},
            "runtime_splits": {k: v for k, v in model.runtime_splits.items() if k in pids},
            "files": {id(f): (f.gaps, f.dropped, f.records_read, f._last_seq, f.end,
                              f.lines_checked, f.header, f._header_line_ok, f._header_problem)
                      for f in proc_files},
            "reader_problems": proc_files[0].problems[reader_from:] if proc_files else [],
            "problems": self.problems[own_from:],
        }
        return pickle.dumps(state, pickle.HIGHEST_PROTOCOL)

    def absorb(self, data: bytes, proc_files: list[Any]) -> None:
        """Take a worker's `export_pids` in place of this process's state of those pids."""
        state = pickle.loads(data)
        model = self.model
        pids = set()
        for key, builder in state["builders"]:
            builder.model = model
            pids.add(builder.pid)
            old = self._builders.get(key)
            proc_file = old[0] if old else next(f for f in proc_files if id(f) == key)
            if old is None:
                model.processes.append(builder.proc)
            else:
                index = next(i for i, p in enumerate(model.processes) if p is old[1].proc)
                model.processes[index] = builder.proc
            self._builders[key] = (proc_file, builder, builder.handlers())
        for part, new in ((model.graphs, state["graphs"]),
                          (model.runtime_eager, state["runtime_eager"])):
            for k in [k for k in part if k[0] in pids]:
                del part[k]
            part.update(new)
        for k in [k for k in model.runtime_splits if k in pids]:
            del model.runtime_splits[k]
        model.runtime_splits.update(state["runtime_splits"])
        for proc_file in proc_files:
            if id(proc_file) in state["files"]:
                (proc_file.gaps, proc_file.dropped, proc_file.records_read,
                 proc_file._last_seq, proc_file.end, proc_file.lines_checked,
                 proc_file.header, proc_file._header_line_ok,
                 proc_file._header_problem) = state["files"][id(proc_file)]
        if proc_files:
            proc_files[0].problems.extend(state["reader_problems"])
        self.problems.extend(state["problems"])

    def builder_of(self, proc_file: Any) -> _ProcessBuilder | None:
        entry = self._builders.get(id(proc_file))
        return entry[1] if entry else None

    def snapshot(self, reader_problems: Iterable[Problem] = (),
                 order: list[Any] | None = None) -> TraceModel:
        """The model as of the records fed so far, finished as `report` finishes it.

        Cheap (no record is read again): per-process aggregates are closed, roles
        inferred; `order` (process files) sorts the processes as the batch reader lists them.
        """
        for proc_file, builder, _ in self._builders.values():
            builder.finish(proc_file)
        if order is not None:
            rank = {id(f): i for i, f in enumerate(order)}
            by_proc = {id(b.proc): rank.get(id(f), len(rank))
                       for f, b, _ in self._builders.values()}
            self.model.processes.sort(key=lambda p: by_proc.get(id(p), len(rank)))
        self.model.problems = list(reader_problems) + self.problems
        return _finish_model(self.model, None, None)


def _feed(builder: _ProcessBuilder, handlers: dict[str, Any], records: Iterable[dict],
          problems: list[Problem]) -> int:
    """The one loop every record of every trace goes through (batch, parallel and live).

    Records come a list at a time (a chunk of the reader, read `typed`: those of
    `TYPED_KINDS` as `Record`s, which their handlers read): their kinds are counted in C
    and their handlers looked up in C; the loop only calls those of kinds with one.
    Records of other sources (dicts) go one at a time (`_feed_each`).
    """
    if type(records) is not RecordChunk or not records.typed:
        return _feed_each(builder, handlers, records, problems)
    kinds, counts = records.kinds, records.counts  # the reader read their kinds already
    builder.proc.kinds.update(counts)
    for handler, rec in zip(map(handlers.get, kinds), records, strict=True):
        if handler is not None:
            try:
                handler(rec)
            except (AttributeError, TypeError, ValueError, KeyError) as exc:
                problems.append(_bad_record(builder, rec, exc))
    return len(records)


def _feed_each(builder: _ProcessBuilder, handlers: dict[str, Any], records: Iterable,
               problems: list[Problem]) -> int:
    """`_feed` one record at a time: records as dicts (the reader's precise path, tests),
    those of `TYPED_KINDS` made `Record`s first, and records the reader would not hand out."""
    kinds = builder.proc.kinds
    count = 0
    for rec in records:
        count += 1
        try:
            kind = rec.get("k")
            kinds[kind] = kinds.get(kind, 0) + 1
            if type(rec) is dict and type(kind) is str and kind in TYPED_KINDS:
                rec = to_record(rec)
            handler = handlers.get(kind)
            if handler is not None:
                handler(rec)
        except (AttributeError, TypeError, ValueError, KeyError) as exc:
            problems.append(_bad_record(builder, rec, exc))
    return count


def _fold_record(rec: dict, kind: str, same: dict, ranges: dict, end: int) -> dict:
    """One record of a fold's pattern at the low (end 0) or high (1) end of its ranges,
    located at the `steady` record (its seq: evidence in a fold points there)."""
    out = dict(same)
    for name, span in ranges.items():
        if not (isinstance(span, list) and len(span) == 2):
            continue
        outer, dot, inner = name.partition(".")
        if dot:
            nested = out[outer] = dict(_dict(out.get(outer)))
            nested[inner] = span[end]
        else:
            out[name] = span[end]
    out.update(k=kind, seq=rec.get("seq"), tid=rec.get("tid"), t=rec.get("t"), capturing=False)
    return out


def _bad_record(builder: _ProcessBuilder, rec: Any, exc: Exception) -> Problem:
    seq = rec.get("seq") if isinstance(rec, dict) else None
    return Problem(builder.file, 0, f"record seq {seq}: field of an unexpected type "
                   f"({type(exc).__name__}); skipped")


def build_model(trace: Any, workers: int | None = None) -> TraceModel:
    """Stream every process file of an opened trace (mlatrace.trace API) into a TraceModel.

    Process files are independent (gids are per process), so a large trace with several
    processes is split over `workers` processes (default: the CPUs, when it pays off).
    """
    groups = _pid_groups(trace.processes)
    if workers is None:
        workers = _default_workers(trace.processes, len(groups))
    if workers > 1 and len(groups) > 1:
        parts = _build_parallel(trace, groups, workers)
        if parts is not None:
            return _finish_model(TraceModel(root=str(getattr(trace, "root", ""))), trace, parts)
    incremental = IncrementalBuilder(root=str(getattr(trace, "root", "")))
    gc_was_enabled = gc.isenabled()
    gc.disable()  # millions of short-lived dicts, no cycles: collections only cost time
    try:
        for proc_file in trace.processes:
            incremental.feed(proc_file, [])  # a file without records is a process too
            for chunk in _chunks(proc_file):
                incremental.feed(proc_file, chunk)
    finally:
        if gc_was_enabled:
            gc.enable()
    return incremental.snapshot(getattr(trace, "problems", []))


def _finish_model(model: TraceModel, trace: Any, parts: list[TraceModel] | None) -> TraceModel:
    if parts is not None:
        done_files = set()
        for part in parts:
            model.processes.extend(part.processes)
            model.graphs.update(part.graphs)
            model.runtime_eager.update(part.runtime_eager)
            model.runtime_splits.update(part.runtime_splits)
            model.step_syncs.update(part.step_syncs)
            model.worker_cpu_s.extend(part.worker_cpu_s)
            done_files.update(p.file for p in part.processes)
        order = {getattr(p, "name", None): i for i, p in enumerate(trace.processes)}
        model.processes.sort(key=lambda p: order.get(p.file, 0))
        # header problems were found again by the workers: keep the parent's for other files
        model.problems = [p for p in getattr(trace, "problems", []) if p.file not in done_files]
        for part in parts:
            model.problems.extend(part.problems)
    pids = {p.pid for p in model.processes}
    captured = {g.pid for g in model.graphs.values()}
    for proc in model.processes:
        proc.role = _infer_role(proc, pids, proc.pid in captured)
    return model


def _stream_process(model: TraceModel, proc_file: Any) -> ProcessModel:
    """One whole file into `model` (a parallel worker's unit of work)."""
    builder = _ProcessBuilder(model, proc_file)
    header = getattr(proc_file, "header", None)
    if isinstance(header, dict):
        builder.header(header)
    handlers = builder.handlers()
    builder.proc.records = sum(_feed(builder, handlers, chunk, model.problems)
                               for chunk in _chunks(proc_file))
    return builder.finish(proc_file)


def _chunks(proc_file: Any) -> Iterable[list[dict]]:
    """The records of a process file as the reader's lists, read `typed` (or one list of
    them all)."""
    chunks = getattr(proc_file, "record_chunks", None)
    return chunks(typed=True) if chunks is not None else [list(proc_file.records())]
