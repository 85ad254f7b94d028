"""Probe handlers: the logic a path expression cannot express (gids, capture nesting).

A handler is a class named in a pack (``handler = "mlatrace.probe.handlers.vllm:Name"``),
built once per probe with its spec. The engine calls ``before(view, info)`` ahead
of the target and ``after(view, info, token, result, error)`` once it returned or
raised (``token`` is what ``before`` returned). A handler that raises is disabled
by the engine; the target's own behaviour never changes. Handlers run inside the
traced program: standard library only, no device reads, no syncs.

One module per target library: ``torch_graph`` (torch.cuda.CUDAGraph and the
reference HostGraph), ``vllm`` (vLLM's graph wrappers, attention forwards, runner),
``sglang`` (calls that are one keyed capture or replay), ``sync`` (host reads of
device memory). This module holds what they share.
"""

from __future__ import annotations

import time
from typing import Any

from mlatrace import record, settings
from mlatrace.probe import graphs
from mlatrace.probe.device import note_device

GID_ATTR = "_mlatrace_gid"
T0_ATTR = "_mlatrace_t0"
USER_KEEP_ATTR = "_mlatrace_user_keep_graph"


class Handler:
    """Base: keeps the spec, its options and a field extractor.

    A handler class declares the options it reads in OPTIONS ({name: type}; the base's
    are inherited): a pack naming another option, or a value of another type, does not
    load (`packs.check_options`)."""

    OPTIONS: dict[str, Any] = {"src": str}   # the record's src (default: the pack's name)

    def __init__(self, spec: Any) -> None:
        self.spec = spec
        self.options = dict(spec.options)
        self.src = str(self.options.get("src", spec.pack))

    def fields(self, view: Any) -> dict[str, Any]:
        return self.spec.fields_of(view)


def _graph_nodes_enabled() -> bool:
    return settings.current().graph_nodes


def open_capture(src: str, key: Any, mode: Any) -> tuple[int, int]:
    """Give a new capture its gid (parent: the capture open now), record its begin and
    enter it; returns (gid, start ns) for close_capture."""
    gid = graphs.next_gid()
    fields: dict[str, Any] = {"gid": gid, "parent": graphs.parent_gid(), "src": src,
                              "key": key, "mode": mode}
    index = note_device()   # writes the device's `device` record before its first capture
    if index is not None:
        fields["device"] = index
    record.emit_fields("graph.capture.begin", fields)
    graphs.push_capture(gid, src)
    return gid, time.perf_counter_ns()


def close_capture(gid: int, t0: int | None, error: BaseException | None,
                  segments: int | None = 1, eager_breaks: int | None = 0,
                  pool_bytes: int | None = None, pool_shared: bool | None = None) -> None:
    """Leave capture `gid` and record its end: duration, segments, the error if it failed,
    the reserved memory it added where it was measured."""
    graphs.remove_capture(gid)
    fields: dict[str, Any] = {"gid": gid, "segments": segments, "eager_breaks": eager_breaks,
                              "dur_ns": time.perf_counter_ns() - t0 if t0 is not None else None}
    if error is not None:
        fields["error"] = f"{type(error).__name__}: {error}"[:200]
    if pool_bytes is not None:
        fields["pool_bytes"] = pool_bytes
        fields["pool_shared"] = bool(pool_shared)
    record.emit("graph.capture.end", **fields)



def _gids_of(instance: Any) -> dict:
    gids = getattr(instance, "_mlatrace_gids", None)
    if gids is None:
        gids = {}
        try:
            instance._mlatrace_gids = gids
        except Exception:
            pass
    return gids

