"""Probe handlers: the logic a path expression cannot express (gids, capture nesting).

A handler is a class named in a pack (``handler = "mlatrace.probe.handlers:Name"``),
built once per probe with its spec. The engine calls ``before(view, info)`` ahead
of the target and ``after(view, info, token, result, error)`` once it returned or
raised (``token`` is what ``before`` returned). A handler that raises is disabled
by the engine; the target's own behaviour never changes. Handlers run inside the
traced program: standard library only, no device reads, no syncs.
"""

from __future__ import annotations

import os
import tempfile
import time
import warnings
from typing import Any

from mlatrace import record
from mlatrace.probe import graphs
from mlatrace.probe.paths import plain

GID_ATTR = "_mlatrace_gid"
T0_ATTR = "_mlatrace_t0"
USER_KEEP_ATTR = "_mlatrace_user_keep_graph"


class Handler:
    """Base: keeps the spec, its options and a field extractor."""

    def __init__(self, spec: Any) -> None:
        self.spec = spec
        self.options = dict(spec.options)
        self.src = str(self.options.get("src", spec.pack))

    def fields(self, view: Any) -> dict[str, Any]:
        return self.spec.fields_of(view)


def _graph_nodes_enabled() -> bool:
    try:
        return bool(record.settings().get("graph_nodes", True))
    except Exception:
        return os.environ.get("MLATRACE_GRAPH_NODES", "1") != "0"


# --- torch.cuda.CUDAGraph and look-alikes (the reference HostGraph) ----------------


class GraphCaptureBegin(Handler):
    """capture_begin: give the graph a gid, note its parent, enter the capture."""

    def before(self, view: Any, info: Any) -> Any:
        graph = view.instance
        if self.options.get("graph_nodes") and getattr(graph, USER_KEEP_ATTR, None) is not None:
            # The graph was created with keep_graph forced on (TorchGraphNew): ask for
            # the debug dump before the capture starts, as torch requires.
            enable = getattr(graph, "enable_debug_mode", None)
            if enable is not None:
                enable()
        return None

    def after(self, view: Any, info: Any, token: Any, result: Any, error: Any) -> None:
        if error is not None:
            return
        graph = view.instance
        gid = graphs.next_gid()
        parent = graphs.current_gid()
        setattr(graph, GID_ATTR, gid)
        setattr(graph, T0_ATTR, time.perf_counter_ns())
        graphs.push_capture(gid)
        record.emit("graph.capture.begin", gid=gid, parent=parent, src=self.src,
                    key=None, mode=None)


class GraphCaptureEnd(Handler):
    """capture_end: leave the capture, record its duration and its kernel nodes."""

    def after(self, view: Any, info: Any, token: Any, result: Any, error: Any) -> None:
        graph = view.instance
        gid = getattr(graph, GID_ATTR, None)
        if gid is None:
            return
        graphs.remove_capture(gid)
        t0 = getattr(graph, T0_ATTR, None)
        dur_ns = time.perf_counter_ns() - t0 if t0 is not None else None
        fields: dict[str, Any] = {"gid": gid, "segments": 1, "eager_breaks": 0, "dur_ns": dur_ns}
        if error is not None:
            fields["error"] = f"{type(error).__name__}: {error}"[:200]
        record.emit("graph.capture.end", **fields)
        if error is None and self.options.get("graph_nodes"):
            user_keep = getattr(graph, USER_KEEP_ATTR, None)
            if user_keep is not None:
                dump_graph_nodes(graph, gid, user_keep)


def dump_graph_nodes(graph: Any, gid: int, user_keep: bool) -> None:
    """Write the graph's DOT dump, emit graph.nodes, then restore the user's keep_graph.

    The graph was built with keep_graph=True so that its template survives capture
    (torch writes nothing otherwise). A user who asked for keep_graph=False gets
    the instantiation capture_end would have done, right here, so replay behaves
    as before; the template stays alive (host memory, freed with the graph).
    """
    from mlatrace.probe.graph_nodes import parse_dot

    t0 = time.perf_counter_ns()
    kernels: list[dict] | None = None
    error = None
    fd, path = tempfile.mkstemp(prefix=f"mlatrace-g{gid}-", suffix=".dot")
    os.close(fd)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # torch warns "DEBUG: calling debug_dump()"
            graph.debug_dump(path)
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read()
        kernels = parse_dot(text) if text else []
        if not text:
            error = "empty debug dump"
        keep_dir = os.environ.get("MLATRACE_KEEP_DOT")
        if keep_dir and text:
            os.makedirs(keep_dir, exist_ok=True)
            with open(os.path.join(keep_dir, f"p{os.getpid()}-g{gid}.dot"), "w") as out:
                out.write(text)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"[:200]
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
    if not user_keep:
        graph.instantiate()
    fields: dict[str, Any] = {"gid": gid, "kernels": kernels or [],
                              "dump_ns": time.perf_counter_ns() - t0}
    if error:
        fields["error"] = error
    record.emit("graph.nodes", **fields)


