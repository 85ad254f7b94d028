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
import sys
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
            # The graph was built with keep_graph forced on (TorchGraphKeep): ask for
            # the debug dump before the capture starts, as torch requires.
            enable = getattr(graph, "enable_debug_mode", None)
            if enable is not None:
                enable()
        return None

    def after(self, view: Any, info: Any, token: Any, result: Any, error: Any) -> None:
        if error is not None:
            return
        graph = view.instance
        gid, t0 = open_capture(self.src, key=None, mode=None)
        setattr(graph, GID_ATTR, gid)
        setattr(graph, T0_ATTR, t0)


class GraphCaptureEnd(Handler):
    """capture_end: leave the capture, record its duration and its kernel nodes."""

    def after(self, view: Any, info: Any, token: Any, result: Any, error: Any) -> None:
        graph = view.instance
        gid = getattr(graph, GID_ATTR, None)
        if gid is None:
            return
        close_capture(gid, getattr(graph, T0_ATTR, None), error)
        if error is None and self.options.get("graph_nodes"):
            user_keep = getattr(graph, USER_KEEP_ATTR, None)
            if user_keep is not None:
                dump_graph_nodes(graph, gid, user_keep)


def open_capture(src: str, key: Any, mode: Any) -> tuple[int, int]:
    """Give a new capture its gid (parent: the capture open now), record its begin and
    enter it; returns (gid, start ns) for close_capture."""
    gid = graphs.next_gid()
    record.emit("graph.capture.begin", gid=gid, parent=graphs.parent_gid(), src=src, key=key,
                mode=mode)
    graphs.push_capture(gid, src)
    return gid, time.perf_counter_ns()


def close_capture(gid: int, t0: int | None, error: BaseException | None,
                  segments: int | None = 1, eager_breaks: int | None = 0) -> None:
    """Leave capture `gid` and record its end: duration, segments, the error if it failed."""
    graphs.remove_capture(gid)
    fields: dict[str, Any] = {"gid": gid, "segments": segments, "eager_breaks": eager_breaks,
                              "dur_ns": time.perf_counter_ns() - t0 if t0 is not None else None}
    if error is not None:
        fields["error"] = f"{type(error).__name__}: {error}"[:200]
    record.emit("graph.capture.end", **fields)


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


class TorchGraphKeep(Handler):
    """Build every torch.cuda.CUDAGraph with keep_graph=True, for the node dump.

    torch writes a graph's DOT only while its template (cudaGraph_t) exists, which
    after capture_end means keep_graph=True. The Python class defines ``__new__``
    (the probe's target: its parameters are checked for drift) but the C++
    constructor, pybind's ``_CUDAGraph.__init__(keep_graph)``, receives the
    constructor's own arguments, so this handler defines ``CUDAGraph.__init__``
    passing keep_graph=True and remembers the user's choice on the instance;
    GraphCaptureEnd honours it (see dump_graph_nodes). close() removes the
    ``__init__`` again.
    """

    def __init__(self, spec: Any) -> None:
        super().__init__(spec)
        self.cls: Any = None
        self.init: Any = None

    def replacement(self, info: Any, runtime: Any) -> Any:
        from mlatrace.probe.engine import STATE

        cls = info.owner
        if not (_graph_nodes_enabled() and self.options.get("graph_nodes", True)):
            return info.raw
        if "__init__" in cls.__dict__:
            raise RuntimeError(f"{cls.__qualname__} defines __init__ itself; node dump off")
        base_init = cls.__mro__[1].__init__

        def __init__(graph: Any, keep_graph: bool = False, *args: Any, **kwargs: Any) -> None:
            if runtime.disabled or not STATE.active:
                base_init(graph, keep_graph, *args, **kwargs)
                return
            base_init(graph, True, *args, **kwargs)
            setattr(graph, USER_KEEP_ATTR, bool(keep_graph))

        cls.__init__ = __init__
        self.cls, self.init = cls, __init__
        return info.raw

    def close(self) -> None:
        if self.cls is not None and self.cls.__dict__.get("__init__") is self.init:
            del self.cls.__init__
        self.cls = self.init = None


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
        return ("capture", key, open_capture(self.src, plain(key), _mode_name(mode)))

    def after(self, view: Any, info: Any, token: Any, result: Any, error: Any) -> None:
        if token is None:
            return
        action, key, capture = token
        gids = view.instance.__dict__.setdefault("_mlatrace_gids", {})
        if action == "capture":
            gid, t0 = capture
            if error is None:
                gids[key] = gid
            close_capture(gid, t0, error)
        elif error is None:
            gid = gids.get(key)
            if gid is None:
                gid = gids[key] = graphs.next_gid()
            record.emit_replay(gid)


