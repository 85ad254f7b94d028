"""How a probed call's fields reach the recorder: the extractors compiled for a target,
the emitter, and the eager sampling (probe/sampling.py) on the way: `recording` for
fields already extracted, `keyed_recording` comparing a key before it extracts."""

from __future__ import annotations

import linecache
import os
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from mlatrace import record
from mlatrace.probe import graphs, sampling
from mlatrace.probe.packs import ProbeSpec
from mlatrace.probe.paths import CallView
from mlatrace.probe.runtime import ProbeRuntime
from mlatrace.probe.targets import TargetInfo
from mlatrace.record import fold as record_fold
from mlatrace.record import fold_inline

__all__ = ["compile_probe", "emitter", "extractors", "keyed_both_recording", "keyed_lines",
           "keyed_recording", "recording"]


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

    record_call is generated for the target (keyed_lines), the key computed in its own
    frame; ``record_call.inline`` lets a plain-function probe write the same lines into
    its own frame (probe_calls.keyed_probe_body), so that a steady call is one entry.
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
    sampler = sampling.Sampler(spec.qualname, kind, limit)
    runtime.samplers.append(sampler)
    aside = sampling.step_aside_for(spec.qualname, kind)
    namespace = dict(
        key_of.namespace, kind=kind, add=add,
        threads=graphs._local,          # graphs.capturing(), read inline (one call fewer)
        epoch=graphs.EPOCH, step=graphs.STEP, aside=aside, runs=sampling.ThreadRuns(),
        run_state=sampling.RunState, sampler=sampler, keep=sampler.keep, limit=limit,
        counted_from=limit + 1,         # beyond this place in a run a call is only counted
        max_layers=sampling.MAX_LAYERS, no_layer=sampling.NO_LAYER, target=info.target,
        max_trail=sampling.MAX_TRAIL, same=sampling.SAME, taken_off=graphs._taken_off,
        process=record.STATE, last_record=_LastRecord(), clock=time.perf_counter_ns,
        thread_id=threading.get_ident, step_kinds=graphs.STEP_KINDS, __name__=__name__)
    flags = _Flags(marks_step=kind in graphs.STEP_KINDS, holds=holds,
                   stepping=isinstance(aside, sampling.StepAside),
                   has_layer="layer" in by_name,
                   direct=add is record.emit_fields,     # recorder.add called, not emit
                   folds=fold_inline.holds(kind))
    lines = keyed_lines(key_of, flags, "return")
    source = ("def record_call(instance, args, kwargs, result, build, cap=None):\n"
              + "".join(f"    {line}\n" for line in lines))
    record_call = compile_probe(source, f"record_call {info.target}", namespace)["record_call"]
    record_call.aside = aside           # type: ignore[attr-defined]
    # for a wrapper that records in its own frame (probe_calls.keyed_probe_body)
    record_call.inline = (namespace, key_of, flags)     # type: ignore[attr-defined]
    return record_call


def keyed_both_recording(runtime: ProbeRuntime, info: TargetInfo,
                          add: Callable[[str, dict], None], offset: int
                          ) -> tuple[Callable[..., dict], Callable[..., None]] | None:
    """(late, record_call) of a when = both probe whose capturing and gid fields are
    capturing() and gid(): those two are read before the call and the other fields
    after it (``late``, which leaves them out), keyed_recording's path; None where it
    does not apply."""
    program = runtime.spec.extract
    entries = dict(getattr(program, "entries", None) or ())
    if entries.get("capturing") != ("call0", "capturing") or \
            entries.get("gid") != ("call0", "gid") or not hasattr(program, "bind"):
        return None
    keyed = keyed_recording(runtime, info, add, offset, skip_late=("capturing", "gid"))
    if keyed is None:
        return None
    late = program.bind(info.positions, info.defaults, offset, last="layer",
                        skip=("capturing", "gid"))
    return late, keyed


class _Flags(NamedTuple):
    """What a keyed probe's recording does, fixed when its code is written."""

    marks_step: bool    # it advances the step on each call (graphs.STEP_KINDS)
    holds: bool         # its key splits off the numbers a fold holds (record.fold)
    stepping: bool      # it steps aside (sampling.StepAside)
    has_layer: bool     # its fields have a layer (put last in a record)
    direct: bool        # it hands records to recorder.add(_keyed), not through emit
    folds: bool         # the fold can hold its records (fold_inline.holds)


