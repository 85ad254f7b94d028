"""Handlers for torch.cuda.CUDAGraph and look-alikes (the reference HostGraph)."""

from __future__ import annotations

from typing import Any

from mlatrace import record
from mlatrace.probe import graph_data, graphs, replay_timing, sampling
from mlatrace.probe.device import reserved_bytes, reserved_growth
from mlatrace.probe.handlers import (
    GID_ATTR,
    T0_ATTR,
    USER_KEEP_ATTR,
    Handler,
    _graph_nodes_enabled,
    close_capture,
    open_capture,
)

# ((device, reserved bytes) when the capture began, or None; whether its pool is shared)
RESERVED_ATTR = "_mlatrace_reserved0"


class GraphCaptureBegin(Handler):
    """capture_begin: give the graph a gid, note its parent, enter the capture.

    ``options.pool_bytes``: read the caching allocator's reserved bytes before the capture
    starts (torch graphs; see GraphCaptureEnd)."""

    OPTIONS = {"graph_nodes": bool,   # keep the graph for the node dump (torch graphs)
               "pool_bytes": bool}    # reserved memory before the capture (torch graphs)

    def before(self, view: Any, info: Any) -> Any:
        graph = view.instance
        if self.options.get("graph_nodes") and getattr(graph, USER_KEEP_ATTR, None) is not None:
            # The graph was built with keep_graph forced on (TorchGraphKeep): ask for
            # the debug dump before the capture starts, as torch requires.
            enable = getattr(graph, "enable_debug_mode", None)
            if enable is not None:
                enable()
        if not self.options.get("pool_bytes"):
            return None
        # read before the stream captures (None where CUDA is not initialised); a `pool`
        # argument: the graph allocates from a pool other captures share
        return reserved_bytes(), view.arg("pool") is not None

    def after(self, view: Any, info: Any, token: Any, result: Any, error: Any) -> None:
        if error is not None:
            return
        graph = view.instance
        gid, t0 = open_capture(self.src, key=None, mode=None)
        setattr(graph, GID_ATTR, gid)
        setattr(graph, T0_ATTR, t0)
        if self.options.get("pool_bytes"):
            setattr(graph, RESERVED_ATTR, token)
        if self.options.get("graph_nodes") and getattr(graph, USER_KEEP_ATTR, None) is None \
                and _graph_nodes_enabled():
            graph_data.hook_instantiate(graph, gid)   # torch with lifecycle hooks (#187749)


class GraphCaptureEnd(Handler):
    """capture_end: leave the capture, record its duration and its kernel nodes.

    ``options.pool_bytes``: also record `pool_bytes`, how much the caching allocator's
    reserved memory grew during the capture (torch.cuda.memory_reserved before
    capture_begin and after capture_end, host reads of its counters; nothing where CUDA
    is not initialised): what the capture added to its graph's private pool, at most,
    as other threads' allocations meanwhile count too; 0 where it reused memory already
    reserved (a pool shared with earlier captures, as vLLM shares one: `pool_shared`,
    capture_begin got a `pool`)."""

    OPTIONS = {"graph_nodes": bool,   # dump the captured graph's kernel nodes
               "pool_bytes": bool}    # the reserved memory the capture added

    def after(self, view: Any, info: Any, token: Any, result: Any, error: Any) -> None:
        graph = view.instance
        gid = getattr(graph, GID_ATTR, None)
        if gid is None:
            return
        pool = shared = None
        began = getattr(graph, RESERVED_ATTR, None) if self.options.get("pool_bytes") else None
        if error is None and began is not None:
            pool = reserved_growth(began[0])
            shared = began[1] if pool is not None else None
        close_capture(gid, getattr(graph, T0_ATTR, None), error, pool_bytes=pool,
                      pool_shared=shared)
        if error is None and self.options.get("graph_nodes"):
            user_keep = getattr(graph, USER_KEEP_ATTR, None)
            if user_keep is not None:
                dump_graph_nodes(graph, gid, user_keep)



