"""Handlers for vLLM: CUDAGraphWrapper, BreakableCUDAGraphWrapper and its eager breaks,
attention forwards, the runner's dispatch and _dummy_run, the worker's rank. The
reference engine mirrors these entry points, so its pack names the same handlers."""

from __future__ import annotations

import threading
import time
from typing import Any

from mlatrace import record
from mlatrace.probe import graphs
from mlatrace.probe.handlers import GID_ATTR, Handler, close_capture, open_capture
from mlatrace.probe.paths import plain

_SCALARS = frozenset((type(None), bool, int, float, str))


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

    OPTIONS = {"mode_from": str}

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
    """A wrapper's ``_replay(entry, ...)``: count the replay of the entry's graph.

    On a method target the probe is `wrapper`'s one frame, with no CallView; `after`
    is the path of the engine's other wrappers."""

    def after(self, view: Any, info: Any, token: Any, result: Any, error: Any) -> None:
        if error is None:
            _replayed(view.arg("entry"))

    def wrapper(self, runtime: Any, info: Any, original: Any, state: Any) -> Any:
        """The replacement of a ``_replay`` method called as (wrapper, entry, ...)."""
        index = info.positions.get("entry")
        at = None if index is None else index + 1       # args holds self first
        default = info.defaults.get("entry")
        process = record.STATE
        target = info.target

        def replay(*args: Any, **kwargs: Any) -> Any:
            if runtime.disabled or not state.active:
                return original(*args, **kwargs)
            runtime.hits += 1
            result = original(*args, **kwargs)
            if runtime.disabled:
                return result
            try:
                if kwargs and "entry" in kwargs:
                    entry = kwargs["entry"]
                else:
                    entry = args[at] if at is not None and len(args) > at else default
                gid = getattr(entry, GID_ATTR, None)
                recorder = process.recorder
                if gid is None or recorder is None:
                    _replayed(entry)
                else:
                    recorder.add_replay(gid, {})    # record.emit_replay(gid), fewer calls
            except Exception as exc:
                runtime.fail(target, exc)
            return result

        return replay


def _replayed(entry: Any) -> None:
    """Record one replay of the graph of `entry` (a gid given here if it has none)."""
    gid = getattr(entry, GID_ATTR, None)
    if gid is None:
        gid = graphs.next_gid()
        setattr(entry, GID_ATTR, gid)
    recorder = record.STATE.recorder
    if recorder is not None:
        recorder.add_replay(gid, {})      # record.emit_replay(gid), one call fewer


