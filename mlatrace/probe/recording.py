"""How a probed call's fields reach the recorder: the extractors compiled for a target,
the emitter, and the eager sampling (probe/sampling.py) on the way: `recording` for
fields already extracted, `keyed_recording` comparing a key before it extracts."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from mlatrace import record
from mlatrace.probe import graphs, sampling
from mlatrace.probe.packs import ProbeSpec
from mlatrace.probe.paths import CallView
from mlatrace.probe.runtime import ProbeRuntime
from mlatrace.probe.targets import TargetInfo
from mlatrace.record import fold as record_fold

__all__ = ["emitter", "extractors", "keyed_recording", "recording"]


def emitter(spec: ProbeSpec) -> Callable[[str, dict], None]:
    """How a probe hands its fields to the recorder: as a dict, without a kwargs copy.

    A field named ``kind`` cannot pass through ``record.emit(kind, **fields)``; such a
    probe keeps that call (it fails, as it always did, and is disabled).
    """
    names = spec.extract.names() if hasattr(spec.extract, "names") else []
    if "kind" in names:
        emit = record.emit
        return lambda kind, fields: emit(kind, **fields)
    return record.emit_fields


def extractors(spec: ProbeSpec, info: TargetInfo, offset: int
                ) -> tuple[Callable[..., dict], Callable[..., dict]]:
    """(extract for the wrapper's own args, extract for a CallView's args) of one target.

    Both take (instance, args, kwargs, result). The first reads the call's args tuple
    as the replacement receives it (self included when offset is 1), the second a
    CallView's args (self excluded).
    """
    program = spec.extract
    bind = getattr(program, "bind", None)
    if bind is None:
        positions, defaults = info.positions, info.defaults

        def by_view(instance: Any, args: tuple, kwargs: dict, result: Any) -> dict:
            return spec.fields_of(CallView(instance, args, kwargs, positions, defaults, result))

        def by_view_shifted(instance: Any, args: tuple, kwargs: dict, result: Any) -> dict:
            return by_view(instance, args[offset:], kwargs, result)

        return (by_view_shifted if offset else by_view), by_view
    direct = bind(info.positions, info.defaults, offset, last="layer")
    for_view = bind(info.positions, info.defaults, 0, last="layer") if offset else direct
    return direct, for_view


def recording(runtime: ProbeRuntime, info: TargetInfo, add: Callable[[str, dict], None]
               ) -> Callable[[dict], None]:
    """How a probe hands one call's fields on: to the recorder, through the eager
    sampling (probe/sampling.py) unless MLATRACE_SAMPLE is 0 or the probe's fields
    are not a compiled program."""
    spec = runtime.spec
    kind = spec.kind
    limit = sampling.limit()
    entries = getattr(spec.extract, "entries", None)
    next_step = graphs.next_step
    marks_step = kind in graphs.STEP_KINDS
    if not limit or entries is None:
        def note_all(fields: dict) -> None:
            if marks_step:
                next_step()
            add(kind, fields)

        return note_all
    sampler = sampling.Sampler(spec.qualname, kind, limit)
    runtime.samplers.append(sampler)
    by_name = dict(entries)
    # The probe's own capturing() field says whether this call is captured; else ask.
    trusted = by_name.get("capturing") == ("call0", "capturing")
    has_layer = "layer" in by_name
    ignored = sampling.ignored_fields(kind, by_name)
    capturing = graphs.capturing
    local = sampling.ThreadRuns()       # one run per target and thread
    keep = sampler.keep
    no_layer = sampling.NO_LAYER
    target = info.target

    def note(fields: dict) -> None:
        if marks_step:
            next_step()
        if fields.get("capturing") if trusted else capturing():
            add(kind, fields)     # what a graph freezes: always recorded
            return
        state = local.run
        if state is None:
            state = local.run = sampling.RunState()
        layer = fields.pop("layer", no_layer) if has_layer else no_layer
        if ignored:
            key = fields.copy()
            for name in ignored:
                key.pop(name, None)
        else:
            key = fields
        n = keep(state, key, layer, target)
        if n:
            out = fields if key is not fields else fields.copy()
            if layer is not no_layer:
                out["layer"] = layer
            out["repeat"] = n
            add(kind, out)

    return note


class _LastRecord(threading.local):
    """Per thread: (const, fold key, fields) of a keyed probe's last record, or None."""

    value: tuple | None = None


