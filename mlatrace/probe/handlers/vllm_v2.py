"""Handlers for vLLM's model runner V2 (vllm/v1/worker/gpu/cudagraph_utils.py).

Runner V2 captures its FULL graphs itself: `CudaGraphManager.capture(create_forward_fn)`
loops over the BatchExecutionDescriptors, calls `create_forward_fn(desc, warmup=True)`, runs
the warm-up, calls `create_forward_fn(desc, warmup=False)` (the capture's dummy metadata is
built there) and captures `forward_fn` inside `torch.cuda.graph`; `run_fullgraph(desc)`
replays `self.graphs[desc]`. Its PIECEWISE graphs go through CUDAGraphWrapper or
BreakableCUDAGraphWrapper, which the vllm_cudagraph pack records already.

These handlers give a FULL graph the wrapper path's records: a capture (src vllm, key = the
descriptor, mode FULL) that encloses the torch capture, and a replay per run_fullgraph next
to the torch replay it causes.
"""

from __future__ import annotations

from typing import Any

from mlatrace import record
from mlatrace.common import hashable
from mlatrace.probe import graphs
from mlatrace.probe.handlers import Handler, _gids_of, close_capture, open_capture
from mlatrace.probe.paths import plain


def _mode(desc: Any) -> str | None:
    mode = getattr(desc, "cg_mode", None)
    return None if mode is None else getattr(mode, "name", str(mode))


def _key(desc: Any) -> Any:
    try:
        hash(desc)
        return desc
    except TypeError:
        return hashable(plain(desc))


class _Scope:
    """The FULL capture open now in one CudaGraphManager.capture call (one per call)."""

    __slots__ = ("gid", "t0", "desc")

    def __init__(self) -> None:
        self.gid: int | None = None
        self.t0: int | None = None
        self.desc: Any = None


class ManagerCapture(Handler):
    """CudaGraphManager.capture(create_forward_fn): one keyed capture per FULL descriptor.

    The factory it is handed is wrapped for the call: its call for a FULL descriptor with
    warmup=False opens the capture (after the factory returned, so the dummy metadata it
    builds comes before the capture, as _dummy_run's does on the wrapper path); its next
    call, or the end of capture(), closes it (the torch capture inside has ended by then).
    The scope is eager until the torch capture begins (as SGLang's capture_one_shape).
    Everything inside capture() runs dummy batches: metadata built there reads dummy.
    """

    def around(self, runtime: Any, info: Any, call: Any, args: tuple, kwargs: dict) -> Any:
        factory = kwargs.get("create_forward_fn", args[1] if len(args) > 1 else None)
        if factory is None or getattr(factory, "_mlatrace_v2", False):
            return call(*args, **kwargs)
        instance = args[0]
        scope = _Scope()

        def close(error: BaseException | None) -> None:
            if scope.gid is None:
                return
            gid, t0, desc = scope.gid, scope.t0, scope.desc
            scope.gid = scope.t0 = scope.desc = None
            graphs.pop_eager()
            if error is None:
                _gids_of(instance)[_key(desc)] = gid
            close_capture(gid, t0, error)

        def create_forward_fn(desc: Any, warmup: bool, *rest: Any, **kw: Any) -> Any:
            close(None)
            forward_fn = factory(desc, warmup, *rest, **kw)
            if not warmup and _mode(desc) == "FULL" and not runtime.disabled:
                scope.gid, scope.t0 = open_capture(self.src, plain(desc), "FULL")
                scope.desc = desc
                graphs.push_eager()   # not capturing until torch.cuda.graph begins
            return forward_fn

        create_forward_fn._mlatrace_v2 = True  # type: ignore[attr-defined]
        if "create_forward_fn" in kwargs:
            kwargs = {**kwargs, "create_forward_fn": create_forward_fn}
        else:
            args = (args[0], create_forward_fn, *args[2:])
        graphs.enter_dummy_run()
        try:
            result = call(*args, **kwargs)
        except BaseException as error:
            close(error)
            raise
        finally:
            graphs.exit_dummy_run()
        close(None)
        return result


class ManagerReplay(Handler):
    """CudaGraphManager.run_fullgraph(desc): the replay of that descriptor's FULL graph.

    Recorded once the torch replay inside returned (so the two share `n`); a subclass's
    run_fullgraph that calls super() reaches this one, and only the outermost call counts.
    """

    def __init__(self, spec: Any) -> None:
        super().__init__(spec)
        import threading

        self.local = threading.local()

    def before(self, view: Any, info: Any) -> Any:
        depth = getattr(self.local, "depth", 0)
        self.local.depth = depth + 1
        return depth

    def after(self, view: Any, info: Any, token: Any, result: Any, error: Any) -> None:
        self.local.depth = token
        if token or error is not None:
            return
        desc = view.arg("desc")
        gids = _gids_of(view.instance)
        key = _key(desc)
        gid = gids.get(key)
        if gid is None:
            gid = gids[key] = graphs.next_gid()
        record.emit_replay(gid)
