"""Plain-function probes: the replacement of a plain Python function or method is a
plain function too (the hot kind; a step-aside may take it off its owner)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from mlatrace.probe import graphs, sampling
from mlatrace.probe.around import around_handler, recorder_around
from mlatrace.probe.paths import CallView
from mlatrace.probe.probe_calls import keyed_probe, probe_body
from mlatrace.probe.recording import (
    emitter,
    extractors,
    keyed_both_recording,
    keyed_recording,
    recording,
)
from mlatrace.probe.runtime import STATE, ProbeRuntime
from mlatrace.probe.targets import TargetInfo, is_method

__all__ = ["make_function"]


def make_function(runtime: ProbeRuntime, info: TargetInfo) -> Callable:
    """The replacement of a plain Python function or method: a plain function too.

    A wrapt FunctionWrapper costs ~0.45 us per call on its own (binding object, the
    wrapper's four-argument call); a plain function stored on the class binds as the
    original did and costs ~0.08 us. Classmethods, staticmethods and other callables
    keep the wrapt wrapper (make_wrapper).
    """
    spec = runtime.spec
    when, target = spec.when, info.target
    handler = runtime.handler
    original = info.raw
    method = is_method(info)
    extract, extract_view = extractors(spec, info, 1 if method else 0)
    positions, defaults = info.positions, info.defaults
    bound = (spec, extract_view)
    add = emitter(spec)
    state = STATE
    local = runtime.local
    late, keyed = extract, None     # late: the fields recorded after the call
    if handler is None and when != "both":
        keyed = keyed_recording(runtime, info, add, 1 if method else 0)
    elif handler is None:
        late, keyed = keyed_both_recording(runtime, info, add, 1 if method else 0) or (
            extract, None)
    note = (recording(runtime, info, add)
            if handler is None and keyed is None and when == "call" else None)

    own = getattr(handler, "wrapper", None) if method else None
    if own is not None:
        return _like(own(runtime, info, original, state), original)
    around_call = getattr(handler, "around", None) if method else None
    if around_call is not None:
        def handler_around(*args: Any, **kwargs: Any) -> Any:
            if runtime.disabled or not state.active:
                return original(*args, **kwargs)
            runtime.hits += 1
            return around_call(runtime, info, original, args, kwargs)

        return _like(handler_around, original)

    if handler is not None:
        before = getattr(handler, "before", None)
        after = getattr(handler, "after", None)

        def handler_probe(*args: Any, **kwargs: Any) -> Any:
            if runtime.disabled or not state.active:
                return original(*args, **kwargs)
            runtime.hits += 1
            if method:
                view = CallView(args[0] if args else None, args[1:], kwargs, positions,
                                defaults, None, bound)
            else:
                view = CallView(None, args, kwargs, positions, defaults, None, bound)
            return around_handler(runtime, info, before, after, view, original, args, kwargs)

        return _like(handler_probe, original)

    if keyed is not None:
        # compares before it extracts, steps aside, in one frame (probe_calls.keyed_probe)
        probe = keyed_probe(f"keyed_{when}_probe", when, method, keyed, runtime, state, local,
                            original, late)
        return _taking_off(_like(probe, original), keyed.aside, info)
    step = graphs.STEP
    if when == "call":
        # every call is extracted
        make = probe_body("call_probe", wrapt_style=False, method=method, step_aside=False,
                          record="note")
        return _like(make(runtime, state, local, target, original, None, step, None, note,
                          extract, None), original)

    around = recorder_around(runtime, info, extract, note, 1 if method else 0, add, keyed)
    aside = getattr(around, "aside", None) or sampling.Awake()
    make = probe_body("return_probe", wrapt_style=False, method=method, step_aside=True,
                      record=None)
    return _taking_off(_like(make(runtime, state, local, target, original, aside, step, None,
                                  None, extract, around), original), aside, info)


def _taking_off(replacement: Callable, aside: Any, info: TargetInfo) -> Callable:
    """The replacement, which its step-aside may take off its owner (sampling)."""
    sampling.may_take_off(aside, info.owner, info.attr, replacement, info.raw)
    return replacement


def _like(replacement: Callable, original: Callable) -> Callable:
    """Give the replacement the original's name, doc and signature (__wrapped__)."""
    functools.update_wrapper(replacement, original)
    return replacement