class EagerBreak(Handler):
    """add_eager(fn): the call runs eagerly between segments, so it is not capturing."""

    OPTIONS = {"segment_src": list[str]}   # srcs of the segments a break ends (torch)

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
    """The runner's dispatch decision: (mode, batch descriptor) or a descriptor with cg_mode.

    On a method target the probe is `wrapper`'s one frame: a dispatch whose record
    repeats the last one but for its numbers (num_tokens, num_reqs) is held by the fold
    without building the record (fold.Folder.hold, as keyed probes do); `after` is the
    path of the engine's other wrappers."""

    MARKS_STEPS = True     # each dispatch begins a step (sampling.StepAside)
    NAMED = ("num_tokens", "uniform", "num_reqs")   # the pack's fields a record carries

    def __init__(self, spec: Any) -> None:
        super().__init__(spec)
        self.last_key: Any = None       # the last descriptor, and plain() of it
        self.last_plain: Any = None
        # (const, fold key, fields) of the last record added while folding (Folder.hold)
        self.last_record: tuple | None = None

    def after(self, view: Any, info: Any, token: Any, result: Any, error: Any) -> None:
        graphs.next_step()        # a dispatch begins a forward: a step (sampling.StepAside)
        if error is not None:
            return
        fields = self.fields(view)
        mode, key = _decision(result, fields)
        recorder = record.STATE.recorder
        if recorder is not None:
            recorder.add("dispatch", self.record_fields(mode, self.plain_key(key), fields))

    def wrapper(self, runtime: Any, info: Any, original: Any, state: Any) -> Any:
        """The replacement of a dispatch method called as (runner, ...): the call, the
        step it begins (graphs.next_step, inline) and its record, in one frame."""
        from mlatrace.probe.recording import extractors

        extract = extractors(self.spec, info, 1)[0]
        names = tuple(name for name in self.NAMED
                      if name in (self.spec.extract.names()
                                  if hasattr(self.spec.extract, "names") else ()))
        step, next_step = graphs.STEP, graphs.next_step
        taken_off, put_back = graphs._taken_off, graphs.put_back_wrappers
        process = record.STATE
        clock, thread_id = time.perf_counter_ns, threading.get_ident
        target = info.target

        def dispatch(*args: Any, **kwargs: Any) -> Any:
            if runtime.disabled or not state.active:
                return original(*args, **kwargs)
            runtime.hits += 1
            try:
                result = original(*args, **kwargs)
            except BaseException:
                if not runtime.disabled:
                    next_step()
                raise
            if runtime.disabled:
                return result
            try:
                step.value += 1           # graphs.next_step, inline: a dispatch begins a step
                if taken_off:
                    put_back()
                fields = extract(args[0] if args else None, args, kwargs, result)
                if type(result) is tuple and len(result) >= 2:
                    mode, key = result[0], result[1]
                else:
                    mode, key = _decision(result, fields)
                if not (isinstance(mode, str) or mode is None):
                    mode = _mode_name(mode)
                last = self.last_key
                if last is not None and (key is last or (type(key) is type(last)
                                                         and key == last)):
                    plain_key = self.last_plain   # a steady step's descriptor
                else:
                    plain_key = self.plain_key(key)
                recorder = process.recorder
                if recorder is None:
                    return result
                folder = recorder.folder if recorder.enabled else None
                if folder is None:
                    recorder.add("dispatch", self.record_fields(mode, plain_key, fields))
                    return result
                # what the record holds but for the numbers a fold keeps in ranges
                const: list = [mode, plain_key]
                moving: dict = {}
                for name in names:
                    value = fields.get(name)
                    if type(value) is int or type(value) is float:
                        moving[name] = value
                        const.append(_MOVED)
                    else:
                        const.append(value)
                held = self.last_record
                if held is not None and held[0] == const and folder.hold(
                        "dispatch", held[1], held[2], moving, clock() - recorder.t0,
                        thread_id()):
                    return result
                out = self.record_fields(mode, plain_key, fields)
                fold_key = recorder.add_keyed("dispatch", out)
                self.last_record = None if fold_key is None else (const, fold_key, out)
            except Exception as exc:
                runtime.fail(target, exc)
            return result

        return dispatch

    def plain_key(self, key: Any) -> Any:
        """plain() of a new descriptor, kept for the next dispatch if == on it compares
        plain values (a tuple of scalars)."""
        plain_key = plain(key)
        scalars = isinstance(key, tuple)
        for item in key if scalars else ():
            if type(item) not in _SCALARS:
                scalars = False
                break
        self.last_key, self.last_plain = (key, plain_key) if scalars else (None, None)
        return plain_key

    def record_fields(self, mode: Any, plain_key: Any, fields: dict) -> dict:
        """The dispatch record's fields: uniform (a uniform decode batch) and num_reqs
        where the pack names them, by which graph use tells decode steps from prefill
        and mixed ones."""
        out = {"mode": mode if isinstance(mode, str) or mode is None else _mode_name(mode),
               "key": plain_key, "num_tokens": fields.get("num_tokens")}
        for name in ("uniform", "num_reqs"):
            if fields.get(name) is not None:
                out[name] = fields[name]
        return out


_MOVED = object()       # in a dispatch's const: a number the fold holds in a range


def _decision(result: Any, fields: dict) -> tuple[Any, Any]:
    """(mode, descriptor) of a dispatch's result: a (mode, descriptor) tuple, a
    descriptor with cg_mode, else the pack's own fields."""
    if isinstance(result, tuple) and len(result) >= 2 and not hasattr(result, "_asdict"):
        return result[0], result[1]
    if hasattr(result, "cg_mode"):
        return result.cg_mode, result
    return fields.get("mode"), fields.get("key")


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
