"""Plain-dict views of the model (report --json, diff): one capture unit per root graph.

A capture unit is a root graph (a vLLM wrapper, or a bare torch graph) with the graphs
nested in it; its frozen topology is gathered over the whole subtree, its replays are
the root's (a wrapper replay and its torch replay are one step).
"""

from __future__ import annotations

from typing import Any

from mlatrace.analysis.model import GraphModel, TraceModel

STAGE2_MARKERS = ("stage2", "stage_2", "reduce")


def root_graphs(model: TraceModel) -> list[GraphModel]:
    """Graphs whose parent is unknown to the trace, in (pid, gid) order."""
    roots = [g for g in model.graphs.values() if model.graph(g.pid, g.parent) is None]
    return sorted(roots, key=lambda g: (g.pid or 0, g.gid))


def _is_stage2(name: str) -> bool:
    lowered = name.lower()
    return any(m in lowered for m in STAGE2_MARKERS)


def topology(model: TraceModel, root: GraphModel) -> dict[str, Any]:
    """What the capture of `root` (and the graphs nested in it) froze."""
    graphs = model.subtree(root)
    splits: set[int] = set()
    kernels: dict[str, dict[str, Any]] = {}
    hints: dict[str, Any] = {}
    ops: list[str] = []
    ptrs: dict[str, int] = {}
    stage2 = None
    nodes = 0
    for g in sorted(graphs, key=lambda g: g.gid):
        for d in g.splits:
            if d.num_kv_splits is not None:
                splits.add(d.num_kv_splits)
        for la in g.launches:
            entry = kernels.setdefault(la.name, {"grids": [], "num_kv_splits": []})
            grid = list(la.grid) if la.grid is not None else None
            if grid not in entry["grids"]:
                entry["grids"].append(grid)
            if la.num_kv_splits is not None:
                splits.add(la.num_kv_splits)
                if la.num_kv_splits not in entry["num_kv_splits"]:
                    entry["num_kv_splits"].append(la.num_kv_splits)
            if _is_stage2(la.name):
                stage2 = stage2 or "present"
        nodes += g.nodes_total
        for node in g.nodes:
            if _is_stage2(str(node.get("name", ""))):
                stage2 = stage2 or "present"
        if g.skips:
            stage2 = "skipped"
        for call in g.calls:
            if call.op not in ops:
                ops.append(call.op)
            for name, value in call.hints.items():
                hints.setdefault(name, value)
        for name, (ptr, _ref) in g.capture_ptrs.items():
            ptrs.setdefault(name, ptr)
    md = root.capture_metadata or {}
    return {
        "num_kv_splits": sorted(splits),
        "kernels": kernels,
        "stage2": stage2,
        "hints": hints,
        "ops": ops,
        "ptrs": ptrs,
        "graph_nodes": nodes,
        "capture_seq_len_max": md.get("seq_len_max") if isinstance(md.get("seq_len_max"), int) else None,
        # the sizes of the metadata build the capture began with (kept for a capture that fails)
        "capture_sizes": {name: md.get(name) for name in CAPTURE_SIZES
                          if type(md.get(name)) is int} or None,
    }


CAPTURE_SIZES = ("num_reqs", "num_tokens", "seq_len_max", "max_model_len")
"""attn.metadata fields the report names beside a failed capture's error."""


def replays(model: TraceModel, root: GraphModel, captured_ptrs: dict[str, int]) -> dict[str, Any]:
    """Replay aggregates of the unit: count, lengths seen before replays, pointers, GPU time."""
    stats = root.replays
    if stats.count == 0:  # a bare nested torch graph may carry the replays instead
        for g in model.subtree(root):
            if g.replays.count:
                stats = g.replays
                break
    stable = None
    for name, ptr in captured_ptrs.items():
        seen = stats.ptrs.get(name)
        if seen:
            same = set(seen) == {ptr}
            stable = same if stable is None else (stable and same)
    timed = max((g for g in model.subtree(root) if g.replays.gpu_times is not None),
                key=lambda g: (g.replays.gpu_times.points, -g.gid), default=None)
    return {
        "count": stats.count,
        "seq_len_max": stats.seq_len_max,
        "seq_len_min": stats.seq_len_min_min,
        "ptrs_stable": stable,
        "gpu_ns": stats.percentiles(),
        # over time (analysis.series): seq_len_max before each replay, and the sampled
        # GPU times of the unit's most timed graph (`gid`)
        "lengths": stats.lengths.to_dict() if stats.lengths is not None else None,
        "gpu_times": ({"gid": timed.gid, **timed.replays.gpu_times.to_dict()}
                      if timed is not None else None),
        "gpu_hist": sorted(stats.gpu_hist.items()) or None,
        "timed_via": "host" if stats.host_timed else "gpu" if stats.gpu_seen else None,
    }


def unit_dict(model: TraceModel, root: GraphModel) -> dict[str, Any]:
    """One capture unit as report --json shows it."""
    topo = topology(model, root)
    nested = [g for g in model.subtree(root) if g is not root]
    return {
        "pid": root.pid,
        "rank": model.rank_of(root.pid),
        "file": root.file,
        "gid": root.gid,
        "nested_gids": sorted(g.gid for g in nested),
        "src": root.src,
        "key": model.effective_key(root),
        "mode": model.effective_mode(root),
        "segments": root.segments,
        "eager_breaks": root.eager_breaks,
        "capture_seq": root.begin.seq if root.begin else None,
        # the capture raised (graph.capture.end error): the first error in the unit
        "capture_error": next((g.capture_error for g in (root, *nested)
                               if g.capture_error), None),
        "frozen": topo,
        "replays": replays(model, root, topo["ptrs"]),
        # a breakable capture runs its split-deciding call eagerly between segments: the
        # split counts its process chose at run time (None for a unit with no eager breaks)
        "runtime": ({"num_kv_splits": sorted(model.runtime_splits.get(root.pid, ()))}
                    if root.eager_breaks else None),
    }


def units(model: TraceModel) -> list[dict[str, Any]]:
    return [unit_dict(model, g) for g in root_graphs(model)]