def keyed_recording(runtime: ProbeRuntime, info: TargetInfo, add: Callable[[str, dict], None],
                     offset: int, skip_late: tuple[str, ...] = ()
                     ) -> Callable[..., None] | None:
    """The eager sampling of a compiled probe that compares before it extracts.

    Returns ``record_call(instance, args, kwargs, result, build, cap=None)``: when the
    call is captured (``cap``, else ``graphs.capturing()`` now) its fields
    (``build()``) are recorded; else the probe's key (paths.FieldsProgram.bind_key:
    raw shapes, dtypes and scalars in one tuple, no pointers of eager records, no
    dict) goes to the run-length sampler, and ``build()`` runs only for a record that
    is kept. Records and runs are the same as recording's; a sampled-away call costs
    the key, not the extraction. None where this does not apply (sampling off, fields
    not generated): recording's path is used.

    The key of every eager call also goes to the target's step-aside
    (sampling.StepAside, ``record_call.aside``), which the wrappers read first; a
    step-marking probe advances the step on each call instead.
    """
    spec = runtime.spec
    kind = spec.kind
    limit = sampling.limit()
    program = spec.extract
    entries = getattr(program, "entries", None)
    bind_key = getattr(program, "bind_key", None)
    if not limit or entries is None or bind_key is None:
        return None
    by_name = dict(entries)
    skip = list(sampling.ignored_fields(kind, by_name)) + list(skip_late)
    # Outside a capture, capturing() is False and gid() None: nothing to compare.
    if by_name.get("capturing") == ("call0", "capturing"):
        skip.append("capturing")
    if by_name.get("gid") == ("call0", "gid"):
        skip.append("gid")
    key_of = bind_key(info.positions, info.defaults, offset, skip=tuple(skip),
                      moving=(record_fold.EXACT, record_fold.RANGED_NESTED))
    if key_of is None:
        return None
    holds = getattr(key_of, "moving", False)
    last_record = _LastRecord()
    sampler = sampling.Sampler(spec.qualname, kind, limit)
    runtime.samplers.append(sampler)
    has_layer = "layer" in by_name
    threads = graphs._local             # graphs.capturing(), read inline (one call fewer)
    epoch = graphs.EPOCH
    local = sampling.ThreadRuns()       # one run per target and thread
    keep = sampler.keep
    run_state = sampling.RunState
    target = info.target
    counted_from = limit + 1            # beyond this place in a run a call is only counted
    max_layers = sampling.MAX_LAYERS
    no_layer = sampling.NO_LAYER
    aside = sampling.step_aside_for(spec.qualname, kind)
    seen = aside.seen
    stepping = isinstance(aside, sampling.StepAside)
    step = graphs.STEP
    next_step = graphs.next_step
    marks_step = kind in graphs.STEP_KINDS
    process = record.STATE
    clock, thread_id = time.perf_counter_ns, threading.get_ident
    direct = add is record.emit_fields      # recorder.add called here, not through emit

    def record_call(instance: Any, args: tuple, kwargs: dict, result: Any,
                    build: Callable[..., dict], cap: Any = None) -> None:
        if marks_step:
            next_step()
        if cap is None:
            stack = threads.stack
            cap = bool(stack) and stack[-1] is not None
        if cap:
            add(kind, build(instance, args, kwargs, result))   # what a graph freezes
            return
        if holds:
            layer, key, const, moving = key_of(instance, args, kwargs, result)
        else:
            layer, key = key_of(instance, args, kwargs, result)
        if stepping:
            now = step.value
            if aside.step != now:
                if aside.trail is None and aside.steady >= aside.settle \
                        and aside.countdown > 1:
                    # StepAside.seen's common case, inline: the first call of a step
                    # after a step it slept through; it sleeps through this one too.
                    aside.step = now
                    aside.first = key
                    aside.countdown -= 1
                    aside.asleep = now
                    if aside.take_off is not None:
                        aside.take_off_now()
                else:
                    seen(key)
            elif aside.trail is not None:
                seen(key)   # else: a step it is not judging (no step marks, or asleep)
        state = local.run
        if state is None:
            state = local.run = run_state()
        elif state.run >= counted_from and state.epoch == epoch.value and key == state.last:
            # Sampler.keep's counting branch, inline: the common case of a long run.
            state.run += 1
            sampler.sampled += 1
            if layer is not no_layer:
                layers = state.layers
                if layers is None:
                    layers = state.layers = {}
                if len(layers) < max_layers:
                    layers[layer] = None
            return
        if state.run <= limit and not (state.epoch == epoch.value and key == state.last
                                       and state.last is not None):
            # Sampler.keep's new-run branch, inline (no run of left-out records to end).
            state.last = key
            state.run = n = 1
            state.epoch = epoch.value
            state.layers = None if layer is no_layer else {layer: None}
        else:
            n = keep(state, key, layer, target)
        if n:
            recorder = process.recorder
            folder = recorder.folder if recorder is not None and recorder.enabled else None
            if holds and folder is not None:
                # A steady step held by the fold: when this call's fields equal the last
                # record's but for the numbers the fold keeps in ranges, no record is
                # built (fold.Folder.hold); else it is, and becomes the last record.
                last = last_record.value
                if n == 1 and last is not None and last[0] == const:
                    moving["repeat"] = 1
                    if folder.hold(kind, last[1], last[2], moving, clock() - recorder.t0,
                                   thread_id()):
                        return
                fields = build(instance, args, kwargs, result)
                if has_layer:
                    fields["layer"] = fields.pop("layer", None)
                fields["repeat"] = n
                if direct:
                    fold_key = recorder.add_keyed(kind, fields)
                    last_record.value = None if fold_key is None else (const, fold_key, fields)
                else:
                    add(kind, fields)
                return
            fields = build(instance, args, kwargs, result)
            if has_layer:
                fields["layer"] = fields.pop("layer", None)
            fields["repeat"] = n
            if direct:
                if recorder is not None:
                    recorder.add(kind, fields)
            else:
                add(kind, fields)

    record_call.aside = aside           # type: ignore[attr-defined]
    return record_call
