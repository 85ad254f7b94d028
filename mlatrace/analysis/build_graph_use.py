"""The process builder's handlers of graph use: each `dispatch` is a step (graph or eager,
at a captured size, with its real token count); `runner.dummy_run` marks the next dispatch
of its thread as a warm-up or capture run, not a step (mlatrace.analysis.graph_use)."""

from __future__ import annotations

from typing import Any

from mlatrace.analysis.graph_use import (
    OTHER,
    GraphUseStats,
    key_size,
    key_uniform,
    step_is_decode,
)
from mlatrace.analysis.model import _int
from mlatrace.kinds import DISPATCH, RUNNER_DUMMY_RUN

_ANY = object()   # a cached dispatch whose entry holds whatever its real size


class GraphUseHandlers:
    """Handlers of `ProcessBuilder` (mlatrace.analysis.process_builder): dispatches."""

    HANDLES = {DISPATCH: "dispatch", RUNNER_DUMMY_RUN: "runner_dummy_run"}

    def _graph_use(self) -> GraphUseStats:
        stats = self.proc.graph_use
        if stats is None:
            stats = self.proc.graph_use = GraphUseStats()
        return stats

    def dispatch(self, rec: Any) -> None:
        # one per step: the thread's last (mode, key, uniform) and what they gave are
        # kept, so a step like the last costs a few comparisons (no key parsing)
        tid = rec.tid
        if self.dummy_runs and tid in self.dummy_runs:   # a warm-up or capture run
            self.dummy_runs.discard(tid)
            self._graph_use().dummy += 1
            return
        mode, key, uniform, real = rec.mode, rec.key, rec.uniform, rec.num_tokens
        if type(real) is not int:
            real = _int(real)
        last = self.last_dispatch.get(tid)
        if last is None or last[0] != mode or last[1] != key or last[2] != uniform \
                or (last[4] is not _ANY and last[4] != real):   # an eager size is its real one
            last = self._dispatch_entry(rec, tid, mode, key, uniform, real)
        entry, decode = last[3], last[5]
        if decode is None:    # neither the dispatch nor its key says: its requests do
            num_reqs = rec.num_reqs
            if type(num_reqs) is int and real is not None:
                decode = num_reqs == real
            else:               # or the latest metadata (looked at once per record)
                current = self.metadata.get(tid)
                md = current[0] if current else None
                seen = self.md_decode.get(tid)
                if seen is not None and seen[0] is md:
                    decode = seen[1]
                else:
                    decode = step_is_decode(None, None, None, None, md)
                    self.md_decode[tid] = (md, decode)
        entry.steps += 1
        if decode:
            entry.decode += 1
        if real is not None:
            entry.real_steps += 1
            entry.real_sum += real
            if entry.real_min is None or real < entry.real_min:
                entry.real_min = real
            if entry.real_max is None or real > entry.real_max:
                entry.real_max = real

    def _dispatch_entry(self, rec: Any, tid: Any, mode: Any, key: Any, uniform: Any,
                        real: int | None) -> tuple:
        """The size entry a dispatch counts in, and what its mode, key and uniform flag say
        of it (decode: None when only the step's request count or metadata can tell)."""
        text_mode = mode if isinstance(mode, str) else "NONE" if mode is None else str(mode)
        size = key_size(key)
        if text_mode == "NONE" and real is not None:
            size = real
        stats = self._graph_use()
        use_key = (text_mode, size)
        entry = stats.sizes.get(use_key)
        if entry is None:
            stats.add(text_mode, size, self._ref(rec, DISPATCH), 0, False, None, None, None)
            entry = stats.sizes.get(use_key) or stats.sizes[(text_mode, OTHER)]
        decode = uniform if isinstance(uniform, bool) else True if key_uniform(key) else None
        last = (mode, key, uniform, entry, real if text_mode == "NONE" else _ANY, decode)
        self.last_dispatch[tid] = last
        return last

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
        # evidence in a fold points at its `steady` record, as the kind it stands for
        stats.add(mode, size, self._ref(rec, DISPATCH), steps, decode, real_lo, real_hi, total)
