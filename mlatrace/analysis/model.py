"""The graph model: what each capture froze and what its replays later needed.

Built in one streaming pass over every process file of a trace. Memory stays bounded:
a graph keeps aggregates (distinct frozen values with their first evidence, replay
counters, a reservoir of GPU times), never the replay records themselves.
"""

from __future__ import annotations

import gc
import json
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

MAX_DISTINCT = 16          # distinct values kept per frozen item / per pointer name
GPU_HIST_BITS = 8          # GPU-time histogram keeps 8 significant bits (<0.8% error)
MAX_SYNC_SITES = 64
MAX_NODES = 256            # distinct (name, grid) graph nodes kept per graph
MAX_LAYERS = 512           # distinct layer names counted per attention op

PREFILL_MARKERS = ("flash_attn_varlen", "prefill", "varlen")
DECODE_MARKERS = ("paged_attention", "decode", "mla_gluon")


@dataclass(slots=True)
class Ref:
    """Where a value was seen: the evidence of a finding points at these."""

    file: str
    seq: int
    kind: str


@dataclass
class AttentionStats:
    """Attention calls (attn.call, by op) or metadata builds (attn.metadata, by backend) of
    one process: how many, captured or eager, which layers, what sequence lengths."""

    kind: str
    name: str
    first: Ref
    count: int = 0
    captured: int = 0
    layers: set = field(default_factory=set)
    seq_len_min: int | None = None
    seq_len_max: int | None = None

    def add(self, rec: dict, captured: bool) -> None:
        self.count += 1
        self.captured += captured
        layer = rec.get("layer")
        if layer is not None and len(self.layers) < MAX_LAYERS:
            self.layers.add(str(layer))
        low, high = _int(rec.get("seq_len_min")), _int(rec.get("seq_len_max"))
        if low is not None:
            self.seq_len_min = low if self.seq_len_min is None else min(self.seq_len_min, low)
        if high is not None:
            self.seq_len_max = high if self.seq_len_max is None else max(self.seq_len_max, high)


@dataclass
class ProcessModel:
    file: str
    pid: int | None
    ppid: int | None = None
    rank: int | None = None
    world_size: int | None = None
    argv: list[str] = field(default_factory=list)
    schema: str | None = None
    versions: dict = field(default_factory=dict)
    device: dict = field(default_factory=dict)
    role: str = "process"
    records: int = 0
    has_header: bool = False
    end: dict | None = None
    gaps: int = 0
    dropped: int = 0
    first_replay_seq: int | None = None
    attention: dict[str, AttentionStats] = field(default_factory=dict)


@dataclass
class SplitDecision:
    """One distinct kernel.split made while capturing."""

    ref: Ref
    op: str | None
    num_kv_splits: int | None
    block_n: int | None
    policy: str | None
    min_kv_seq_len: int | None
    batch: int | None
    qlen: int | None
    nhead: int | None
    regime: str | None
    count: int = 1


@dataclass
class LaunchShape:
    """One distinct (kernel name, grid, constexprs) launched while capturing."""

    ref: Ref
    name: str
    grid: tuple | None
    const: dict
    count: int = 1

    @property
    def num_kv_splits(self) -> int | None:
        value = self.const.get("NUM_KV_SPLITS")
        return value if isinstance(value, int) else None


@dataclass
class CallShape:
    """One distinct attention call (op, layer) made while capturing, with its host hints."""

    ref: Ref
    op: str
    layer: Any
    backend: str | None
    hints: dict
    ptrs: dict
    shapes: dict
    count: int = 1
    extra: dict = field(default_factory=dict)  # num_prefills / num_decodes of a backend forward


@dataclass
class SyncSite:
    ref: Ref
    op: str | None
    where: Any
    capturing: bool
    gid: int | None
    count: int = 1