def dump_graph_nodes(graph: Any, gid: int, user_keep: bool) -> None:
    """Emit graph.nodes after capture_end (torch without lifecycle hooks), then restore the
    user's keep_graph.

    The graph was built with keep_graph=True so that its template survives capture. A user
    who asked for keep_graph=False gets the instantiation capture_end would have done, here,
    so replay behaves as before (and get_graph_data, which needs it, can be read); a user's
    keep_graph=True graph is left to instantiate when they choose (DOT is read then). The
    template stays alive (host memory, freed with the graph). See mlatrace.probe.graph_data.
    """
    if not user_keep:
        graph.instantiate()
    graph_data.emit_nodes(graph, gid, instantiated=not user_keep)


class GraphReplay(Handler):
    """replay: count it against the graph's gid; time a sample of replays (no sync).

    ``options.timing`` names the clock: "cuda" (default: CUDA events on the replay's
    stream, resolved later; see mlatrace.probe.replay_timing), "host" (the reference
    HostGraph, whose replay runs its work on the host) or "off". A timer that fails is
    reported once (probe.error, "<probe> (replay timing)") and timing stops; counting goes on.
    """

    OPTIONS = {"timing": str}   # "cuda" (events, default) or "host"

    def __init__(self, spec: Any) -> None:
        super().__init__(spec)
        self.clock = str(self.options.get("timing", "cuda"))
        self.timer: Any = None
        self.timer_known = False
        # A step that replays many graphs (piecewise, breakable) steps aside like
        # probed calls do (sampling.StepAside): its later replays are only counted.
        self.aside = sampling.step_aside_for(spec.qualname, "graph.replay")

    def before(self, view: Any, info: Any) -> Any:
        return self._start(view.instance)

    def after(self, view: Any, info: Any, token: Any, result: Any, error: Any) -> None:
        self._done(view.instance, token, error)

    def wrapper(self, runtime: Any, info: Any, original: Any, state: Any) -> Any:
        """The replacement of a replay method called as (graph, ...), in one frame for
        the common cases: a replay while the probe steps aside is counted inline (the
        recorder's replays per gid and its unrecorded count, as Recorder.count_replay)
        and runs; so does the first replay of an eager step when it is not timed, with
        its record (what `around` does for it: `_start` with no timing due, `_done`,
        `seen`'s common case inline). Any other replay goes through `around`."""
        aside, step, around = self.aside, graphs.STEP, self.around
        process = record.STATE
        threads = graphs._local          # graphs.capturing(), read inline
        stepping = isinstance(aside, sampling.StepAside)
        target = info.target

        def replay(*args: Any, **kwargs: Any) -> Any:
            if runtime.disabled or not state.active:
                return original(*args, **kwargs)
            runtime.hits += 1
            gid = getattr(args[0], GID_ATTR, None) if args else None
            recorder = process.recorder
            if gid is None or recorder is None:
                return around(runtime, info, original, args, kwargs)
            now = step.value
            if aside.asleep == now:
                replays = recorder.replays
                replays[gid] = replays.get(gid, 0) + 1
                recorder.unrecorded_replays += 1
                return original(*args, **kwargs)
            stack = threads.stack
            timer = self.timer
            if (stack and stack[-1] is not None) or (stepping and aside.step == now) \
                    or (timer is None and not self.timer_known):
                return around(runtime, info, original, args, kwargs)
            if timer is not None:
                n = recorder.replays.get(gid, 0) + 1
                if timer.pending or not (n > timer.first and n % timer.every):
                    return around(runtime, info, original, args, kwargs)   # timed
            # The step's first look at this probe, eager, untimed: as _done records it.
            result = original(*args, **kwargs)
            if runtime.disabled:
                return result
            try:
                recorder.add_replay(gid, {})      # record.emit_replay(gid), fewer calls
                if stepping and aside.trail is None and aside.steady >= aside.settle \
                        and aside.countdown > 1:
                    # StepAside.seen's common case, inline: a step after one it slept
                    # through; it sleeps through this one too.
                    aside.step = now
                    aside.first = gid
                    aside.countdown -= 1
                    aside.asleep = now
                    if aside.take_off is not None:
                        aside.take_off_now()
                elif stepping:
                    aside.seen(gid)
            except Exception as exc:
                runtime.fail(target, exc)
            return result

        return replay

    def around(self, runtime: Any, info: Any, call: Any, args: tuple, kwargs: dict) -> Any:
        """before, the call, after, for a replay method called as (graph, ...): what the
        engine's handler wrapper does, without a CallView per replay (the engine uses
        it for method targets)."""
        graph = args[0] if args else None
        if self.aside.asleep == graphs.STEP.value:
            gid = getattr(graph, GID_ATTR, None)
            recorder = record.STATE.recorder
            if gid is not None and recorder is not None:
                recorder.count_replay(gid)      # exact counts, no record
                return call(*args, **kwargs)
        try:
            token = self._start(graph)
        except Exception as exc:
            runtime.fail(info.target, exc)
            return call(*args, **kwargs)
        try:
            result = call(*args, **kwargs)
        except BaseException as error:
            if not runtime.disabled:
                try:
                    self._done(graph, token, error)
                except Exception as exc:
                    runtime.fail(info.target, exc)
            raise
        if not runtime.disabled:
            try:
                self._done(graph, token, None)
            except Exception as exc:
                runtime.fail(info.target, exc)
        return result

    def _start(self, graph: Any) -> Any:
        timer = self.timer
        if timer is None:
            if self.timer_known:
                return None
            self.timer_known = True
            timer = self.timer = self._guard(replay_timing.timer_for, self.clock)
            if timer is None:
                return None
        recorder = record.STATE.recorder
        gid = getattr(graph, GID_ATTR, None)
        if gid is None or recorder is None:
            return None
        try:
            if timer.pending and not graphs.capturing():
                timer.poll()
            n = recorder.replays.get(gid, 0) + 1
            if n > timer.first and n % timer.every:
                return None
            token = timer.start()
        except Exception as exc:
            self._stop_timing(exc)
            return None
        return None if token is None else (n, token)

    def _done(self, graph: Any, token: Any, error: Any) -> None:
        timer = self.timer
        if error is not None:
            if token is not None and timer is not None:
                timer.abandon(token[1])
            return
        gid = getattr(graph, GID_ATTR, None)
        if gid is None:
            gid = graphs.next_gid()     # captured before mlatrace was installed
            setattr(graph, GID_ATTR, gid)
        if token is not None and timer is not None:
            try:   # the end event first: nothing but the replay between the two events
                timer.stop(token[1], gid, token[0])
            except Exception as exc:
                self._stop_timing(exc)
        recorder = record.STATE.recorder
        stack = graphs._local.stack          # graphs.capturing(), inline
        eager = not stack or stack[-1] is None
        if recorder is not None:
            if eager and self._as_expected(gid):
                recorder.count_replay(gid)
            else:
                recorder.add_replay(gid, {})      # record.emit_replay(gid), one call fewer
        if eager:
            self.aside.seen(gid)

    def _as_expected(self, gid: int) -> bool:
        """A later replay of a steady probe's verify step (the whole step looked at again,
        sampling.StepAside) that repeats the last looked-at step at its place: counted
        as the replays of the steps it slept through are, with no record, so that the
        verify step writes what those steps write (a fold goes on across it)."""
        aside = self.aside
        trail = getattr(aside, "trail", None)
        if trail is None or aside.step != graphs.STEP.value or aside.steady < aside.settle:
            return False
        last = aside.last_trail
        if last is None or len(trail) >= len(last):
            return False
        return last[len(trail)] == (sampling.SAME if gid == aside.first else gid)

    def _guard(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as exc:
            self._stop_timing(exc)
            return None

    def _stop_timing(self, exc: BaseException) -> None:
        self.timer, self.timer_known = None, True
        record.note_probe_error()
        record.emit("probe.error", probe=f"{self.spec.qualname} (replay timing)",
                    target=f"{self.clock} timer",
                    error=f"{type(exc).__name__}: {exc}"[:200])


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

    OPTIONS = {"graph_nodes": bool}

    def __init__(self, spec: Any) -> None:
        super().__init__(spec)
        self.cls: Any = None
        self.init: Any = None

    def replacement(self, info: Any, runtime: Any) -> Any:
        from mlatrace.probe.engine import STATE

        cls = info.owner
        if not (_graph_nodes_enabled() and self.options.get("graph_nodes", True)):
            return info.raw
        if graph_data.has_instantiate_hook(cls):
            return info.raw   # nodes read from torch's post-instantiate hook: no keep_graph

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