class EntryCapture(Handler):
    """A wrapper's ``_capture(entry, ...)``: one graph per batch descriptor, maybe in segments.

    Used for vLLM's BreakableCUDAGraphWrapper._capture and the reference engine's
    CUDAGraphWrapper._capture. ``key``/``mode`` come from the probe's fields; with
    ``options.mode_from = "vllm"`` the mode is read from vLLM's forward context.
    """

    def before(self, view: Any, info: Any) -> Any:
        fields = self.fields(view)
        mode = fields.get("mode")
        if self.options.get("mode_from") == "vllm":
            context = _forward_context()
            mode = _mode_name(context.cudagraph_runtime_mode) if context is not None else mode
        entry = view.arg("entry")
        key = fields.get("key", plain(getattr(entry, "batch_descriptor", None)))
        return open_capture(self.src, key, mode)

    def after(self, view: Any, info: Any, token: Any, result: Any, error: Any) -> None:
        gid, t0 = token
        entry = view.arg("entry")
        capture = getattr(entry, "capture", None)
        if capture is not None:
            segments = getattr(capture, "segments", None)
            num_segments = len(segments) if segments is not None else None
            eager_breaks = getattr(capture, "num_eager_breaks", None)
        else:
            num_segments, eager_breaks = 1, 0
        if error is None and entry is not None:
            try:
                setattr(entry, GID_ATTR, gid)
            except Exception:
                pass
        close_capture(gid, t0, error, num_segments, eager_breaks)


class EntryReplay(Handler):
    """A wrapper's ``_replay(entry, ...)``: count the replay of the entry's graph."""

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

    def __init__(self, spec: Any) -> None:
        super().__init__(spec)
        self.segment_srcs = tuple(self.options.get("segment_src", ["torch"]))

    def before(self, view: Any, info: Any) -> Any:
        # The open torch segment ends inside add_eager; the break belongs to the
        # breakable capture around it.
        gid = graphs.enclosing_gid(self.segment_srcs)
        record.emit("graph.eager_break", gid=gid, fn=_callable_name(view.arg("fn")))
        graphs.push_eager()
        return True

    def after(self, view: Any, info: Any, token: Any, result: Any, error: Any) -> None:
        graphs.pop_eager()


def _callable_name(fn: Any) -> str | None:
    """A readable name for an eager segment: partials and lambdas name what they call."""
    inner = getattr(fn, "func", None)      # functools.partial
    if inner is not None:
        fn = inner
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    if name and "<lambda>" in name:
        # vLLM's eager break is `lambda: fn(*weak_args, **weak_kwargs)`: name the fn.
        for cell in getattr(fn, "__closure__", None) or ():
            try:
                value = cell.cell_contents
            except ValueError:
                continue
            if callable(value) and getattr(value, "__qualname__", None):
                return value.__qualname__
    return name


class EagerSegment(Handler):
    """A function that runs as an eager segment of a breakable capture (reference engine)."""

    def before(self, view: Any, info: Any) -> Any:
        graphs.push_eager()
        return True

    def after(self, view: Any, info: Any, token: Any, result: Any, error: Any) -> None:
        graphs.pop_eager()


# --- generic: a call that is a capture of its own (reference/sglang capture paths) -----


class CaptureScope(Handler):
    """A function whose call makes one keyed capture (SGLang's capture_one_batch_size).

    Such functions warm up eagerly before they capture, so the scope's gid is
    opened as an eager region: ``capturing()`` stays false until the torch capture
    inside begins, which then names this gid as its parent. The gid is remembered
    per key (``fields.key``) on the instance for ReplayScope.
    """

    def before(self, view: Any, info: Any) -> Any:
        fields = self.fields(view)
        key = fields.get("key")
        gid, t0 = open_capture(self.src, key, fields.get("mode"))
        graphs.push_eager()
        return gid, key, t0

    def after(self, view: Any, info: Any, token: Any, result: Any, error: Any) -> None:
        gid, key, t0 = token
        graphs.pop_eager()
        if error is None:
            _gids_of(view.instance)[_hashable(key)] = gid
        close_capture(gid, t0, error)


class ReplayScope(Handler):
    """A function whose call replays the instance's capture for a key (SGLang's replay).

    ``options.key_after`` names the instance attribute holding the replayed key once
    the call returned (SGLang sets ``self.bs`` in replay_prepare).
    """

    def after(self, view: Any, info: Any, token: Any, result: Any, error: Any) -> None:
        if error is not None:
            return
        attr = self.options.get("key_after")
        key = getattr(view.instance, attr, None) if attr else self.fields(view).get("key")
        gids = _gids_of(view.instance)
        gid = gids.get(_hashable(key))
        if gid is None:
            gid = gids[_hashable(key)] = graphs.next_gid()
        record.emit_replay(gid)


def _gids_of(instance: Any) -> dict:
    gids = getattr(instance, "_mlatrace_gids", None)
    if gids is None:
        gids = {}
        try:
            instance._mlatrace_gids = gids
        except Exception:
            pass
    return gids


def _hashable(key: Any) -> Any:
    if isinstance(key, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in key.items()))
    if isinstance(key, list):
        return tuple(_hashable(v) for v in key)
    return key


