"""The graph model: what each capture froze and what its replays later needed.

Built in one streaming pass over every process file of a trace. Memory stays bounded:
a graph keeps aggregates (distinct frozen values with their first evidence, replay
counters, a reservoir of GPU times), never the replay records themselves.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

MAX_DISTINCT = 16          # distinct values kept per frozen item / per pointer name
GPU_RESERVOIR = 4096       # replay GPU times kept per graph for percentiles
MAX_SYNC_SITES = 64

PREFILL_MARKERS = ("flash_attn_varlen", "prefill", "varlen")
DECODE_MARKERS = ("paged_attention", "decode", "mla_gluon")


@dataclass
class Ref:
    """Where a value was seen: the evidence of a finding points at these."""

    file: str
    seq: int
    kind: str


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


@dataclass
class SyncSite:
    ref: Ref
    op: str | None
    where: Any
    capturing: bool
    gid: int | None
    count: int = 1


@dataclass
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
    seq_len_min_min: int | None = None
    ptrs: dict[str, dict[int, list]] = field(default_factory=dict)  # name -> ptr -> [count, Ref]
    gpu_ns: list[int] = field(default_factory=list)
    gpu_seen: int = 0

    @property
    def count(self) -> int:
        if self.exact is not None:
            return max(self.exact, self.max_n, self.records)
        return max(self.max_n, self.records)

    def percentiles(self) -> dict[str, int] | None:
        if not self.gpu_ns:
            return None
        values = sorted(self.gpu_ns)

        def pick(q: float) -> int:
            return values[min(len(values) - 1, int(q * (len(values) - 1) + 0.5))]

        return {"p50": pick(0.5), "p90": pick(0.9), "p99": pick(0.99), "max": values[-1],
                "samples": self.gpu_seen}


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
    nodes: list[dict] = field(default_factory=list)
    nodes_ref: Ref | None = None
    syncs: list[SyncSite] = field(default_factory=list)
    replays: ReplayStats = field(default_factory=ReplayStats)


@dataclass
class TraceModel:
    root: str
    processes: list[ProcessModel] = field(default_factory=list)
    graphs: dict[tuple[int | None, int], GraphModel] = field(default_factory=dict)
    # (pid, op) -> [count, max num_kv_splits, Ref]: split decisions re-made eagerly between replays
    runtime_splits: dict[tuple[int | None, str | None], list] = field(default_factory=dict)
    # syncs outside capture after the thread started replaying (the decode step path)
    step_syncs: dict[tuple[int | None, Any, Any], SyncSite] = field(default_factory=dict)
    problems: list = field(default_factory=list)

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


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


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
    argv = " ".join(str(a) for a in proc.argv)
    if proc.ppid not in pids:
        role = "launcher child" if proc.pid is not None else "process"
    elif "multiprocessing" in argv or "spawn_main" in argv or "forkserver" in argv:
        role = "mp child"
    else:
        role = "child"
    if captured:
        role = "worker" if proc.rank is not None else "capturer"
    return role


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
        self.metadata: dict[Any, tuple[dict, Ref]] = {}
        self.replaying: set[Any] = set()
        self.rng = random.Random(pid or 0)

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

    def feed(self, rec: dict) -> None:
        kind = rec.get("k")
        self.proc.records += 1
        if kind == "graph.replay":
            self.replay(rec)
        elif kind == "attn.metadata":
            self.attn_metadata(rec)
        elif kind == "attn.call":
            self.attn_call(rec)
        elif kind == "kernel.launch":
            self.kernel_launch(rec)
        elif kind == "kernel.split":
            self.kernel_split(rec)
        elif kind == "kernel.skip":
            gid = self._capture_gid(rec)
            if gid is not None:
                self._graph(gid).skips.append((self._ref(rec, kind), rec.get("name"), rec.get("reason")))
        elif kind == "sync":
            self.sync(rec)
        elif kind == "graph.capture.begin":
            self.capture_begin(rec)
        elif kind == "graph.capture.end":
            self.capture_end(rec)
        elif kind == "graph.nodes":
            gid = _int(rec.get("gid"))
            kernels = rec.get("kernels")
            if gid is not None and isinstance(kernels, list):
                graph = self._graph(gid)
                graph.nodes = [k for k in kernels if isinstance(k, dict)]
                graph.nodes_ref = self._ref(rec, kind)
        elif kind == "process":
            self.header(rec)
        elif kind in ("process.rank", "process.info"):
            rank = _int(rec.get("rank"))
            if rank is not None:
                self.proc.rank = rank
            ws = _int(rec.get("world_size"))
            if ws is not None:
                self.proc.world_size = ws
        elif kind == "process.end":
            self.proc.end = rec
            for gid, count in _dict(rec.get("replays")).items():
                gid_i = _int(gid) if not isinstance(gid, str) else (int(gid) if gid.lstrip("-").isdigit() else None)
                count_i = _int(count)
                if gid_i is not None and count_i is not None:
                    self._graph(gid_i).replays.exact = count_i
        # dispatch, mark, probe.error and unknown kinds carry nothing the rules need

    def capture_begin(self, rec: dict) -> None:
        gid = _int(rec.get("gid"))
        if gid is None:
            return
        graph = self._graph(gid)
        graph.parent = _int(rec.get("parent"))
        graph.src = rec.get("src")
        graph.key = rec.get("key")
        graph.mode = rec.get("mode")
        graph.begin = self._ref(rec, "graph.capture.begin")
        tid = rec.get("tid")
        graph.capture_tid = tid
        if graph.parent is None:
            stack = self.stacks.get(tid)
            if stack:
                graph.parent = stack[-1]
        current = self.metadata.get(tid)
        if current is not None:
            graph.capture_metadata, graph.capture_metadata_ref = current
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

    def attn_metadata(self, rec: dict) -> None:
        tid = rec.get("tid")
        ref = self._ref(rec, "attn.metadata")
        gid = self._capture_gid(rec) if rec.get("capturing") else None
        if gid is not None:
            graph = self._graph(gid)
            for name, ptr in _dict(rec.get("ptrs")).items():
                if isinstance(ptr, int) and name not in graph.capture_ptrs:
                    graph.capture_ptrs[name] = (ptr, ref)
            if graph.capture_metadata is None:
                graph.capture_metadata, graph.capture_metadata_ref = rec, ref
        self.metadata[tid] = (rec, ref)

    def attn_call(self, rec: dict) -> None:
        gid = self._capture_gid(rec)
        if gid is None:
            return
        graph = self._graph(gid)
        ref = self._ref(rec, "attn.call")
        op = str(rec.get("op"))
        layer = rec.get("layer")
        hints, ptrs = _dict(rec.get("hints")), _dict(rec.get("ptrs"))
        for name, ptr in ptrs.items():
            if isinstance(ptr, int) and name not in graph.capture_ptrs:
                graph.capture_ptrs[name] = (ptr, ref)
        for call in graph.calls:
            if call.op == op and call.layer == layer and call.hints == hints:
                call.count += 1
                return
        if len(graph.calls) < 4 * MAX_DISTINCT:
            graph.calls.append(CallShape(ref, op, layer, rec.get("backend"), hints, ptrs,
                                         _dict(rec.get("shapes"))))

    def kernel_split(self, rec: dict) -> None:
        gid = self._capture_gid(rec)
        op = rec.get("op")
        splits = _int(rec.get("num_kv_splits"))
        if gid is None:
            if rec.get("tid") in self.replaying:
                entry = self.model.runtime_splits.get((self.pid, op))
                if entry is None:
                    self.model.runtime_splits[(self.pid, op)] = [1, splits, self._ref(rec, "kernel.split")]
                else:
                    entry[0] += 1
                    if splits is not None and (entry[1] is None or splits > entry[1]):
                        entry[1] = splits
            return
        graph = self._graph(gid)
        fields = (op, splits, _int(rec.get("block_n")), rec.get("policy"),
                  _int(rec.get("min_kv_seq_len")))
        for decision in graph.splits:
            if (decision.op, decision.num_kv_splits, decision.block_n, decision.policy,
                    decision.min_kv_seq_len) == fields:
                decision.count += 1
                return
        if len(graph.splits) < MAX_DISTINCT:
            graph.splits.append(SplitDecision(
                self._ref(rec, "kernel.split"), *fields, batch=_int(rec.get("batch")),
                qlen=_int(rec.get("qlen")), nhead=_int(rec.get("nhead")), regime=rec.get("regime")))

    def kernel_launch(self, rec: dict) -> None:
        gid = self._capture_gid(rec)
        if gid is None:
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
        op, where = rec.get("op"), rec.get("where")
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
        gid = _int(rec.get("gid"))
        if gid is None:
            return
        tid = rec.get("tid")
        self.replaying.add(tid)
        stats = self._graph(gid).replays
        stats.records += 1
        n = rec.get("n")
        if isinstance(n, int) and n > stats.max_n:
            stats.max_n = n
        if stats.first is None:
            stats.first = self._ref(rec, "graph.replay")
            if self.proc.first_replay_seq is None:
                self.proc.first_replay_seq = stats.first.seq
        gpu = rec.get("gpu_ns")
        if isinstance(gpu, (int, float)) and not isinstance(gpu, bool):
            stats.gpu_seen += 1
            if len(stats.gpu_ns) < GPU_RESERVOIR:
                stats.gpu_ns.append(int(gpu))
            else:
                slot = self.rng.randrange(stats.gpu_seen)
                if slot < GPU_RESERVOIR:
                    stats.gpu_ns[slot] = int(gpu)
        current = self.metadata.get(tid)
        if current is None:
            return
        md, md_ref = current
        stats.with_metadata += 1
        smax = md.get("seq_len_max")
        if isinstance(smax, int) and (stats.seq_len_max is None or smax > stats.seq_len_max):
            stats.seq_len_max, stats.seq_len_max_ref = smax, md_ref
        smin = md.get("seq_len_min")
        if isinstance(smin, int):
            if stats.seq_len_min_max is None or smin > stats.seq_len_min_max:
                stats.seq_len_min_max, stats.seq_len_min_max_ref = smin, md_ref
            if stats.seq_len_min_min is None or smin < stats.seq_len_min_min:
                stats.seq_len_min_min = smin
        ptrs = md.get("ptrs")
        if ptrs:
            for name, ptr in ptrs.items():
                seen = stats.ptrs.get(name)
                if seen is None:
                    stats.ptrs[name] = {ptr: [1, md_ref]}
                elif ptr in seen:
                    seen[ptr][0] += 1
                elif len(seen) < MAX_DISTINCT:
                    seen[ptr] = [1, md_ref]

    def finish(self, proc_file: Any) -> ProcessModel:
        p = self.proc
        p.gaps = _int(getattr(proc_file, "gaps", 0)) or 0
        p.dropped = _int(getattr(proc_file, "dropped", 0)) or 0
        end = getattr(proc_file, "end", None)
        if isinstance(end, dict) and p.end is None:
            p.end = end
        if p.end is not None:
            p.dropped = max(p.dropped, _int(p.end.get("dropped")) or 0)
        return p


def build_model(trace: Any) -> TraceModel:
    """Stream every process file of an opened trace (mlatrace.trace API) into a TraceModel."""
    model = TraceModel(root=str(getattr(trace, "root", "")))
    for proc_file in trace.processes:
        builder = _ProcessBuilder(model, proc_file)
        header = getattr(proc_file, "header", None)
        if isinstance(header, dict):
            builder.header(header)
        feed = builder.feed
        for rec in proc_file.records():
            if isinstance(rec, dict):
                feed(rec)
        model.processes.append(builder.finish(proc_file))
    pids = {p.pid for p in model.processes}
    captured = {g.pid for g in model.graphs.values()}
    for proc in model.processes:
        proc.role = _infer_role(proc, pids, proc.pid in captured)
    model.problems = list(getattr(trace, "problems", []))
    return model


def classify_op(name: str) -> str | None:
    """'prefill' or 'decode' for attention kernels/ops by name (seeds 001/004), else None."""
    lowered = name.lower()
    if any(m in lowered for m in PREFILL_MARKERS):
        return "prefill"
    if any(m in lowered for m in DECODE_MARKERS):
        return "decode"
    return None
