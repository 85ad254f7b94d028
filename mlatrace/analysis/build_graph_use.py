"""The process builder's handlers of graph use: each `dispatch` is a step (graph or eager,
at a captured size, with its real token count); `runner.dummy_run` marks the next dispatch
of its thread as a warm-up or capture run, not a step (mlatrace.analysis.graph_use)."""

from __future__ import annotations

from typing import Any

from mlatrace.analysis.graph_use import GraphUseStats, key_size, step_is_decode
from mlatrace.analysis.model import _int
from mlatrace.kinds import DISPATCH, STEADY


class GraphUseHandlers:
    """Handlers of `ProcessBuilder` (mlatrace.analysis.process_builder): dispatches."""

    def _graph_use(self) -> GraphUseStats:
        stats = self.proc.graph_use
        if stats is None:
            stats = self.proc.graph_use = GraphUseStats()
        return stats

    def dispatch(self, rec: Any) -> None:
        tid = rec.get("tid")
        stats = self._graph_use()
        if tid in self.dummy_runs:      # the dispatch of a warm-up or capture run
            self.dummy_runs.discard(tid)
            stats.dummy += 1
            return
        mode = rec.get("mode")
        mode = mode if isinstance(mode, str) else "NONE" if mode is None else str(mode)
        key = rec.get("key")
        real = _int(rec.get("num_tokens"))
        current = self.metadata.get(tid)
        decode = step_is_decode(rec.get("uniform"), key, rec.get("num_reqs"), real,
                                current[0] if current else None)
        size = key_size(key)
        if mode == "NONE" and real is not None:
            size = real
        stats.add(mode, size, self._ref(rec, DISPATCH), 1, decode, real, real, real)

    def runner_dummy_run(self, rec: dict) -> None:
        self.dummy_runs.add(rec.get("tid"))

    def _steady_dispatch(self, rec: dict, lo: dict, hi: dict, sums: Any, steps: int) -> None:
        """`steps` folded dispatches alike (a fold's pattern entry of kind dispatch)."""
        stats = self._graph_use()
        mode = lo.get("mode")
        mode = mode if isinstance(mode, str) else "NONE" if mode is None else str(mode)
        key = lo.get("key")
        real_lo, real_hi = _int(lo.get("num_tokens")), _int(hi.get("num_tokens"))
        total = _int(sums.get("num_tokens")) if isinstance(sums, dict) else None
        if total is None and real_lo is not None and real_hi is not None:
            if real_lo != real_hi:   # an older fold without sums: the middle of its range
                stats.estimated += steps
            total = (real_lo + real_hi) * steps // 2
        md = self.metadata.get(rec.get("tid"))
        decode = step_is_decode(lo.get("uniform"), key, lo.get("num_reqs"), real_lo,
                                md[0] if md else None)
        size = key_size(key)
        if mode == "NONE" and real_hi is not None:
            size = real_hi
        stats.add(mode, size, self._ref(rec, STEADY), steps, decode, real_lo, real_hi, total)
