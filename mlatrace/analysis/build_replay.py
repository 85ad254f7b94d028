"""The process builder's handlers of replays: graph.replay (the hottest path of a trace),
graph.replay.time, and `steady` folds of steady steps, read as the replays they stand for."""

from __future__ import annotations

from typing import Any

from mlatrace.analysis.build_fields import as_dict, as_text, flush_ptr_run, fold_record
from mlatrace.analysis.model import (
    GPU_HIST_BITS,
    MAX_DISTINCT,
    REPLAY_INPUTS,
    EagerDecision,
    GraphModel,
    ReplayStats,
    _int,
)
from mlatrace.analysis.series import FLUSH_AT, Series, add_point
from mlatrace.common import hashable
from mlatrace.kinds import (
    ATTN_CALL,
    ATTN_METADATA,
    DISPATCH,
    HOST_DECISION,
    KERNEL_LAUNCH,
    KERNEL_SPLIT,
    REPLAY,
    REPLAY_TIME,
    STEADY,
)
from mlatrace.trace.typed import Record

_GPU_ROUNDED_FROM = 1 << GPU_HIST_BITS   # GPU times from here on lose their low bits


class ReplayHandlers:
    """Handlers of `ProcessBuilder` (mlatrace.analysis.process_builder): replays, replay
    times, steady folds."""

    HANDLES = {REPLAY: "replay", REPLAY_TIME: "replay_time", STEADY: "steady"}

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
            stats.first = self._ref(rec, REPLAY)
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
                entry = values[key] = EagerDecision(self._ref(rec, HOST_DECISION), value,
                                                    as_dict(rec.get("inputs")))
            entry.count += 1

    def _replay_inputs(self, stats: ReplayStats, md: dict) -> None:
        ranges = stats.inputs
        for name in REPLAY_INPUTS:
            value = md.get(name)
            if type(value) is not int:
                continue
            entry = ranges.get(name)
            if entry is None:
                ref = self._ref(md, ATTN_METADATA)
                ranges[name] = [value, ref, value, ref]
            elif value < entry[0]:
                entry[0], entry[1] = value, self._ref(md, ATTN_METADATA)
            elif value > entry[2]:
                entry[2], entry[3] = value, self._ref(md, ATTN_METADATA)

    def _count_ptrs(self, stats: ReplayStats, ptrs: dict, md: dict,
                    sources: dict[str, dict] | None = None) -> None:
        flush_ptr_run(stats)
        seen_all = stats.ptrs
        for name, ptr in ptrs.items():
            seen = seen_all.get(name)
            src = sources.get(name, md) if sources else md
            if seen is None:
                if type(ptr) is int:
                    seen_all[name] = {ptr: [1, self._ref(src, ATTN_METADATA)]}
            elif ptr in seen:
                seen[ptr][0] += 1
            elif type(ptr) is int and len(seen) < MAX_DISTINCT:
                seen[ptr] = [1, self._ref(src, ATTN_METADATA)]
        stats.ptr_run, stats.ptr_run_count = ptrs, 0

    def replay_time(self, rec: Record) -> None:
        """graph.replay.time: the GPU time of replay n of gid, and of each graph around it."""
        gid, n, gpu = rec.gid, rec.n, rec.gpu_ns
        if type(gid) is not int or type(n) is not int or type(gpu) is not int or gpu < 0:
            return
        self._timed(rec, gid, n, gpu, rec.t, rec.get("via") == "host")

    def _steady_times(self, rec: dict, times: dict) -> None:
        """A fold's `times` ({gid: [[n, gpu_ns, t - t_first], ...]}): the graph.replay.time
        records it held, read as those records (their evidence is the steady record)."""
        t_first, host = rec["t_first"], rec.get("times_via") == "host"
        timed = 0
        for gid, entries in times.items():
            for n, gpu, dt in entries:
                self._timed(rec, int(gid), n, gpu, t_first + dt, host)
            timed += len(entries)
        self.proc.kinds[REPLAY_TIME] = self.proc.kinds.get(REPLAY_TIME, 0) + timed

    def _timed(self, rec: Any, gid: int, n: int, gpu: int, t: int, host: bool) -> None:
        graph, seen = self._graph(gid), set()
        add_point(graph.replays, "gpu_times", t, gpu)
        ref = None
        while graph is not None and graph.gid not in seen:
            seen.add(graph.gid)
            stats = graph.replays
            stats.add_timed(n, gpu)
            if host:
                stats.host_timed = True
            if n != 1 and gpu > 0:   # the first replay also uploads the graph
                if stats.gpu_fastest is None or gpu < stats.gpu_fastest:
                    ref = ref or self._ref(rec, REPLAY_TIME)
                    stats.gpu_fastest, stats.gpu_fastest_ref = gpu, ref
                if stats.gpu_slowest is None or gpu > stats.gpu_slowest:
                    ref = ref or self._ref(rec, REPLAY_TIME)
                    stats.gpu_slowest, stats.gpu_slowest_ref = gpu, ref
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
        times = rec.get("times")
        if times:
            self._steady_times(rec, times)
        gid = _int(rec.get("gid"))
        if gid is None or not replays:
            return
        self.proc.kinds[REPLAY] += replays
        graph = self.by_gid.get(gid)
        if graph is None:
            graph = self.by_gid[gid] = self._graph(gid)
        stats = graph.replays
        stats.records += replays
        n_last = _int(rec.get("n_last"))
        if n_last is not None and n_last > stats.max_n:
            stats.max_n = n_last
        if stats.first is None:
            stats.first = self._ref(rec, REPLAY)
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
               if kind == ATTN_METADATA]
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
            if not isinstance(entry, dict) or entry.get("k") == REPLAY:
                continue
            kind = str(entry.get("k"))
            same, ranges = as_dict(entry.get("same")), as_dict(entry.get("range"))
            lo, hi = fold_record(rec, kind, same, ranges, 0), fold_record(rec, kind, same,
                                                                              ranges, 1)
            setup.append((kind, lo, hi))
            kinds[kind] = kinds.get(kind, 0) + steps
            if kind == ATTN_METADATA:
                stats = self._count_attention(lo, kind, str(lo.get("backend")), False)
                stats.add_fields(lo.get("layer"), lo.get("seq_len_min"), hi.get("seq_len_max"),
                                 False)
                stats.count += steps - 2
            elif kind == ATTN_CALL:
                stats = self._count_attention(lo, kind, str(lo.get("op")), False)
                stats.count += steps - 1
                self._eager_steps(lo, str(lo.get("op")), kind, steps)
            elif kind == KERNEL_SPLIT:
                self._runtime_split(lo, _int(lo.get("num_kv_splits")))
            elif kind == KERNEL_LAUNCH:
                self._eager_steps(lo, str(lo.get("name")), kind, steps)
                self._runtime_split(lo, _int(as_dict(lo.get("const")).get("NUM_KV_SPLITS")))
            elif kind == DISPATCH:
                self._steady_dispatch(rec, lo, hi, entry.get("sum"), steps)
            elif kind == HOST_DECISION:
                name = as_text(lo.get("name"))
                if name is not None:
                    self.eager_decisions.setdefault(tid, {})[name] = hi
        self.fold_setup[tid] = setup
        mds = [entry for entry in setup if entry[0] == ATTN_METADATA]
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