@dataclass(slots=True)
class ReplayStats:
    """Aggregates over one graph's replays and the host state built before each."""

    records: int = 0
    max_n: int = 0
    exact: int | None = None          # from process.end replays{gid: count}
    first: Ref | None = None
    with_metadata: int = 0
    seq_len_max: int | None = None    # longest seq_len_max of the metadata before a replay
    seq_len_max_ref: Ref | None = None
    seq_len_min_max: int | None = None  # largest seq_len_min seen (every request at least this long)
    seq_len_min_max_ref: Ref | None = None
    seq_len_max_md: dict | None = None  # the metadata records behind the two refs (while streaming)
    seq_len_min_max_md: dict | None = None
    seq_len_min_min: int | None = None
    ptrs: dict[str, dict[int, list]] = field(default_factory=dict)  # name -> ptr -> [count, Ref]
    gpu_hist: dict[int, int] = field(default_factory=dict)  # value rounded to 8 bits -> count
    ptr_run: dict | None = None       # the last pointer set seen, and how many replays since
    ptr_run_count: int = 0
    gpu_seen: int = 0

    @property
    def count(self) -> int:
        if self.exact is not None:
            return max(self.exact, self.max_n, self.records)
        return max(self.max_n, self.records)

    def add_gpu_ns(self, value: int) -> None:
        shift = value.bit_length() - GPU_HIST_BITS
        if shift > 0:
            value = (value >> shift) << shift
        hist = self.gpu_hist
        hist[value] = hist.get(value, 0) + 1
        self.gpu_seen += 1

    def percentiles(self) -> dict[str, int] | None:
        """GPU-time percentiles of the replays that carried gpu_ns (rounded down, <0.8%)."""
        if not self.gpu_seen:
            return None
        values = sorted(self.gpu_hist.items())
        out: dict[str, int] = {}
        for name, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
            target, running = q * self.gpu_seen, 0
            for value, count in values:
                running += count
                if running >= target:
                    out[name] = value
                    break
        out["max"] = values[-1][0]
        out["samples"] = self.gpu_seen
        return out


@dataclass
class GraphModel:
    pid: int | None
    file: str
    gid: int
    parent: int | None = None
    src: str | None = None
    key: Any = None
    mode: str | None = None
    begin: Ref | None = None
    end: Ref | None = None
    segments: int | None = None
    eager_breaks: int | None = None
    dur_ns: int | None = None
    capture_tid: Any = None
    capture_metadata: dict | None = None   # seq lens of the metadata current when capture began
    capture_metadata_ref: Ref | None = None
    splits: list[SplitDecision] = field(default_factory=list)
    launches: list[LaunchShape] = field(default_factory=list)
    skips: list[tuple[Ref, str | None, str | None]] = field(default_factory=list)
    calls: list[CallShape] = field(default_factory=list)
    capture_ptrs: dict[str, tuple[int, Ref]] = field(default_factory=dict)
    nodes: list[dict] = field(default_factory=list)  # distinct (name, grid) kernel nodes
    nodes_total: int = 0
    nodes_ref: Ref | None = None
    syncs: list[SyncSite] = field(default_factory=list)
    replays: ReplayStats = field(default_factory=ReplayStats)