class GraphReplay(Handler):
    """replay: count it against the graph's gid (no device work, no sync)."""

    def after(self, view: Any, info: Any, token: Any, result: Any, error: Any) -> None:
        if error is not None:
            return
        gid = getattr(view.instance, GID_ATTR, None)
        if gid is None:
            gid = graphs.next_gid()     # captured before mlatrace was installed
            setattr(view.instance, GID_ATTR, gid)
        record.emit_replay(gid)


class TorchGraphNew(Handler):
    """torch.cuda.CUDAGraph.__new__: build graphs with keep_graph=True for the node dump.

    Replaces the staticmethod outright (no wrapt proxy): ``__new__`` is looked up
    on the type by the interpreter. The user's choice is remembered on the
    instance and honoured at capture end (see dump_graph_nodes).
    """

    def replacement(self, info: Any, runtime: Any) -> Any:
        from mlatrace.probe.engine import STATE

        original = info.func
        enabled = _graph_nodes_enabled() and bool(self.options.get("graph_nodes", True))

        def __new__(cls, keep_graph: bool = False, *args: Any, **kwargs: Any):
            if not enabled or runtime.disabled or not STATE.active:
                return original(cls, keep_graph, *args, **kwargs)
            try:
                instance = original(cls, True, *args, **kwargs)
            except Exception as exc:
                runtime.fail(info.target, exc)
                return original(cls, keep_graph, *args, **kwargs)
            try:
                setattr(instance, USER_KEEP_ATTR, bool(keep_graph))
            except Exception as exc:
                runtime.fail(info.target, exc)
            return instance

        return staticmethod(__new__)


# --- vLLM: CUDAGraphWrapper, BreakableCUDAGraphWrapper, eager breaks -------------------


def _forward_context() -> Any:
    from vllm.forward_context import get_forward_context, is_forward_context_available

    if not is_forward_context_available():
        return None
    return get_forward_context()


def _mode_name(mode: Any) -> str | None:
    return None if mode is None else getattr(mode, "name", str(mode))


class VllmGraphWrapperCall(Handler):
    """CUDAGraphWrapper.__call__: capture (new batch descriptor) or replay (known one)."""

    def before(self, view: Any, info: Any) -> Any:
        wrapper = view.instance
        context = _forward_context()
        if context is None:
            return None
        mode = context.cudagraph_runtime_mode
        if mode is None or _mode_name(mode) == "NONE" or mode != wrapper.runtime_mode:
            return None     # passes through to the runnable: nothing captured or replayed
        key = context.batch_descriptor
        entry = wrapper.concrete_cudagraph_entries.get(key)
        if entry is not None and entry.cudagraph is not None:
            return ("replay", key, None)
        gid = graphs.next_gid()
        record.emit("graph.capture.begin", gid=gid, parent=graphs.current_gid(), src=self.src,
                    key=plain(key), mode=_mode_name(mode))
        graphs.push_capture(gid)
        return ("capture", key, (gid, time.perf_counter_ns()))

    def after(self, view: Any, info: Any, token: Any, result: Any, error: Any) -> None:
        if token is None:
            return
        action, key, capture = token
        gids = view.instance.__dict__.setdefault("_mlatrace_gids", {})
        if action == "capture":
            gid, t0 = capture
            graphs.remove_capture(gid)
            fields: dict[str, Any] = {"gid": gid, "segments": 1, "eager_breaks": 0,
                                      "dur_ns": time.perf_counter_ns() - t0}
            if error is not None:
                fields["error"] = f"{type(error).__name__}: {error}"[:200]
            else:
                gids[key] = gid
            record.emit("graph.capture.end", **fields)
        elif error is None:
            gid = gids.get(key)
            if gid is None:
                gid = gids[key] = graphs.next_gid()
            record.emit_replay(gid)


