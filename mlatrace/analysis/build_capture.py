"""The process builder's handlers of what a capture froze: graph captures and their
nodes, the kernels launched (or skipped, or split) inside them, the devices."""

from __future__ import annotations

from mlatrace.analysis.build_fields import as_dict, as_grid, as_text, key_text
from mlatrace.analysis.model import (
    MAX_DISTINCT,
    MAX_NODES,
    LaunchShape,
    SplitDecision,
    _int,
)
from mlatrace.common import hashable
from mlatrace.kinds import (
    ATTN_METADATA,
    CAPTURE_BEGIN,
    CAPTURE_END,
    DEVICE,
    GRAPH_NODES,
    KERNEL_LAUNCH,
    KERNEL_SKIP,
    KERNEL_SPLIT,
)


class CaptureHandlers:
    """Handlers of `ProcessBuilder` (mlatrace.analysis.process_builder): captures, nodes,
    kernels, devices."""

    HANDLES = {CAPTURE_BEGIN: "capture_begin", CAPTURE_END: "capture_end",
               GRAPH_NODES: "graph_nodes", DEVICE: "device", KERNEL_SKIP: "kernel_skip",
               KERNEL_SPLIT: "kernel_split", KERNEL_LAUNCH: "kernel_launch"}

    def capture_begin(self, rec: dict) -> None:
        gid = _int(rec.get("gid"))
        if gid is None:
            return
        graph = self._graph(gid)
        graph.parent = _int(rec.get("parent"))
        graph.src = as_text(rec.get("src"))
        graph.key = key_text(rec.get("key"))
        graph.mode = as_text(rec.get("mode"))
        graph.begin = self._ref(rec, CAPTURE_BEGIN)
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
            graph.capture_metadata_ref = self._ref(current, ATTN_METADATA)
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
        graph.end = self._ref(rec, CAPTURE_END)
        graph.segments = _int(rec.get("segments"))
        graph.eager_breaks = _int(rec.get("eager_breaks"))
        graph.dur_ns = _int(rec.get("dur_ns"))
        graph.capture_error = as_text(rec.get("error"))
        graph.end_t = _int(rec.get("t"))
        graph.pool_bytes = _int(rec.get("pool_bytes"))
        graph.pool_shared = rec.get("pool_shared") is True
        self.dummy_runs.discard(rec.get("tid"))   # a dummy run that captured: it is over
        stack = self.stacks.get(rec.get("tid"))
        if stack and gid in stack:
            del stack[stack.index(gid):]

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
            graph.nodes_ref = self._ref(rec, GRAPH_NODES)

    def device(self, rec: dict) -> None:
        """A `device` record (the reader checked its fields): the SM count of one GPU."""
        index = _int(rec.get("index"))
        if index is not None and index not in self.proc.devices:
            self.proc.devices[index] = {
                "index": index, "name": as_text(rec.get("name")), "arch": as_text(rec.get("arch")),
                "sms": _int(rec.get("sms")), "ref": self._ref(rec, DEVICE)}

    def kernel_skip(self, rec: dict) -> None:
        gid = self._capture_gid(rec)
        if gid is not None and len(self._graph(gid).skips) < MAX_DISTINCT:
            self._graph(gid).skips.append((self._ref(rec, KERNEL_SKIP), as_text(rec.get("name")),
                                           as_text(rec.get("reason"))))

    def kernel_split(self, rec: dict) -> None:
        gid = self._capture_gid(rec)
        op = as_text(rec.get("op"))
        splits = _int(rec.get("num_kv_splits"))
        if gid is None:  # an eager policy evaluation (maybe not even a launch): nothing frozen
            self._runtime_split(rec, splits)
            return
        graph = self._graph(gid)
        fields = (op, splits, _int(rec.get("block_n")), as_text(rec.get("policy")),
                  _int(rec.get("min_kv_seq_len")))
        for decision in graph.splits:
            if (decision.op, decision.num_kv_splits, decision.block_n, decision.policy,
                    decision.min_kv_seq_len) == fields:
                decision.count += 1
                return
        if len(graph.splits) < MAX_DISTINCT:
            graph.splits.append(SplitDecision(
                self._ref(rec, KERNEL_SPLIT), *fields, batch=_int(rec.get("batch")),
                qlen=_int(rec.get("qlen")), nhead=_int(rec.get("nhead")), regime=as_text(rec.get("regime"))))

    def kernel_launch(self, rec: dict) -> None:
        gid = self._capture_gid(rec)
        if gid is None:
            self._eager(rec, str(rec.get("name")), KERNEL_LAUNCH)
            self._runtime_split(rec, _int(as_dict(rec.get("const")).get("NUM_KV_SPLITS")))
            return
        graph = self._graph(gid)
        name = str(rec.get("name"))
        grid = as_grid(rec.get("grid"))
        const = as_dict(rec.get("const"))
        for launch in graph.launches:
            if launch.name == name and launch.grid == grid and launch.const == const:
                launch.count += 1
                return
        if len(graph.launches) < 4 * MAX_DISTINCT:
            graph.launches.append(LaunchShape(self._ref(rec, KERNEL_LAUNCH), name, grid, const))