@dataclass
class TraceModel:
    root: str
    processes: list[ProcessModel] = field(default_factory=list)
    graphs: dict[tuple[int | None, int], GraphModel] = field(default_factory=dict)
    # (pid, op or kernel name) -> [count, Ref]: attention calls and kernel launches that ran
    # eagerly after the thread began replaying (a breakable capture's eager MLA call): their
    # host decisions are re-made with the real length, so what capture saw is not frozen
    runtime_eager: dict[tuple[int | None, str], list] = field(default_factory=dict)
    # syncs outside capture after the thread started replaying (the decode step path)
    step_syncs: dict[tuple[int | None, Any, Any], SyncSite] = field(default_factory=dict)
    problems: list = field(default_factory=list)
    worker_cpu_s: list[float] = field(default_factory=list)  # per file worker (bench analyze)

    def process(self, pid: int | None) -> ProcessModel | None:
        for proc in self.processes:
            if proc.pid == pid:
                return proc
        return None

    def graph(self, pid: int | None, gid: int | None) -> GraphModel | None:
        if gid is None:
            return None
        return self.graphs.get((pid, gid))

    def ancestors(self, graph: GraphModel) -> list[GraphModel]:
        """The graph itself, then its parent, grandparent, ... (cycle-safe)."""
        chain, seen, current = [], set(), graph
        while current is not None and current.gid not in seen:
            chain.append(current)
            seen.add(current.gid)
            current = self.graph(current.pid, current.parent)
        return chain

    def children(self, graph: GraphModel) -> list[GraphModel]:
        return [g for g in self.graphs.values() if g.pid == graph.pid and g.parent == graph.gid]

    def subtree(self, graph: GraphModel) -> list[GraphModel]:
        out, stack, seen = [], [graph], set()
        while stack:
            current = stack.pop()
            if current.gid in seen:
                continue
            seen.add(current.gid)
            out.append(current)
            stack.extend(self.children(current))
        return out

    def replay_graph(self, graph: GraphModel) -> GraphModel | None:
        """The outermost replayed graph of the chain (self, ancestors): the one with the key.

        A wrapper replay and the torch replay it causes see the same host state, so either
        would do; the outermost names the batch descriptor the engine dispatched on.
        """
        found = None
        for g in self.ancestors(graph):
            if g.replays.count > 0:
                found = g
        if found is None:  # only nested graphs were seen replaying (e.g. wrapper not probed)
            nested = [g for g in self.subtree(graph) if g.replays.count > 0]
            if nested:
                found = max(nested, key=lambda g: g.replays.count)
        return found

    def effective_key(self, graph: GraphModel) -> Any:
        for g in self.ancestors(graph):
            if g.key is not None:
                return g.key
        return None

    def effective_mode(self, graph: GraphModel) -> str | None:
        for g in self.ancestors(graph):
            if g.mode:
                return g.mode
        return None

    def rank_of(self, pid: int | None) -> int | None:
        proc = self.process(pid)
        return proc.rank if proc else None

    def total_replays(self) -> int:
        """Replays counted once per step: a wrapper and the torch graph it replays count once."""
        total = 0
        for g in self.graphs.values():
            if g.replays.count and not any(a.replays.count for a in self.ancestors(g)[1:]):
                total += g.replays.count
        return total


def _flush_ptr_run(stats: ReplayStats) -> None:
    """Add the replays that repeated the last pointer set to its per-name counts."""
    if stats.ptr_run_count and stats.ptr_run is not None:
        for name, ptr in stats.ptr_run.items():
            entry = stats.ptrs.get(name, {}).get(ptr)
            if entry is not None:
                entry[0] += stats.ptr_run_count
    stats.ptr_run_count = 0


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


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


