"""The bodies of the engine's own probes, written once and specialised per kind.

Every probe the engine makes itself (no handler) does the same per call: pass straight
through when stepped aside, disabled, uninstalled or already inside a call of this probe;
count the hit; record the call (before it: when = call; around it: return | both) with a
failing extraction disabling the probe, never the call. The specialisations differ in
their parameters (a plain function's ``*args, **kwargs``, a wrapt wrapper's ``wrapped,
instance, args, kwargs``), in how they read the instance, in whether they step aside and
in how they record. Each one is generated from the template below and compiled once, the
way pathlang/codegen.py writes field extractors: a probed call runs in one frame, as a
hand-written wrapper would, with the same closure reads.
"""

from __future__ import annotations

import linecache
import os
from collections.abc import Callable
from typing import Any

__all__ = ["probe_body"]

_FACTORY = """\
def factory(runtime, state, local, target, original, aside, step, keyed, note, extract, around):
    def {name}({params}):
{aside_check}        if runtime.disabled or not state.active or local.inside:
            return original(*args, **kwargs)
        runtime.hits += 1
{body}
    return {name}
"""

_ASIDE = """\
        if aside.asleep == step.value:      # stepped aside for the rest of this step
            aside.unseen += 1
            return original(*args, **kwargs)
"""

_RECORD_THEN_CALL = """\
        try:
            {record}
        except Exception as exc:
            runtime.fail(target, exc)
        local.inside = True
        try:
            return {call}
        finally:
            local.inside = False"""

_AROUND = """\
        local.inside = True
        try:
            return around(original, {instance}, args, kwargs)
        finally:
            local.inside = False"""

_RECORDS = {"keyed": "keyed({instance}, args, kwargs, None, extract)",
            "note": "note(extract({instance}, args, kwargs, None))"}

# the file name generated code reports: inside mlatrace/probe/, which frame walks that
# look for the traced program's own frame (handlers/sync.py) skip
_FILENAME = os.path.join(os.path.dirname(os.path.abspath(__file__)), "<probe {name}>")
_FACTORIES: dict[tuple, Callable[..., Callable]] = {}


def probe_body(name: str, wrapt_style: bool, method: bool, step_aside: bool,
               record: str | None) -> Callable[..., Callable]:
    """The factory of one specialisation: ``factory(runtime, state, local, target,
    original, aside, step, keyed, note, extract, around)`` returns the probe.

    ``wrapt_style``: the wrapper takes (wrapped, instance, args, kwargs) (the wrapped
    callable shadows ``original``), else (*args, **kwargs) and calls ``original``;
    ``method``: a plain function's instance is args[0]; ``step_aside``: test the target's
    step-aside first; ``record``: "keyed" or "note" records before the call, None runs
    ``around`` (when = return | both)."""
    key = (name, wrapt_style, method, step_aside, record)
    factory = _FACTORIES.get(key)
    if factory is not None:
        return factory
    instance = "instance" if wrapt_style else ("(args[0] if args else None)" if method
                                               else "None")
    if record is None:
        body = _AROUND.format(instance=instance)
    else:
        call = ("original(*args, **kwargs)" if wrapt_style
                else "original(*args, **kwargs) if kwargs else original(*args)")
        body = _RECORD_THEN_CALL.format(record=_RECORDS[record].format(instance=instance),
                                        call=call)
    source = _FACTORY.format(name=name, body=body,
                             params="original, instance, args, kwargs" if wrapt_style
                             else "*args, **kwargs",
                             aside_check=_ASIDE if step_aside else "")
    filename = _FILENAME.format(name=name)
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace: dict[str, Any] = {"__name__": __name__}
    exec(compile(source, filename, "exec"), namespace)  # noqa: S102
    factory = _FACTORIES[key] = namespace["factory"]
    return factory
