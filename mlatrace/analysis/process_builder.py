"""The builder of one process file: per-thread host state and capture stacks, and the
handler of each record kind. The handlers live by family in `build_capture` (captures,
nodes, kernels, devices), `build_replay` (replays, replay times, steady folds),
`build_attention` (attention, host decisions) and `build_process` (header, end, marks,
syncs), each family naming the kinds it handles (`HANDLES`); `stream` feeds records to
them.

One class, not parts with state of their own: what a record means depends on what the
other families saw on its thread (a replay reads the step's metadata, the decisions made
before it and the syncs since the last one), so the per-thread state is declared once,
in `ProcessBuilder.__init__`, and a family only adds the handlers of its kinds."""

from __future__ import annotations

from typing import Any

from mlatrace.analysis.build_attention import AttentionHandlers
from mlatrace.analysis.build_capture import CaptureHandlers
from mlatrace.analysis.build_fields import flush_ptr_run
from mlatrace.analysis.build_graph_use import GraphUseHandlers
from mlatrace.analysis.build_process import ProcessHandlers
from mlatrace.analysis.build_replay import ReplayHandlers
from mlatrace.analysis.model import (
    AttentionStats,
    GraphModel,
    ProcessModel,
    Ref,
    SyncSite,
    TraceModel,
    Unpickled,
    _int,
)
from mlatrace.kinds import (
    ATTN_METADATA,
)

CUSTOM_SKIPPED = frozenset(("k", "t", "seq", "tid", "repeat"))  # not probe fields


class ProcessBuilder(CaptureHandlers, ReplayHandlers, AttentionHandlers, ProcessHandlers,
                     GraphUseHandlers, Unpickled):
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
        # tids inside a runner's dummy run: their next dispatch is no step (graph use)
        self.dummy_runs: set[Any] = set()
        # tid -> its last dispatch's (mode, key, uniform, size entry, size, decode)
        self.last_dispatch: dict[Any, tuple] = {}
        self.md_decode: dict[Any, tuple] = {}   # tid -> (metadata record, decode step?)

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
    def custom_record(self, kind: str, rec: Any) -> None:
        """A record of a kind mlatrace does not know (a user pack's `kind`): count, per
        field, the records in which it was null (coverage: a path that resolves to nothing)."""
        entry = self.proc.custom_nulls.get(kind)
        if entry is None:
            entry = self.proc.custom_nulls[kind] = [0, {}]
        entry[0] += 1
        nulls = entry[1]
        for name, value in rec.items():
            if name not in CUSTOM_SKIPPED:
                nulls[name] = nulls.get(name, 0) + (value is None)

    FAMILIES = (ReplayHandlers, AttentionHandlers, CaptureHandlers, ProcessHandlers,
                GraphUseHandlers)

    def handlers(self) -> dict[str, Any]:
        """Kind -> handler: each family's `HANDLES` (a kind the analysis reads is declared
        `built` in mlatrace/kinds.py and handled in one family); probe.error and unknown
        kinds need nothing here."""
        return {kind: getattr(self, name) for family in self.FAMILIES
                for kind, name in family.HANDLES.items()}

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
            flush_ptr_run(stats)
            stats.fold_timed()
            # resolve whichever record changed since the last snapshot
            if stats.seq_len_max_md is not None:
                stats.seq_len_max_ref = self._ref(stats.seq_len_max_md, ATTN_METADATA)
                stats.seq_len_max_md = None
            if stats.seq_len_min_max_md is not None:
                stats.seq_len_min_max_ref = self._ref(stats.seq_len_min_max_md, ATTN_METADATA)
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
