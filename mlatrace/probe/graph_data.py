"""A captured torch CUDA graph's kernel nodes, from torch's own graph data where it has it.

Two sources give the same ``graph.nodes`` kernels ``[{name, grid[3], block[3], smem}]``:

- ``torch``: ``CUDAGraph.get_graph_data()`` (pytorch#183165), whose kernel nodes carry
  ``grid_dim`` and ``block_dim`` (pytorch#196018) and ``shared_mem_bytes`` (#196527). It
  reads the driver's node params directly: no DOT text written and parsed. It needs an
  instantiated graph whose template is still alive, the ``cuda.bindings`` package and a
  driver with ``cudaGraphNodeGetToolsId`` (CUDA >= 13.1).
- ``dot``: ``CUDAGraph.debug_dump`` (cudaGraphDebugDotPrint) parsed by
  ``mlatrace.probe.graph_nodes.parse_dot``: every torch with ``keep_graph`` (>= 2.7).

The choice is feature detection, made once per process: ``torch`` when the installed
torch has ``get_graph_data``, it works here, and its kernel nodes carry grid and block
dimensions (torch 2.13 has the method but not the dimensions: names alone cannot judge a
grid, so DOT is used there); else ``dot``. Why DOT was chosen is kept (``why_dot``) and
written on the record as ``source_why``.

Where torch has lifecycle hooks (``register_post_instantiate_hook``, pytorch#187749), the
nodes are read from that hook: the template is alive there whatever ``keep_graph`` the
user chose, so mlatrace does not force ``keep_graph=True`` nor instantiate the graph itself.
Capture-time cost only; nothing here runs on replay.
"""

from __future__ import annotations

import os
import tempfile
import time
import warnings
from typing import Any

from mlatrace import record, settings
from mlatrace.probe.handlers import GID_ATTR

TORCH, DOT = "torch", "dot"
NODES_DONE_ATTR = "_mlatrace_nodes_done"

_state: dict[str, Any] = {"source": None, "why": None}   # the process's choice, once made


def has_instantiate_hook(cls: Any) -> bool:
    """torch's per-graph post-instantiate hook (pytorch#187749): read nodes there."""
    return callable(getattr(cls, "register_post_instantiate_hook", None))


def why_dot() -> str | None:
    """Why this process reads nodes from the DOT dump (None: it does not, or not yet)."""
    return _state["why"] if _state["source"] == DOT else None


def reset() -> None:
    """Forget the process's choice (tests; a forked child keeps its parent's, as it should)."""
    _state.update(source=None, why=None)


def kernels_from_graph_data(data: Any) -> tuple[list[dict] | None, str | None]:
    """(kernels, None) from a get_graph_data() dict, or (None, why) when its kernel nodes
    carry no grid/block dimensions or the dict is not the shape pytorch documents."""
    nodes = data.get("nodes") if isinstance(data, dict) else None
    if not isinstance(nodes, list):
        return None, "get_graph_data() returned no node list"
    kernels = []
    for node in nodes:
        if not isinstance(node, dict) or node.get("node_type") != "kernel":
            continue
        if "grid_dim" not in node or "block_dim" not in node:
            return None, ("get_graph_data() has no grid_dim/block_dim per kernel node "
                          "(pytorch#196018)")
        grid, block, name = node.get("grid_dim"), node.get("block_dim"), node.get("kernel_name")
        if not (_dims_ok(grid) and _dims_ok(block)) or not name:
            continue   # a node whose params the driver did not give (torch reports None)
        smem = node.get("shared_mem_bytes")
        kernels.append({"name": str(name), "grid": [int(v) for v in grid],
                        "block": [int(v) for v in block],
                        "smem": smem if type(smem) is int else 0})
    return kernels, None


def _dims_ok(value: Any) -> bool:
    return (isinstance(value, (list, tuple)) and len(value) == 3
            and all(type(v) is int and v >= 0 for v in value))


def from_torch(graph: Any) -> tuple[list[dict] | None, str | None]:
    """(kernels, None) through get_graph_data(), or (None, why not)."""
    getter = getattr(graph, "get_graph_data", None)
    if getter is None:
        return None, "this torch has no CUDAGraph.get_graph_data (pytorch#183165)"
    try:
        data = getter()
    except Exception as exc:   # no cuda.bindings, a driver without tools ids, no template
        return None, f"get_graph_data(): {type(exc).__name__}: {exc}"[:200]
    return kernels_from_graph_data(data)


def from_dot(graph: Any, gid: int) -> tuple[list[dict], str | None]:
    """(kernels, error) from the graph's DOT debug dump (MLATRACE_KEEP_DOT keeps a copy)."""
    from mlatrace.probe.graph_nodes import parse_dot

    fd, path = tempfile.mkstemp(prefix=f"mlatrace-g{gid}-", suffix=".dot")
    os.close(fd)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # torch warns "DEBUG: calling debug_dump()"
            graph.debug_dump(path)
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read()
        keep_dir = settings.current().keep_dot
        if keep_dir and text:
            os.makedirs(keep_dir, exist_ok=True)
            with open(os.path.join(keep_dir, f"p{os.getpid()}-g{gid}.dot"), "w") as out:
                out.write(text)
        if not text:
            return [], "empty debug dump"
        return parse_dot(text), None
    except Exception as exc:
        return [], f"{type(exc).__name__}: {exc}"[:200]
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass


def read_nodes(graph: Any, gid: int, instantiated: bool) -> dict[str, Any]:
    """The graph.nodes fields of a captured graph: from torch where the process's choice
    says so and the graph is instantiated (get_graph_data needs it), else from DOT."""
    t0 = time.perf_counter_ns()
    kernels, error, why = None, None, None
    if _state["source"] != DOT and instantiated:
        kernels, why = from_torch(graph)
        if kernels is None:
            _state.update(source=DOT, why=why)   # once: later graphs go straight to DOT
        else:
            _state["source"] = TORCH
    elif not instantiated and _state["source"] != DOT:
        why = "graph not instantiated yet (keep_graph=True): get_graph_data needs it"
    else:
        why = _state["why"]
    source = TORCH if kernels is not None else DOT
    if kernels is None:
        kernels, error = from_dot(graph, gid)
    fields: dict[str, Any] = {"gid": gid, "kernels": kernels, "source": source,
                              "dump_ns": time.perf_counter_ns() - t0}
    if source == DOT and why:
        fields["source_why"] = why
    if error:
        fields["error"] = error
    return fields


def emit_nodes(graph: Any, gid: int, instantiated: bool) -> None:
    """Read the graph's kernel nodes and write its graph.nodes record (once per gid)."""
    if getattr(graph, NODES_DONE_ATTR, None) == gid:
        return   # a re-instantiation of the same capture
    try:
        setattr(graph, NODES_DONE_ATTR, gid)
    except Exception:
        pass
    record.emit_fields("graph.nodes", read_nodes(graph, gid, instantiated))


def hook_instantiate(graph: Any, gid: int, runtime_fail: Any = None) -> bool:
    """Read this graph's nodes from torch's post-instantiate hook; False when this torch
    has none (the caller then forces keep_graph and reads after capture_end)."""
    register = getattr(graph, "register_post_instantiate_hook", None)
    if register is None:
        return False

    def on_instantiate(g: Any) -> None:
        if getattr(g, GID_ATTR, None) != gid:
            return   # a hook of an earlier capture of this graph object (reset, captured again)
        try:
            emit_nodes(g, gid, True)
        except Exception as exc:   # never break the program's instantiate()
            if runtime_fail is not None:
                runtime_fail(exc)

    register(on_instantiate)
    return True
