"""wrapt probes: the FunctionWrapper's wrapper for classmethods, staticmethods and other
callables, with the same behaviour as the plain-function probes."""

from __future__ import annotations

from collections.abc import Callable

from mlatrace.probe import graphs, sampling
from mlatrace.probe.around import around_handler, recorder_around
from mlatrace.probe.paths import CallView
from mlatrace.probe.probe_calls import probe_body
from mlatrace.probe.recording import emitter, extractors, keyed_recording, recording
from mlatrace.probe.runtime import STATE, ProbeRuntime
from mlatrace.probe.targets import TargetInfo

__all__ = ["make_wrapper"]


def make_wrapper(runtime: ProbeRuntime, info: TargetInfo) -> Callable:
    """The wrapt wrapper (classmethods, staticmethods, other callables): same behaviour."""
    spec = runtime.spec
    when = spec.when
    target = info.target
    handler = runtime.handler
    positions, defaults = info.positions, info.defaults
    extract, _ = extractors(spec, info, 0)
    bound = (spec, extract)
    add = emitter(spec)
    state = STATE
    keyed = (keyed_recording(runtime, info, add, 0)
             if handler is None and when != "both" else None)
    note = (recording(runtime, info, add)
            if handler is None and keyed is None and when == "call" else None)

    if handler is not None:
        before = getattr(handler, "before", None)
        after = getattr(handler, "after", None)

        def handler_wrapper(wrapped, instance, args, kwargs):
            if runtime.disabled or not state.active:
                return wrapped(*args, **kwargs)
            runtime.hits += 1
            view = CallView(instance, args, kwargs, positions, defaults, None, bound)
            return around_handler(runtime, info, before, after, view, wrapped, args, kwargs)

        return handler_wrapper

    local = runtime.local
    step = graphs.STEP
    if when == "call":
        aside = keyed.aside if keyed is not None else sampling.Awake()
        make = probe_body("call_wrapper", wrapt_style=True, method=False, step_aside=True,
                          record="keyed" if keyed is not None else "note")
        return make(runtime, state, local, target, None, aside, step, keyed, note, extract, None)

    around = recorder_around(runtime, info, extract, note, 0, add, keyed)
    aside_after = getattr(around, "aside", None) or sampling.Awake()
    make = probe_body("return_wrapper", wrapt_style=True, method=False, step_aside=True,
                      record=None)
    return make(runtime, state, local, target, None, aside_after, step, None, None, extract,
                around)
