"""The graph model: what each capture froze and what its replays later needed.

The dataclasses only; ``builder`` fills them in one streaming pass over each process
file, ``parallel`` spreads large traces over worker processes. Memory stays bounded:
a graph keeps aggregates (distinct frozen values with their first evidence, replay
counters, a reservoir of GPU times), never the replay records themselves.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from operator import mul
from typing import Any

MAX_DISTINCT = 16          # distinct values kept per frozen item / per pointer name
GPU_HIST_BITS = 8          # GPU-time histogram keeps 8 significant bits (<0.8% error)
GPU_EXACT_TIMES = 256      # ... once it holds more distinct times than this; exact before
MAX_SYNC_SITES = 64
MAX_NODES = 256            # distinct (name, grid) graph nodes kept per graph
MAX_LAYERS = 512           # distinct layer names counted per attention op
MAX_MARKS = 100            # mlatrace.mark() annotations kept per process (all are counted)
MAX_TIMED_N = 1 << 20      # replay numbers kept per graph while summing child replay times

PREFILL_MARKERS = ("flash_attn_varlen", "prefill", "varlen")
DECODE_MARKERS = ("paged_attention", "decode", "mla_gluon")


class Unpickled:
    """A class whose instances a worker hands back pickled, and that the parent then keeps
    updating record by record (`IncrementalBuilder.absorb`): unpickling sets their
    attributes one by one, as construction does. The default assigns the pickled dict
    whole, and CPython reads the attributes of such an instance about 20% slower."""

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            setattr(self, name, value)


@dataclass(slots=True)
class Ref:
    """Where a value was seen: the evidence of a finding points at these."""

    file: str
    seq: int
    kind: str


@dataclass(slots=True)
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
        self.add_fields(rec.get("layer"), rec.get("seq_len_min"), rec.get("seq_len_max"),
                        captured)

    def add_fields(self, layer: Any, low: Any, high: Any, captured: bool) -> None:
        """`add` of a record whose fields the caller already read."""
        self.count += 1
        if captured:
            self.captured += 1
        if layer is not None and len(self.layers) < MAX_LAYERS:
            self.layers.add(str(layer))
        if type(low) is not int:
            low = _int(low)
        if low is not None and (self.seq_len_min is None or low < self.seq_len_min):
            self.seq_len_min = low
        if type(high) is not int:
            high = _int(high)
        if high is not None and (self.seq_len_max is None or high > self.seq_len_max):
            self.seq_len_max = high


@dataclass
class ProcessModel(Unpickled):
    file: str
    pid: int | None
    ppid: int | None = None
    rank: int | None = None
    world_size: int | None = None
    argv: list[str] = field(default_factory=list)
    schema: str | None = None
    versions: dict = field(default_factory=dict)
    device: dict = field(default_factory=dict)
    # `device` records: index -> {index, name, arch, sms, ref} (the SM count MLT008 needs)
    devices: dict[int, dict] = field(default_factory=dict)
    role: str = "process"
    records: int = 0
    has_header: bool = False
    end: dict | None = None
    gaps: int = 0
    dropped: int = 0
    first_replay_seq: int | None = None
    attention: dict[str, AttentionStats] = field(default_factory=dict)
    ranks_kept: list[int] | None = None        # header: --ranks (ranks left out on purpose)
    packs: list[str] = field(default_factory=list)   # header `probes`: packs installed
    fold_s: float | None = None    # header: the fold interval of steady steps (None: off)
    kinds: Counter = field(default_factory=Counter)   # records per kind
    probe_errors: list[dict] = field(default_factory=list)  # probe.error records (+file, seq)
    marks: list[dict] = field(default_factory=list)   # {seq, t, name, attrs}, the first MAX_MARKS
    marks_total: int = 0
    # records of kinds mlatrace does not know (a user pack's probe `kind`): kind ->
    # [records, {field: how many of them held null}] (a path that resolves to nothing)
    custom_nulls: dict[str, list] = field(default_factory=dict)
    graph_use: Any = None   # analysis.graph_use.GraphUseStats: its dispatched steps
    t_last: int | None = None   # `t` of the last record read (graph use's memory-time)


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
class DecisionShape:
    """One distinct host.decision (name, value, inputs) made while capturing."""

    ref: Ref
    name: str
    value: Any
    inputs: dict
    valid: dict | None
    layer: Any = None
    count: int = 1


@dataclass(slots=True)
class EagerDecision:
    """One value of a decision the host made eagerly, after the capture, before replays."""

    ref: Ref
    value: Any
    inputs: dict
    count: int = 0


REPLAY_INPUTS = ("seq_len_max", "seq_len_min", "num_reqs", "max_query_len", "num_tokens")
"""attn.metadata fields whose range over the replays decisions are checked against."""


@dataclass
class SyncSite:
    ref: Ref
    op: str | None
    where: Any
    capturing: bool
    gid: int | None
    count: int = 1
    # which side of a step: "input" (inside capture, or after the step's set-up and before
    # its replay), "output" (after a replay, before the next set-up: a readback of the
    # step's results), or "unknown" (the engine's set-up is not probed)
    side: str = "input"


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
    # attn.metadata records are `mlatrace.trace.typed.Record`s (read like dicts: `get`)
    seq_len_max_md: Any = None  # the metadata records behind the two refs (while streaming)
    seq_len_min_max_md: Any = None
    latest_md: Any = None     # the metadata before the latest replay (watch shows it)
    seq_len_min_min: int | None = None
    ptrs: dict[str, dict[int, list]] = field(default_factory=dict)  # name -> ptr -> [count, Ref]
    gpu_hist: dict[int, int] = field(default_factory=dict)  # value rounded to 8 bits -> count
    ptr_run: dict | None = None       # the last pointer set seen, and how many replays since
    ptr_run_count: int = 0
    # host.decision name -> value key -> EagerDecision made after the capture, before a replay
    decisions: dict[str, dict[Any, EagerDecision]] = field(default_factory=dict)
    # REPLAY_INPUTS name -> [lo, lo Ref, hi, hi Ref] over the metadata before the replays
    inputs: dict[str, list] = field(default_factory=dict)
    last_md: Any = None
    # replay n -> [GPU ns summed over the timed replays of this graph and the graphs nested
    # in it with that n, how many]; fold_timed() puts the sums in gpu_hist at each finish
    gpu_by_n: dict[int, list] | None = None
    # gpu_hist's keys are exact times until it holds GPU_EXACT_TIMES distinct ones; then
    # every key is rounded to GPU_HIST_BITS significant bits (and stays so)
    gpu_rounded: bool = False
    host_timed: bool = False  # a graph.replay.time of it said via "host" (a CPU host graph)
    timed_folded: list[int] | None = None  # the rounded sums the last fold_timed() added
    # the graph.replay.time records of the fastest and slowest timed replay after the first
    # (MLT008's evidence), with their times
    gpu_fastest: int | None = None
    gpu_fastest_ref: Ref | None = None
    gpu_slowest: int | None = None
    gpu_slowest_ref: Ref | None = None
    # analysis.series.Series over time: seq_len_max before each replay of a unit's
    # outermost replayed graph, and the GPU time of each graph.replay.time of this graph
    lengths: Any = None
    gpu_times: Any = None

    @property
    def count(self) -> int:
        if self.exact is not None:
            return max(self.exact, self.max_n, self.records)
        return max(self.max_n, self.records)

    @property
    def gpu_seen(self) -> int:
        """Replays with a GPU time (the histogram is the one count: replays only add to it)."""
        return sum(self.gpu_hist.values())

    @property
    def gpu_sum(self) -> int:
        """Their GPU times summed, as the histogram keeps them (rounded down, <0.8%)."""
        hist = self.gpu_hist
        return sum(map(mul, hist, hist.values()))

    def add_gpu_ns(self, value: int) -> int:
        """Count one replay's GPU time; returns the value as the histogram keeps it.

        Exact while few distinct times were seen (GPU_EXACT_TIMES): the quantiles of a
        handful of samples are the samples themselves; beyond, 8 significant bits."""
        hist = self.gpu_hist
        if not self.gpu_rounded and value not in hist and len(hist) >= GPU_EXACT_TIMES:
            self.gpu_rounded = True
            rounded: dict[int, int] = {}
            for key, count in hist.items():
                key = _round_gpu(key)
                rounded[key] = rounded.get(key, 0) + count
            self.gpu_hist = hist = rounded
        if self.gpu_rounded:
            value = _round_gpu(value)
        hist[value] = hist.get(value, 0) + 1
        return value

    def _remove_gpu_ns(self, value: int) -> None:
        """Undo add_gpu_ns of a value it returned."""
        hist = self.gpu_hist
        if self.gpu_rounded:
            value = _round_gpu(value)
        left = hist[value] - 1
        if left:
            hist[value] = left
        else:
            del hist[value]

    def add_timed(self, n: int, gpu_ns: int) -> None:
        """One timed replay numbered n, of this graph or of a graph nested in it."""
        by_n = self.gpu_by_n
        if by_n is None:
            by_n = self.gpu_by_n = {}
        entry = by_n.get(n)
        if entry is not None:
            entry[0] += gpu_ns
            entry[1] += 1
        elif len(by_n) < MAX_TIMED_N:
            by_n[n] = [gpu_ns, 1]

    def fold_timed(self) -> None:
        """Per replay n, the summed time of its timed (nested) replays joins the histogram.

        A wrapper replay is the sum of the torch replays it caused (same n); an n for which
        fewer of them were timed than for the others is left out rather than undercounted.
        A trace still being written is finished at every snapshot and a later record may
        still add to an n, so the previous fold is taken back first: folding again gives
        the histogram that one fold at the end gives.
        """
        for value in self.timed_folded or ():
            self._remove_gpu_ns(value)
        self.timed_folded = None
        by_n = self.gpu_by_n
        if not by_n or self.gpu_hist:  # its own replay records carried gpu_ns (older
            return                     # traces): those are its times, not a second count
        most = max(count for _ns, count in by_n.values())
        self.timed_folded = [self.add_gpu_ns(ns) for ns, count in by_n.values() if count == most]

    def percentiles(self) -> dict[str, int] | None:
        """GPU-time percentiles (nearest rank: the p50 of three samples is the middle one) of
        the timed replays: exact while at most GPU_EXACT_TIMES distinct times were seen,
        beyond that each rounded down to 8 significant bits (< 0.8% low)."""
        seen = self.gpu_seen
        if not seen:
            return None
        values = sorted(self.gpu_hist.items())
        out: dict[str, int] = {}
        for name, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
            target, running = q * seen, 0
            for value, count in values:
                running += count
                if running >= target:
                    out[name] = value
                    break
        out["max"] = values[-1][0]
        out["samples"] = seen
        out["mean"] = self.gpu_sum // seen
        return out


def _round_gpu(value: int) -> int:
    """`value` to GPU_HIST_BITS significant bits, rounded down (idempotent)."""
    shift = value.bit_length() - GPU_HIST_BITS
    return (value >> shift) << shift if shift > 0 else value


@dataclass
class GraphModel(Unpickled):
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
    capture_error: str | None = None   # graph.capture.end error: the capture raised
    end_t: int | None = None       # graph.capture.end `t`
    pool_bytes: int | None = None  # graph.capture.end `pool_bytes`: reserved memory it added
    pool_shared: bool = False      # graph.capture.end `pool_shared`: a pool other captures share
    capture_tid: Any = None
    device: int | None = None      # graph.capture.begin `device`: the index it captured on
    capture_metadata: Any = None   # the attn.metadata Record current when capture began (seq lens)
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
    decisions: list[DecisionShape] = field(default_factory=list)
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
    # pid -> distinct split counts chosen eagerly after the thread began replaying
    # (kernel.split, or a launch's NUM_KV_SPLITS): what a breakable capture's eager MLA
    # call picked at run time, with the real lengths
    runtime_splits: dict[int | None, set[int]] = field(default_factory=dict)
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

    def device_of(self, graph: GraphModel) -> dict | None:
        """The `device` record (index, name, arch, sms, ref) of the GPU graph was captured
        on: the index its capture (or an enclosing one) named, else the process's only
        device; None when the process wrote no device record (never a guessed SM count)."""
        proc = self.process(graph.pid)
        if proc is None or not proc.devices:
            return None
        for g in self.ancestors(graph):
            if g.device is not None:
                return proc.devices.get(g.device)
        if len(proc.devices) == 1:
            return next(iter(proc.devices.values()))
        return None

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


def classify_op(name: str) -> str | None:
    """'prefill' or 'decode' for attention kernels/ops by name (seeds 001/004), else None."""
    lowered = name.lower()
    if any(m in lowered for m in PREFILL_MARKERS):
        return "prefill"
    if any(m in lowered for m in DECODE_MARKERS):
        return "decode"
    return None