class AttnForward(Handler):
    """A backend's attention forward: one attn.call, and its layer for the calls inside.

    The kernels a forward launches are recorded by their own probes; they read the
    layer through ``layer()`` so MLT005 can group them by layer and gid.
    """

    def before(self, view: Any, info: Any) -> Any:
        fields = self.fields(view)
        record.emit_fields(self.spec.kind or "attn.call", fields)
        graphs.enter_layer(fields.get("layer"))
        return True

    def after(self, view: Any, info: Any, token: Any, result: Any, error: Any) -> None:
        graphs.exit_layer()


class Dispatch(Handler):
    """The runner's dispatch decision: (mode, batch descriptor) or a descriptor with cg_mode."""

    def after(self, view: Any, info: Any, token: Any, result: Any, error: Any) -> None:
        if error is not None:
            return
        fields = self.fields(view)
        if isinstance(result, tuple) and len(result) >= 2 and not hasattr(result, "_asdict"):
            mode, key = result[0], result[1]
        elif hasattr(result, "cg_mode"):
            mode, key = result.cg_mode, result
        else:
            mode, key = fields.get("mode"), fields.get("key")
        record.emit("dispatch", mode=mode if isinstance(mode, str) or mode is None
                    else _mode_name(mode), key=plain(key), num_tokens=fields.get("num_tokens"))


class DummyRun(Handler):
    """A runner's _dummy_run: record it, and mark metadata built inside it as dummy."""

    def before(self, view: Any, info: Any) -> Any:
        record.emit_fields(self.spec.kind or "runner.dummy_run", self.fields(view))
        graphs.enter_dummy_run()
        return True

    def after(self, view: Any, info: Any, token: Any, result: Any, error: Any) -> None:
        graphs.exit_dummy_run()


class RankFromArgs(Handler):
    """Tell the recorder the rank when a probed call names it (fields rank/world_size)."""

    def before(self, view: Any, info: Any) -> Any:
        fields = self.fields(view)
        rank = fields.get("rank")
        if isinstance(rank, int) and rank >= 0:
            world = fields.get("world_size")
            record.set_rank(rank, world if isinstance(world, int) else None)
        return None


# --- host reads of device memory (MLT004) -----------------------------------------------


def _caller_site(skip: str = os.sep.join(("", "mlatrace", "probe", ""))) -> str | None:
    """'file:line' of the first frame outside the probe engine: where the program synced."""
    frame = sys._getframe(2)
    for _ in range(8):
        if frame is None:
            return None
        code = frame.f_code
        if skip not in code.co_filename:
            return f"{code.co_filename}:{frame.f_lineno}"
        frame = frame.f_back
    return None


def _stream_capturing() -> bool:
    """Is the current CUDA stream capturing? A host query (no device read), asked only
    inside a probe-seen capture, when CUDA is in use already; without CUDA the probes'
    capture stack (the reference host graph) is trusted."""
    try:
        import torch

        return bool(torch.cuda.is_current_stream_capturing())
    except Exception:
        return True


class DeviceSync(Handler):
    """A host read that waits for the GPU: Tensor.item/.tolist/.numpy on a CUDA tensor,
    torch.cuda.synchronize. Recorded as `sync` (op, capturing, gid, where) for MLT004.

    The replacement is a plain function with one cheap test in front of the original: a
    CPU tensor's .item() (vLLM calls many) costs a `.is_cuda` read; while torch.compile
    traces, nothing is recorded, so the traced graph sees only the original call.
    """

    def replacement(self, info: Any, runtime: Any) -> Any:
        from mlatrace.probe.engine import STATE

        original = info.raw
        op = info.attr
        target = info.target
        emit = record.emit
        capturing, current_gid = graphs.capturing, graphs.current_gid
        try:
            from torch.compiler import is_compiling
        except ImportError:  # pragma: no cover - torch < 2.3
            def is_compiling() -> bool:
                return False

        def note() -> None:
            try:
                # Inside a wrapper's capture but before torch starts the stream capture
                # (torch.cuda.graph synchronizes on entry) is not a sync in the graph.
                now = capturing() and _stream_capturing()
                emit("sync", op=op, capturing=now, gid=current_gid() if now else None,
                     where=_caller_site())
            except Exception as exc:
                runtime.fail(target, exc)

        if isinstance(info.owner, type):
            def tensor_method(self: Any, *args: Any, **kwargs: Any) -> Any:
                if STATE.active and not runtime.disabled and not is_compiling() \
                        and self.is_cuda:
                    note()
                return original(self, *args, **kwargs)

            replacement = tensor_method
        else:
            def function(*args: Any, **kwargs: Any) -> Any:
                if STATE.active and not runtime.disabled and not is_compiling():
                    note()
                return original(*args, **kwargs)

            replacement = function
        replacement.__name__ = getattr(original, "__name__", op)
        replacement.__qualname__ = getattr(original, "__qualname__", op)
        replacement.__doc__ = getattr(original, "__doc__", None)
        replacement.__wrapped__ = original  # type: ignore[attr-defined]
        return replacement