class VllmBreakableCapture(Handler):
    """BreakableCUDAGraphWrapper._capture(entry, ...): one parent graph, many segments."""

    def before(self, view: Any, info: Any) -> Any:
        entry = view.arg("entry")
        context = _forward_context()
        mode = _mode_name(context.cudagraph_runtime_mode) if context is not None else None
        gid = graphs.next_gid()
        record.emit("graph.capture.begin", gid=gid, parent=graphs.current_gid(), src=self.src,
                    key=plain(getattr(entry, "batch_descriptor", None)), mode=mode)
        graphs.push_capture(gid)
        return gid, time.perf_counter_ns()

    def after(self, view: Any, info: Any, token: Any, result: Any, error: Any) -> None:
        gid, t0 = token
        graphs.remove_capture(gid)
        entry = view.arg("entry")
        capture = getattr(entry, "capture", None)
        segments = getattr(capture, "segments", None)
        fields: dict[str, Any] = {
            "gid": gid,
            "segments": len(segments) if segments is not None else None,
            "eager_breaks": getattr(capture, "_num_eager_breaks", None),
            "dur_ns": time.perf_counter_ns() - t0,
        }
        if error is not None:
            fields["error"] = f"{type(error).__name__}: {error}"[:200]
        elif entry is not None:
            try:
                setattr(entry, GID_ATTR, gid)
            except Exception:
                pass
        record.emit("graph.capture.end", **fields)


class VllmBreakableReplay(Handler):
    """BreakableCUDAGraphWrapper._replay(entry, ...): count the parent graph's replay."""

    def after(self, view: Any, info: Any, token: Any, result: Any, error: Any) -> None:
        if error is not None:
            return
        entry = view.arg("entry")
        gid = getattr(entry, GID_ATTR, None)
        if gid is None:
            gid = graphs.next_gid()
            setattr(entry, GID_ATTR, gid)
        record.emit_replay(gid)


class EagerBreak(Handler):
    """add_eager(fn): the call runs eagerly between segments, so it is not capturing."""

    def before(self, view: Any, info: Any) -> Any:
        gid = graphs.current_gid()
        # Inside add_eager the torch segment is already ended; the enclosing
        # capture's gid is the innermost non-torch one still open.
        fn = view.arg("fn")
        record.emit("graph.eager_break", gid=gid,
                    fn=getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None))
        graphs.push_eager()
        return True

    def after(self, view: Any, info: Any, token: Any, result: Any, error: Any) -> None:
        graphs.pop_eager()


class EagerSegment(Handler):
    """A function that runs as an eager segment of a breakable capture (reference engine)."""

    def before(self, view: Any, info: Any) -> Any:
        graphs.push_eager()
        return True

    def after(self, view: Any, info: Any, token: Any, result: Any, error: Any) -> None:
        graphs.pop_eager()


# --- generic: a call that is a capture of its own (reference/sglang capture paths) -----


class CaptureScope(Handler):
    """A function whose whole call is one capture (e.g. SGLang's CudaGraphRunner.capture)."""

    def before(self, view: Any, info: Any) -> Any:
        gid = graphs.next_gid()
        fields = self.fields(view)
        record.emit("graph.capture.begin", gid=gid, parent=graphs.current_gid(), src=self.src,
                    key=fields.get("key"), mode=fields.get("mode"))
        graphs.push_capture(gid)
        return gid, time.perf_counter_ns()

    def after(self, view: Any, info: Any, token: Any, result: Any, error: Any) -> None:
        gid, t0 = token
        graphs.remove_capture(gid)
        fields: dict[str, Any] = {"gid": gid, "segments": None, "eager_breaks": None,
                                  "dur_ns": time.perf_counter_ns() - t0}
        if error is not None:
            fields["error"] = f"{type(error).__name__}: {error}"[:200]
        else:
            try:
                setattr(view.instance, GID_ATTR, gid)
            except Exception:
                pass
        record.emit("graph.capture.end", **fields)


class ReplayScope(Handler):
    """A function whose call is one replay of the instance's capture (SGLang replay)."""

    def after(self, view: Any, info: Any, token: Any, result: Any, error: Any) -> None:
        if error is not None:
            return
        gid = getattr(view.instance, GID_ATTR, None)
        if gid is None:
            gid = graphs.next_gid()
            setattr(view.instance, GID_ATTR, gid)
        record.emit_replay(gid)


class Dispatch(Handler):
    """The runner's dispatch decision (mode, key) taken from the return value."""

    def after(self, view: Any, info: Any, token: Any, result: Any, error: Any) -> None:
        if error is not None:
            return
        fields = self.fields(view)
        mode, key = (result[0], result[1]) if isinstance(result, tuple) and len(result) >= 2 \
            else (fields.get("mode"), fields.get("key"))
        record.emit("dispatch", mode=_mode_name(mode) if not isinstance(mode, str) else mode,
                    key=plain(key), num_tokens=fields.get("num_tokens"))


class RankFromArgs(Handler):
    """Tell the recorder the rank when a probed call names it (fields rank/world_size)."""

    def before(self, view: Any, info: Any) -> Any:
        fields = self.fields(view)
        rank = fields.get("rank")
        if isinstance(rank, int):
            world = fields.get("world_size")
            record.set_rank(rank, world if isinstance(world, int) else None)
        return None
