"""The process builder's handlers of the process itself: its header and rank, its end,
probe errors, user marks, and syncs (those on the decode step path feed MLT004)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from mlatrace.analysis.build_fields import add_step_syncs, as_dict, as_text, in_capture_setup
from mlatrace.analysis.model import (
    MAX_MARKS,
    MAX_SYNC_SITES,
    SyncSite,
    _int,
)
from mlatrace.common import hashable
from mlatrace.kinds import (
    MARK,
    PROBE_ERROR,
    PROCESS,
    PROCESS_END,
    PROCESS_INFO,
    PROCESS_RANK,
    SYNC,
)

MAX_PROBE_ERRORS = 200     # probe.error records kept per process (all are counted in kinds)


class ProcessHandlers:
    """Handlers of `ProcessBuilder` (mlatrace.analysis.process_builder): header, rank, end,
    probe errors, marks, syncs."""

    HANDLES = {PROCESS: "header", PROCESS_RANK: "process_info", PROCESS_INFO: "process_info",
               PROCESS_END: "process_end", PROBE_ERROR: "probe_error", MARK: "mark",
               SYNC: "sync"}

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
        p.versions = as_dict(rec.get("versions"))
        p.device = as_dict(rec.get("device"))
        kept = rec.get("ranks_kept")
        if isinstance(kept, list):
            p.ranks_kept = [r for r in (_int(v) for v in kept) if r is not None]
        probes = rec.get("probes")
        p.packs = [str(name) for name in probes] if isinstance(probes, list) else []
        fold_s = rec.get("fold_s")
        p.fold_s = float(fold_s) if type(fold_s) in (int, float) and fold_s > 0 else None

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
        for gid, count in as_dict(rec.get("replays")).items():
            gid_i = int(gid) if isinstance(gid, str) and gid.lstrip("-").isdigit() else _int(gid)
            count_i = _int(count)
            if gid_i is not None and count_i is not None:
                self._graph(gid_i).replays.exact = count_i

    def probe_error(self, rec: dict) -> None:
        if len(self.proc.probe_errors) < MAX_PROBE_ERRORS:
            self.proc.probe_errors.append({
                "file": self.file, "seq": rec.get("seq"), "probe": as_text(rec.get("probe")),
                "target": as_text(rec.get("target")), "reason": as_text(rec.get("reason")),
                "error": as_text(rec.get("error"))})

    def mark(self, rec: dict) -> None:
        """A user annotation (`mlatrace.mark`): the first MAX_MARKS kept, all counted."""
        p = self.proc
        p.marks_total += 1
        if len(p.marks) < MAX_MARKS:
            p.marks.append({"seq": rec.get("seq"), "t": rec.get("t"),
                            "name": as_text(rec.get("name")), "attrs": as_dict(rec.get("attrs"))})

    def sync(self, rec: dict) -> None:
        gid = self._capture_gid(rec)
        tid = rec.get("tid")
        op, where = as_text(rec.get("op")), rec.get("where")
        if in_capture_setup(where):
            return  # torch.cuda.graph's own synchronize before it captures
        if gid is not None:
            graph = self._graph(gid)
            for site in graph.syncs:
                if site.op == op and hashable(site.where) == hashable(where):
                    site.count += 1
                    return
            if len(graph.syncs) < MAX_SYNC_SITES:
                graph.syncs.append(SyncSite(self._ref(rec, SYNC), op, where, True, gid))
        elif tid in self.replaying:
            pending = self.pending_syncs.setdefault(tid, [])
            if len(pending) < MAX_SYNC_SITES:
                # after the step's set-up: input; else it follows a replay: a synchronize
                # reads nothing (a step timer, a barrier: wait), a tensor read reads what
                # the graph wrote (output), whether or not the engine's set-up is probed
                side = ("input" if tid in self.md_since_replay else
                        "wait" if op == "synchronize" else "output")
                pending.append((rec, side))

    def _flush_syncs(self, tid: Any) -> None:
        """Syncs between replays that no capture followed: the decode step path (MLT004)."""
        add_step_syncs(self.step_syncs, self.pid, self.file, self.pending_syncs.pop(tid, ()))

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
                add_step_syncs(sites, self.pid, self.file, pending)
        model_syncs.update(sites)