def _dict(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def _grid(value: Any) -> tuple | None:
    if isinstance(value, (list, tuple)):
        return tuple(value)
    return None


def _hashable(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((str(k), _hashable(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(v) for v in value)
    return value


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


class _ProcessBuilder:
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
        self.metadata: dict[Any, dict] = {}  # tid -> latest attn.metadata record
        self.by_gid: dict[Any, GraphModel] = {}
        self.replaying: set[Any] = set()

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

    def handlers(self) -> dict[str, Any]:
        """Kind -> handler; dispatch, mark, probe.error and unknown kinds need nothing here."""
        return {
            "graph.replay": self.replay,
            "attn.metadata": self.attn_metadata,
            "attn.call": self.attn_call,
            "kernel.launch": self.kernel_launch,
            "kernel.split": self.kernel_split,
            "kernel.skip": self.kernel_skip,
            "sync": self.sync,
            "graph.capture.begin": self.capture_begin,
            "graph.capture.end": self.capture_end,
            "graph.nodes": self.graph_nodes,
            "process": self.header,
            "process.rank": self.process_info,
            "process.info": self.process_info,
            "process.end": self.process_end,
        }

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
                    distinct.setdefault((str(node.get("name")), _hashable(node.get("grid"))), node)
            graph.nodes = list(distinct.values())
            graph.nodes_total = len(kernels)
            graph.nodes_ref = self._ref(rec, "graph.nodes")

    def process_info(self, rec: dict) -> None:
        rank = _int(rec.get("rank"))
        if rank is not None:
            self.proc.rank = rank
        ws = _int(rec.get("world_size"))
        if ws is not None:
            self.proc.world_size = ws

    def process_end(self, rec: dict) -> None:
        self.proc.end = rec
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
        tid = rec.get("tid")
        graph.capture_tid = tid
        if graph.parent is None:
            stack = self.stacks.get(tid)
            if stack:
                graph.parent = stack[-1]
        current = self.metadata.get(tid)
        if current is not None:
            graph.capture_metadata = current
            graph.capture_metadata_ref = self._ref(current, "attn.metadata")
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
        stack = self.stacks.get(rec.get("tid"))
        if stack and gid in stack:
            del stack[stack.index(gid):]

    def _count_attention(self, rec: dict, kind: str, name: str) -> None:
        key = f"{kind}:{name}"
        stats = self.proc.attention.get(key)
        if stats is None:
            stats = self.proc.attention[key] = AttentionStats(kind, name, self._ref(rec, kind))
        stats.add(rec, bool(rec.get("capturing")))

    def attn_metadata(self, rec: dict) -> None:
        self._count_attention(rec, "attn.metadata", str(rec.get("backend")))
        self.metadata[rec.get("tid")] = rec
        gid = self._capture_gid(rec) if rec.get("capturing") else None
        if gid is not None:
            ref = self._ref(rec, "attn.metadata")
            graph = self._graph(gid)
            for name, ptr in _dict(rec.get("ptrs")).items():
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

    def attn_call(self, rec: dict) -> None:
        self._count_attention(rec, "attn.call", str(rec.get("op")))
        gid = self._capture_gid(rec)
        if gid is None:
            self._eager(rec, str(rec.get("op")), "attn.call")
            return
        graph = self._graph(gid)
        ref = self._ref(rec, "attn.call")
        op = str(rec.get("op"))
        layer = _hashable(rec.get("layer"))
        hints, ptrs = _dict(rec.get("hints")), _dict(rec.get("ptrs"))
        for name, ptr in ptrs.items():
            if isinstance(ptr, int) and name not in graph.capture_ptrs:
                graph.capture_ptrs[name] = (ptr, ref)
        for call in graph.calls:
            if call.op == op and call.layer == layer and call.hints == hints:
                call.count += 1
                return
        if len(graph.calls) < 4 * MAX_DISTINCT:
            extra = {k: rec[k] for k in ("num_prefills", "num_decodes") if k in rec}
            graph.calls.append(CallShape(ref, op, layer, _text(rec.get("backend")), hints, ptrs,
                                         _dict(rec.get("shapes")), extra=extra))

    def kernel_split(self, rec: dict) -> None:
        gid = self._capture_gid(rec)
        op = _text(rec.get("op"))
        splits = _int(rec.get("num_kv_splits"))
        if gid is None:
            return  # an eager policy evaluation (maybe not even a launch): nothing frozen
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

    def sync(self, rec: dict) -> None:
        gid = self._capture_gid(rec)
        tid = rec.get("tid")
        op, where = _text(rec.get("op")), rec.get("where")
        if gid is not None:
            graph = self._graph(gid)
            for site in graph.syncs:
                if site.op == op and _hashable(site.where) == _hashable(where):
                    site.count += 1
                    return
            if len(graph.syncs) < MAX_SYNC_SITES:
                graph.syncs.append(SyncSite(self._ref(rec, "sync"), op, where, True, gid))
        elif tid in self.replaying:
            key = (self.pid, op, _hashable(where))
            site = self.model.step_syncs.get(key)
            if site is not None:
                site.count += 1
            elif len(self.model.step_syncs) < MAX_SYNC_SITES * 4:
                self.model.step_syncs[key] = SyncSite(self._ref(rec, "sync"), op, where, False, None)

    def replay(self, rec: dict) -> None:
        # the hottest path of a trace (one or two per decode step): keep it lean
        gid = rec.get("gid")
        graph = self.by_gid.get(gid)
        if graph is None:
            if type(gid) is not int:
                return
            graph = self.by_gid[gid] = self._graph(gid)
        stats = graph.replays
        tid = rec.get("tid")
        stats.records += 1
        n = rec.get("n")
        if type(n) is int and n > stats.max_n:
            stats.max_n = n
        if stats.first is None:
            stats.first = self._ref(rec, "graph.replay")
            if self.proc.first_replay_seq is None:
                self.proc.first_replay_seq = stats.first.seq
        self.replaying.add(tid)
        gpu = rec.get("gpu_ns")
        if gpu is not None and type(gpu) is int and gpu >= 0:
            stats.add_gpu_ns(gpu)
        md = self.metadata.get(tid)
        if md is None:
            return
        stats.with_metadata += 1
        smax = md.get("seq_len_max")
        if type(smax) is int and (stats.seq_len_max is None or smax > stats.seq_len_max):
            stats.seq_len_max, stats.seq_len_max_md = smax, md
        smin = md.get("seq_len_min")
        if type(smin) is int:
            if stats.seq_len_min_max is None or smin > stats.seq_len_min_max:
                stats.seq_len_min_max, stats.seq_len_min_max_md = smin, md
            if stats.seq_len_min_min is None or smin < stats.seq_len_min_min:
                stats.seq_len_min_min = smin
        ptrs = md.get("ptrs")
        if ptrs and type(ptrs) is dict:
            if ptrs == stats.ptr_run:  # the usual case: the same static buffers every step
                stats.ptr_run_count += 1
            else:
                self._count_ptrs(stats, ptrs, md)

    def _count_ptrs(self, stats: ReplayStats, ptrs: dict, md: dict) -> None:
        _flush_ptr_run(stats)
        seen_all = stats.ptrs
        for name, ptr in ptrs.items():
            seen = seen_all.get(name)
            if seen is None:
                if type(ptr) is int:
                    seen_all[name] = {ptr: [1, self._ref(md, "attn.metadata")]}
            elif ptr in seen:
                seen[ptr][0] += 1
            elif type(ptr) is int and len(seen) < MAX_DISTINCT:
                seen[ptr] = [1, self._ref(md, "attn.metadata")]
        stats.ptr_run, stats.ptr_run_count = ptrs, 0

    def finish(self, proc_file: Any) -> ProcessModel:
        for graph in self.model.graphs.values():
            stats = graph.replays
            if graph.pid == self.pid:
                _flush_ptr_run(stats)
            if graph.pid == self.pid and stats.seq_len_max_md is not None:
                stats.seq_len_max_ref = self._ref(stats.seq_len_max_md, "attn.metadata")
                stats.seq_len_min_max_ref = (self._ref(stats.seq_len_min_max_md, "attn.metadata")
                                             if stats.seq_len_min_max_md is not None else None)
                stats.seq_len_max_md = stats.seq_len_min_max_md = None
        p = self.proc
        p.gaps = _int(getattr(proc_file, "gaps", 0)) or 0
        p.dropped = _int(getattr(proc_file, "dropped", 0)) or 0
        end = getattr(proc_file, "end", None)
        if isinstance(end, dict) and p.end is None:
            p.end = end
        if p.end is not None:
            p.dropped = max(p.dropped, _int(p.end.get("dropped")) or 0)
        return p


PARALLEL_MIN_BYTES = 48 * 1024 * 1024  # below this, starting workers costs more than it saves


def build_model(trace: Any, workers: int | None = None) -> TraceModel:
    """Stream every process file of an opened trace (mlatrace.trace API) into a TraceModel.

    Process files are independent (gids are per process), so a large trace with several
    processes is split over `workers` processes (default: the CPUs, when it pays off).
    """
    model = TraceModel(root=str(getattr(trace, "root", "")))
    groups = _pid_groups(trace.processes)
    if workers is None:
        workers = _default_workers(trace.processes, len(groups))
    if workers > 1 and len(groups) > 1:
        parts = _build_parallel(trace, groups, workers)
        if parts is not None:
            return _finish_model(model, trace, parts)
    gc_was_enabled = gc.isenabled()
    gc.disable()  # millions of short-lived dicts, no cycles: collections only cost time
    try:
        for proc_file in trace.processes:
            model.processes.append(_stream_process(model, proc_file))
    finally:
        if gc_was_enabled:
            gc.enable()
    model.problems = list(getattr(trace, "problems", [])) + model.problems
    return _finish_model(model, trace, None)


def _finish_model(model: TraceModel, trace: Any, parts: list[TraceModel] | None) -> TraceModel:
    if parts is not None:
        done_files = set()
        for part in parts:
            model.processes.extend(part.processes)
            model.graphs.update(part.graphs)
            model.runtime_eager.update(part.runtime_eager)
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


def _pid_groups(processes: list) -> list[list]:
    """Process files grouped by pid (a rotated process has several parts, kept in order)."""
    groups: dict[Any, list] = {}
    for i, proc in enumerate(processes):
        pid = getattr(proc, "pid", None)
        groups.setdefault(pid if pid is not None else f"#{i}", []).append(proc)
    return list(groups.values())


def _default_workers(processes: list, groups: int) -> int:
    if groups < 2:
        return 1
    try:
        total = sum(p.path.stat().st_size for p in processes)
    except (AttributeError, OSError):
        return 1
    if total < PARALLEL_MIN_BYTES:
        return 1
    return max(1, min(groups, os.cpu_count() or 1))


def _build_parallel(trace: Any, groups: list[list], workers: int) -> list[TraceModel] | None:
    """Build one partial model per worker (files balanced by size); None when workers fail."""
    import concurrent.futures
    import multiprocessing

    buckets: list[list[str]] = [[] for _ in range(workers)]
    sizes = [0] * workers
    for group in sorted(groups, key=lambda g: -sum(_size(p) for p in g)):
        i = sizes.index(min(sizes))
        buckets[i].extend(str(p.path) for p in group)
        sizes[i] += sum(_size(p) for p in group)
    buckets = [b for b in buckets if b]
    # fork only: spawn/forkserver would re-import the caller's __main__ (a script, the CLI);
    # and never fork a process that runs other threads (a recorder, a test harness)
    if "fork" not in multiprocessing.get_all_start_methods() or threading.active_count() > 1:
        return None
    try:
        ctx = multiprocessing.get_context("fork")
        with concurrent.futures.ProcessPoolExecutor(len(buckets), mp_context=ctx) as pool:
            return list(pool.map(_build_partial, buckets))
    except Exception:  # no workers here (sandbox, pickling): the serial path still works
        return None


def _size(proc: Any) -> int:
    try:
        return proc.path.stat().st_size
    except (AttributeError, OSError):
        return 0


def _build_partial(paths: list[str]) -> TraceModel:
    """Worker: open each process file on its own and stream it into a partial model."""
    from mlatrace.trace import open_trace

    model = TraceModel(root="")
    started = time.process_time()
    gc.disable()
    for path in paths:
        trace = open_trace(path)
        for proc_file in trace.processes:
            model.processes.append(_stream_process(model, proc_file))
        model.problems = list(trace.problems) + model.problems
    model.worker_cpu_s = [time.process_time() - started]
    return model


def _stream_process(model: TraceModel, proc_file: Any) -> ProcessModel:
    builder = _ProcessBuilder(model, proc_file)
    header = getattr(proc_file, "header", None)
    if isinstance(header, dict):
        builder.header(header)
    handlers = builder.handlers()
    count = 0
    for rec in proc_file.records():
        count += 1
        try:
            handler = handlers.get(rec.get("k"))
            if handler is not None:
                handler(rec)
        except (AttributeError, TypeError, ValueError, KeyError) as exc:
            seq = rec.get("seq") if isinstance(rec, dict) else None
            model.problems.append(_Problem(builder.file, 0, f"record seq {seq}: field of an "
                                           f"unexpected type ({type(exc).__name__}); skipped"))
    builder.proc.records = count
    return builder.finish(proc_file)


@dataclass(frozen=True)
class _Problem:
    """A record the reader accepted but the model could not use (same shape as trace.Problem)."""

    file: str
    line: int
    reason: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.reason}"


def classify_op(name: str) -> str | None:
    """'prefill' or 'decode' for attention kernels/ops by name (seeds 001/004), else None."""
    lowered = name.lower()
    if any(m in lowered for m in PREFILL_MARKERS):
        return "prefill"
    if any(m in lowered for m in DECODE_MARKERS):
        return "decode"
    return None
