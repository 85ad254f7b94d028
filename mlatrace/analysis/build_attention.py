"""The process builder's handlers of attention and host decisions: attn.metadata (one per
decode step), attn.call, host.decision, and the eager work done while graphs replay."""

from __future__ import annotations

from typing import Any

from mlatrace.analysis.build_fields import as_dict, as_text
from mlatrace.analysis.model import (
    MAX_DISTINCT,
    AttentionStats,
    CallShape,
    DecisionShape,
    GraphModel,
)
from mlatrace.common import hashable
from mlatrace.kinds import ATTN_CALL, ATTN_METADATA, HOST_DECISION
from mlatrace.trace.typed import Record


class AttentionHandlers:
    """Handlers of `ProcessBuilder` (mlatrace.analysis.process_builder): attention metadata
    and calls, host decisions."""

    HANDLES = {ATTN_METADATA: "attn_metadata", ATTN_CALL: "attn_call",
               HOST_DECISION: "host_decision"}   # kind -> its handler, in this family

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
            stats = self._count_attention(rec, ATTN_METADATA, str(backend), capturing)
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
            ref = self._ref(rec, ATTN_METADATA)
            graph = self._graph(gid)
            for name, ptr in as_dict(ptrs).items():
                if isinstance(ptr, int) and name not in graph.capture_ptrs:
                    graph.capture_ptrs[name] = (ptr, ref)
            if graph.capture_metadata is None:
                graph.capture_metadata, graph.capture_metadata_ref = rec, ref

    def attn_call(self, rec: dict) -> None:
        self._count_attention(rec, ATTN_CALL, str(rec.get("op")))
        gid = self._capture_gid(rec)
        if gid is None:
            self._eager(rec, str(rec.get("op")), ATTN_CALL)
            return
        graph = self._graph(gid)
        ref = self._ref(rec, ATTN_CALL)
        op = str(rec.get("op"))
        layer = hashable(rec.get("layer"))
        hints, ptrs = as_dict(rec.get("hints")), as_dict(rec.get("ptrs"))
        for name, ptr in ptrs.items():
            if isinstance(ptr, int) and name not in graph.capture_ptrs:
                graph.capture_ptrs[name] = (ptr, ref)
        for call in graph.calls:
            if call.op == op and call.layer == layer and call.hints == hints:
                call.count += 1
                return
        if len(graph.calls) < 4 * MAX_DISTINCT:
            extra = {k: rec[k] for k in ("num_prefills", "num_decodes", "dtype") if k in rec}
            graph.calls.append(CallShape(ref, op, layer, as_text(rec.get("backend")), hints, ptrs,
                                         as_dict(rec.get("shapes")), extra=extra))

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

    def host_decision(self, rec: dict) -> None:
        name = as_text(rec.get("name"))
        if name is None:
            return
        gid = self._capture_gid(rec)
        if gid is None:  # eager: the host's current intent, compared at the next replays
            self.eager_decisions.setdefault(rec.get("tid"), {})[name] = rec
            return
        self._add_decision(self._graph(gid), rec)

    def _add_decision(self, graph: GraphModel, rec: dict) -> None:
        name = as_text(rec.get("name"))
        self.track_inputs = True
        value, inputs = rec.get("value"), as_dict(rec.get("inputs"))
        layer = hashable(rec.get("layer"))
        for d in graph.decisions:
            if d.name == name and d.value == value and d.inputs == inputs and d.layer == layer:
                d.count += 1
                return
        if len(graph.decisions) < 4 * MAX_DISTINCT:
            valid = rec.get("valid") if isinstance(rec.get("valid"), dict) else None
            graph.decisions.append(DecisionShape(self._ref(rec, HOST_DECISION), name, value,
                                                 inputs, valid, layer))