def keyed_lines(key_of: Any, flags: _Flags, done: str,
                build: str = "build(instance, args, kwargs, result)") -> list[str]:
    """The body of keyed_recording's record_call as lines, for one target: in order,
    a step-marking probe's step advance (graphs.next_step, inline), the capture test, the key (key_of's lines), the step-aside (StepAside.seen's common
    cases and take_off_now, inline), the run (Sampler.keep's counting and new-run
    branches, inline) and, for a kept record, the fold's hold or the record. Reads
    instance, args, kwargs, result and cap, and builds a record with `build` (an
    expression); `done` ends it (``return``, or ``break`` in a loop of the caller's
    frame). Rare work stays in calls: a capture's
    record, judging a step (seen), the first take-off (which finds the sites), a run
    that ends, the fold's hold, building a record."""
    lines = []
    if flags.marks_step:
        lines += ["step.value += 1     # graphs.next_step, inline",
                  "while taken_off:",
                  "    try:",
                  "        t_site, t_attr, t_wrapper, t_original = taken_off.pop()",
                  "    except IndexError:      # another thread's step emptied it",
                  "        break",
                  "    if t_site.__dict__.get(t_attr) is t_original:",
                  "        setattr(t_site, t_attr, t_wrapper)"]
    lines += ["if cap is None:",
              "    stack = threads.stack",
              "    cap = bool(stack) and stack[-1] is not None",
              "if cap:",
              f"    add(kind, {build})   # what a graph freezes",
              f"    {done}",
              *key_of.lines,
              f"layer = {key_of.parts[0]}",
              f"key = {key_of.parts[1]}"]
    if flags.holds:
        lines += [f"const = {key_of.parts[2]}", f"moving = {key_of.parts[3]}"]
    if flags.stepping:
        lines += [
            "now = step.value",
            "if aside.step != now:",
            "    if aside.trail is None and aside.steady >= aside.settle \\",
            "            and aside.countdown > 1:",
            "        # the first call of a step after a step it slept through: it sleeps",
            "        # through this one too, taken off its sites where it can be",
            "        aside.step = now",
            "        aside.first = key",
            "        aside.countdown -= 1",
            "        aside.asleep = now",
            "        if aside.take_off is not None:",
            "            if aside.sites is None:",
            "                aside.take_off_now()",
            "            else:",
            "                off = False",
            "                t_wrapper, t_original = aside.take_off[2:]",
            "                for site, attr in aside.sites:",
            "                    if site.__dict__.get(attr) is t_wrapper:",
            "                        setattr(site, attr, t_original)",
            "                        taken_off.append((site, attr, t_wrapper, t_original))",
            "                        off = True",
            "                if off:",
            "                    aside.steps_off += 1",
            "    else:",
            "        aside.seen(key)",
            "elif aside.trail is not None:",
            "    trail = aside.trail      # a step it judges: this call goes on its trail",
            "    if len(trail) < max_trail:",
            "        trail.append(same if key == aside.first else key)",
            "    else:",
            "        aside.seen(key)",
        ]
    lines += [
        "run = runs.run",
        "if run is None:",
        "    run = runs.run = run_state()",
        "elif run.run >= counted_from and run.epoch == epoch.value and key == run.last:",
        "    # the common case of a long run: only counted",
        "    run.run += 1",
        "    sampler.sampled += 1",
        "    if layer is not no_layer:",
        "        layers = run.layers",
        "        if layers is None:",
        "            layers = run.layers = {}",
        "        if len(layers) < max_layers:",
        "            layers[layer] = None",
        f"    {done}",
        "if run.run <= limit and not (run.epoch == epoch.value and key == run.last",
        "                             and run.last is not None):",
        "    # a new run (no run of left-out records to end)",
        "    run.last = key",
        "    run.run = n = 1",
        "    run.epoch = epoch.value",
        "    run.layers = None if layer is no_layer else {layer: None}",
        "else:",
        "    n = keep(run, key, layer, target)",
        "if n:",
        "    recorder = process.recorder",
    ]
    finish = [f"    fields = {build}"]
    if flags.has_layer:
        finish.append('    fields["layer"] = fields.pop("layer", None)')
    finish.append('    fields["repeat"] = n')
    if flags.holds and flags.direct:
        # A steady step held by the fold: when this call's fields equal the last
        # record's but for the numbers the fold keeps in ranges, no record is built
        # (fold.Folder.hold's steps, in this frame: fold_inline); else it is, and
        # becomes the last record.
        lines += [
            "    folder = recorder.folder if recorder is not None and recorder.enabled "
            "else None",
            "    if folder is not None:",
            "        last = last_record.value",
            "        if n == 1 and last is not None and last[0] == const:",
            "            moving['repeat'] = 1",
            *("            " + line
              for line in (fold_inline.hold_lines(flags.marks_step, done)
                           if flags.folds else ())),
            *("    " + line for line in finish),
            "        fold_key = recorder.add_keyed(kind, fields)",
            "        last_record.value = None if fold_key is None else (const, fold_key, "
            "fields)",
            f"        {done}",
        ]
    lines += finish
    if flags.direct:
        lines += ["    if recorder is not None:", "        recorder.add(kind, fields)"]
    else:
        lines += ["    add(kind, fields)"]
    lines.append(done)
    return lines


# generated code reports a file inside mlatrace/probe/ (see probe_calls._FILENAME)
_FILENAME = os.path.join(os.path.dirname(os.path.abspath(__file__)), "<probe {name}>")


def compile_probe(source: str, name: str, namespace: dict[str, Any]) -> dict[str, Any]:
    """Run generated source in `namespace` (returned), its lines kept for tracebacks."""
    filename = _FILENAME.format(name=name)
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), namespace)  # noqa: S102
    return namespace
