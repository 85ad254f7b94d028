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

A plain-function probe with keyed recording (when = call | return) is written for its
target instead (keyed_probe): its key, step-aside and run in the wrapper's own frame
(recording.keyed_lines), so a steady or stepped-aside call is one Python entry.
"""

from __future__ import annotations

import linecache
import os
from collections.abc import Callable
from typing import Any

from mlatrace.probe.recording import compile_probe, keyed_lines

__all__ = ["keyed_probe", "probe_body"]

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


# The entry of both keyed wrappers: asleep, disabled or re-entered calls pass through.
_KEYED_ENTRY = """\
def {name}(*args, **kwargs):
    if aside.asleep == step.value:      # stepped aside for the rest of this step
        aside.unseen += 1
        return original(*args, **kwargs)
    if runtime.disabled or not engine.active or inside.inside:
        return original(*args, **kwargs)
    runtime.hits += 1
"""

_KEYED_CALL = _KEYED_ENTRY + """\
    try:
        instance = {instance}
        result = cap = None
        while True:
{lines}
    except Exception as exc:
        runtime.fail(target, exc)
    inside.inside = True
    try:
        return original(*args, **kwargs) if kwargs else original(*args)
    finally:
        inside.inside = False
"""

_KEYED_RETURN = _KEYED_ENTRY + """\
    instance = {instance}
{before}    inside.inside = True
    try:
        result = original(*args, **kwargs)
        if not runtime.disabled:
            try:
{cap}                while True:
{lines}
            except Exception as exc:
                runtime.fail(target, exc)
        return result
    finally:
        inside.inside = False
"""


_CAP_BEFORE = """\
    stack = threads.stack               # when = both: the capture state before the call
    gid = stack[-1] if stack else None
    cap = gid is not None
"""


def keyed_probe(name: str, when: str, method: bool, keyed: Callable[..., None],
                runtime: Any, engine: Any, inside: Any, original: Callable,
                extract: Callable[..., dict]) -> Callable:
    """A plain-function probe that records through `keyed` (recording.keyed_recording,
    or keyed_both_recording's with its late `extract`) with keyed's lines in its own
    frame: the behaviour of probe_body's keyed_call_probe, and of return_probe around
    around.keyed_around, in one frame. `engine` is the engine's STATE, `inside` the
    runtime's thread-local."""
    namespace, key_of, flags = keyed.inline        # type: ignore[attr-defined]
    indent = " " * (12 if when == "call" else 20)
    build = ("{**extract(instance, args, kwargs, result), 'capturing': cap, 'gid': gid}"
             if when == "both" else "extract(instance, args, kwargs, result)")
    lines = "".join(f"{indent}{line}\n" for line in keyed_lines(key_of, flags, "break", build))
    template = _KEYED_CALL if when == "call" else _KEYED_RETURN
    source = template.format(name=name, lines=lines,
                             instance="args[0] if args else None" if method else "None",
                             before=_CAP_BEFORE if when == "both" else "",
                             cap="" if when == "both" else " " * 16 + "cap = None\n")
    own = dict(namespace, runtime=runtime, engine=engine, inside=inside, original=original,
               extract=extract)
    return compile_probe(source, f"{name} {namespace['target']}", own)[name]
