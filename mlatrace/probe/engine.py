"""Applies probe packs to live modules: lazy, undoable, failure-isolated patches.

Each probe target ``module:Qualified.name`` is patched when its module is first
imported (a wrapt post-import hook; the engine never imports a target itself) or
at once when the module is already loaded. A plain Python function or method is
replaced by a plain function (``__wrapped__`` points at the original, whose name,
doc and signature it shows); classmethods, staticmethods and other callables get a
wrapt FunctionWrapper. Each patch is recorded so that ``uninstall()`` puts the
original back.

Cost: a probe's fields are compiled for each target when it is patched (see
paths.FieldsProgram.bind), and its record goes to the recorder as the dict built,
so a probed call with a handful of fields costs about 1-2 us.

Isolation: whatever goes wrong with one probe disables that probe only, is recorded
once as ``probe.error`` (probe, target, reason, error), and never reaches the traced
program. A handler that cannot be resolved (packs.resolve_handler) or built is not
installed (reason ``load``); a target that is missing (``missing``), whose parameters
do not start with the probe's declared ``params`` (``drift``) or that cannot be
patched (``patch``) is left alone while the probe's other targets are patched; a probe
whose extraction or handler raises during a call (``run``) is disabled for good and
the call goes on untouched. Every other probe of every pack still installs.

Coverage: ``Engine.coverage()`` says, per probe, which targets were patched, which
were skipped and why (module never imported, missing, drift, inherited), its errors
and how many calls it saw (``hits``: one attribute increment per call in the engine's
own wrappers; None for probes whose handler makes its own replacement). The recorder
writes it into ``process.end`` (``record.set_end_info``).
"""

from __future__ import annotations

import functools
import inspect
import sys
import threading
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import wrapt

from mlatrace import record
from mlatrace.probe import graphs, sampling
from mlatrace.probe.packs import Pack, ProbeSpec, resolve_handler
from mlatrace.probe.paths import CallView

MARK = "_self_mlatrace_probes"   # attribute on our wrappers: the probe names they carry


class Drift(Exception):
    """The installed target does not have the declared parameters."""


@dataclass
class Patch:
    """One applied patch, enough to undo it."""

    owner: Any
    attr: str
    original: Any
    replacement: Any
    target: str
    inherited: bool = False        # the class only inherited it: undo by deleting


@dataclass
class TargetInfo:
    """A resolved target: where it lives and how to read its arguments."""

    target: str
    owner: Any
    attr: str
    raw: Any                       # the attribute as stored (descriptor included)
    func: Any                      # the plain function behind it
    names: list[str]               # its parameter names ('*args', '**kw' for var kinds)
    positions: dict[str, int]      # name -> index into the wrapper's args
    defaults: dict[str, Any]


class _State:
    """Engine-wide switch: wrappers left behind after uninstall() pass straight through."""

    active = False
    generation = 0


STATE = _State()


class _Inside(threading.local):
    """Per thread: is a call of this probe under way? (class default: no AttributeError)"""

    inside = False


class ProbeRuntime:
    """A probe at run time: its spec, its handler, and whether it is still enabled."""

    def __init__(self, spec: ProbeSpec, handler: Any = None) -> None:
        self.spec = spec
        self.handler = handler
        self.disabled = False
        self.hits = 0                  # calls seen by the engine's wrappers (not custom ones)
        self.counted = False           # whether a wrapper of the engine counts hits for it
        self.reported: set[str] = set()
        self.errors: list[dict[str, str]] = []
        self.patched: list[str] = []
        self.skipped: dict[str, str] = {}
        self.samplers: list[sampling.Sampler] = []
        # An override that calls super() (AMXMLAMetadataBuilder.build ->
        # MLACommonMetadataBuilder.build) is one call: only the outermost is recorded.
        self.local = _Inside()

    def fail(self, target: str, exc: BaseException) -> None:
        """Disable this probe after its first failure (during a call) and say so once.
        A probe that marks steps takes step-aside down with it (sampling)."""
        if self.disabled:
            return
        self.disabled = True
        if self.spec.kind in graphs.STEP_KINDS or getattr(self.handler, "MARKS_STEPS", False):
            sampling.stop_stepping_aside()
        self.report(target, f"{type(exc).__name__}: {exc}", "run")

    def report(self, target: str, error: str, reason: str = "run") -> None:
        """Record one probe.error per (probe, target); reason: load, missing, drift, patch, run."""
        if target in self.reported:
            return
        self.reported.add(target)
        try:
            self.errors.append({"target": target, "reason": reason, "error": error[:500]})
            record.emit("probe.error", probe=self.spec.qualname, target=target, reason=reason,
                        error=error[:500])
            record.note_probe_error()
        except Exception:
            pass


def split_target(target: str) -> tuple[str, list[str]]:
    module, _, qual = target.partition(":")
    return module, qual.split(".")


def _param_names(func: Any) -> list[str]:
    names = []
    for param in inspect.signature(func).parameters.values():
        if param.kind is inspect.Parameter.VAR_POSITIONAL:
            names.append("*" + param.name)
        elif param.kind is inspect.Parameter.VAR_KEYWORD:
            names.append("**" + param.name)
        else:
            names.append(param.name)
    return names


def resolve(target: str, module: Any, declared: list[str],
            reads: list[str] | None = None, inherited: bool = False) -> TargetInfo:
    """Find target in an imported module and check its parameters.

    Raises LookupError when the attribute is missing, ``Drift`` when the parameters
    differ, and ``InheritedError`` when a class does not override the method itself
    (the base class's own probe sees those calls).
    """
    _, parts = split_target(target)
    owner = module
    for part in parts[:-1]:
        owner = getattr(owner, part, None)
        if owner is None:
            raise LookupError(f"{target}: {part} not found")
    attr = parts[-1]
    if isinstance(owner, type):
        if attr not in owner.__dict__:
            if not hasattr(owner, attr):
                raise LookupError(f"{target}: {attr} not found")
            if not inherited:
                raise InheritedError(f"{target}: not overridden in {owner.__name__}")
            raw = getattr(owner, attr)
        else:
            raw = owner.__dict__[attr]
    else:
        raw = getattr(owner, attr, None)
        if raw is None:
            raise LookupError(f"{target}: {attr} not found")
    func = raw.__func__ if isinstance(raw, (classmethod, staticmethod)) else raw
    func = getattr(func, "__wrapped__", func) if isinstance(func, wrapt.ObjectProxy) else func
    try:
        names = _param_names(func)
    except (TypeError, ValueError) as exc:
        if declared or reads:
            raise Drift(f"{target}: no signature ({exc})") from None
        names = []  # a C function; the probe declared it reads no parameters
    if declared and names[: len(declared)] != declared:
        raise Drift(f"{target}: parameters ({', '.join(names)}) do not start with "
                    f"the declared ({', '.join(declared)})")
    missing = [name for name in (reads or []) if name not in names]
    if missing and not any(name.startswith("**") for name in names):
        raise Drift(f"{target}: no parameter {', '.join(missing)} "
                    f"(has {', '.join(names)})")
    bound = isinstance(owner, type) and not isinstance(raw, staticmethod)
    if attr == "__new__":
        bound = False   # __new__ is a staticmethod called with cls explicitly
    offset = 1 if bound else 0
    positions = {}
    for index, name in enumerate(names):
        if name.startswith("*"):
            break
        if index >= offset:
            positions[name] = index - offset
    try:
        defaults = {name: p.default for name, p in inspect.signature(func).parameters.items()
                    if p.default is not inspect.Parameter.empty}
    except (TypeError, ValueError):
        defaults = {}
    return TargetInfo(target, owner, attr, raw, func, names, positions, defaults)


class InheritedError(LookupError):
    """A class that inherits the method: nothing to patch at this level."""


def _emitter(spec: ProbeSpec) -> Callable[[str, dict], None]:
    """How a probe hands its fields to the recorder: as a dict, without a kwargs copy.

    A field named ``kind`` cannot pass through ``record.emit(kind, **fields)``; such a
    probe keeps that call (it fails, as it always did, and is disabled).
    """
    names = spec.extract.names() if hasattr(spec.extract, "names") else []
    if "kind" in names:
        emit = record.emit
        return lambda kind, fields: emit(kind, **fields)
    return record.emit_fields


def _extractors(spec: ProbeSpec, info: TargetInfo, offset: int
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


def _recording(runtime: ProbeRuntime, info: TargetInfo, add: Callable[[str, dict], None]
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


def _keyed_recording(runtime: ProbeRuntime, info: TargetInfo, add: Callable[[str, dict], None],
                     offset: int, skip_late: tuple[str, ...] = ()
                     ) -> Callable[..., None] | None:
    """The eager sampling of a compiled probe that compares before it extracts.

    Returns ``record_call(instance, args, kwargs, result, build, cap=None)``: when the
    call is captured (``cap``, else ``graphs.capturing()`` now) its fields
    (``build()``) are recorded; else the probe's key (paths.FieldsProgram.bind_key:
    raw shapes, dtypes and scalars in one tuple, no pointers of eager records, no
    dict) goes to the run-length sampler, and ``build()`` runs only for a record that
    is kept. Records and runs are the same as _recording's; a sampled-away call costs
    the key, not the extraction. None where this does not apply (sampling off, fields
    not generated): _recording's path is used.

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
    key_of = bind_key(info.positions, info.defaults, offset, skip=tuple(skip))
    if key_of is None:
        return None
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
        layer, key = key_of(instance, args, kwargs, result)
        if stepping and (aside.trail is not None or aside.step != step.value):
            seen(key)       # else: a step it is not judging (no step marks, or asleep)
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
        n = keep(state, key, layer, target)
        if n:
            fields = build(instance, args, kwargs, result)
            if has_layer:
                fields["layer"] = fields.pop("layer", None)
            fields["repeat"] = n
            add(kind, fields)

    record_call.aside = aside           # type: ignore[attr-defined]
    return record_call


def _is_method(info: TargetInfo) -> bool:
    """A plain function stored on a class (not __new__): called with self/cls first."""
    return isinstance(info.owner, type) and info.attr != "__new__"


def _around_handler(runtime: ProbeRuntime, info: TargetInfo, before: Any, after: Any,
                    view: CallView, call: Callable, args: tuple, kwargs: dict) -> Any:
    """Run a handler's before/after around one call; a failing handler is disabled and
    the call goes on (shared by the plain-function and the wrapt patches)."""
    token = None
    try:
        if before is not None:
            token = before(view, info)
    except Exception as exc:
        runtime.fail(info.target, exc)
        return call(*args, **kwargs)
    try:
        result = call(*args, **kwargs)
    except BaseException as error:
        if after is not None and not runtime.disabled:
            try:
                after(view, info, token, None, error)
            except Exception as exc:
                runtime.fail(info.target, exc)
        raise
    if after is not None and not runtime.disabled:
        try:
            after(view, info, token, result, None)
        except Exception as exc:
            runtime.fail(info.target, exc)
    return result


def _make_function(runtime: ProbeRuntime, info: TargetInfo) -> Callable:
    """The replacement of a plain Python function or method: a plain function too.

    A wrapt FunctionWrapper costs ~0.45 us per call on its own (binding object, the
    wrapper's four-argument call); a plain function stored on the class binds as the
    original did and costs ~0.08 us. Classmethods, staticmethods and other callables
    keep the wrapt wrapper (_make_wrapper).
    """
    spec = runtime.spec
    when, target = spec.when, info.target
    handler = runtime.handler
    original = info.raw
    method = _is_method(info)
    extract, extract_view = _extractors(spec, info, 1 if method else 0)
    positions, defaults = info.positions, info.defaults
    bound = (spec, extract_view)
    add = _emitter(spec)
    state = STATE
    local = runtime.local
    keyed = (_keyed_recording(runtime, info, add, 1 if method else 0)
             if handler is None and when != "both" else None)
    note = (_recording(runtime, info, add)
            if handler is None and keyed is None and when == "call" else None)

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
            return _around_handler(runtime, info, before, after, view, original, args, kwargs)

        return _like(handler_probe, original)

    if when == "call" and keyed is not None:
        aside = keyed.aside
        step = graphs.STEP

        def keyed_call_probe(*args: Any, **kwargs: Any) -> Any:
            if aside.asleep == step.value:      # stepped aside for the rest of this step
                aside.unseen += 1
                return original(*args, **kwargs)
            if runtime.disabled or not state.active or local.inside:
                return original(*args, **kwargs)
            runtime.hits += 1
            try:
                keyed((args[0] if args else None) if method else None, args, kwargs, None,
                      extract)
            except Exception as exc:
                runtime.fail(target, exc)
            local.inside = True
            try:
                return original(*args, **kwargs) if kwargs else original(*args)
            finally:
                local.inside = False

        return _taking_off(_like(keyed_call_probe, original), aside, info)

    if when == "call" and method:
        def call_probe_method(*args: Any, **kwargs: Any) -> Any:
            if runtime.disabled or not state.active or local.inside:
                return original(*args, **kwargs)
            runtime.hits += 1
            try:
                note(extract(args[0] if args else None, args, kwargs, None))
            except Exception as exc:
                runtime.fail(target, exc)
            local.inside = True
            try:
                return original(*args, **kwargs) if kwargs else original(*args)
            finally:
                local.inside = False

        return _like(call_probe_method, original)

    if when == "call":
        def call_probe(*args: Any, **kwargs: Any) -> Any:
            if runtime.disabled or not state.active or local.inside:
                return original(*args, **kwargs)
            runtime.hits += 1
            try:
                note(extract(None, args, kwargs, None))
            except Exception as exc:
                runtime.fail(target, exc)
            local.inside = True
            try:
                return original(*args, **kwargs) if kwargs else original(*args)
            finally:
                local.inside = False

        return _like(call_probe, original)

    around = _recorder_around(runtime, info, extract, note, 1 if method else 0, add, keyed)
    aside = getattr(around, "aside", None) or sampling.Awake()
    step = graphs.STEP

    def return_probe(*args: Any, **kwargs: Any) -> Any:
        if aside.asleep == step.value:          # stepped aside for the rest of this step
            aside.unseen += 1
            return original(*args, **kwargs)
        if runtime.disabled or not state.active or local.inside:
            return original(*args, **kwargs)
        runtime.hits += 1
        local.inside = True
        try:
            return around(original, (args[0] if args else None) if method else None,
                          args, kwargs)
        finally:
            local.inside = False

    return _taking_off(_like(return_probe, original), aside, info)


def _taking_off(replacement: Callable, aside: Any, info: TargetInfo) -> Callable:
    """The replacement, which its step-aside may take off its owner (sampling)."""
    sampling.may_take_off(aside, info.owner, info.attr, replacement, info.raw)
    return replacement


def _like(replacement: Callable, original: Callable) -> Callable:
    """Give the replacement the original's name, doc and signature (__wrapped__)."""
    functools.update_wrapper(replacement, original)
    return replacement


def _recorder_around(runtime: ProbeRuntime, info: TargetInfo, extract: Callable[..., dict],
                     note: Callable[[dict], None] | None, offset: int,
                     add: Callable[[str, dict], None], keyed: Callable[..., None] | None
                     ) -> Callable:
    """Run the call and record its fields once it returned (when = return | both).

    ``keyed`` (when = return) is _keyed_recording's path; for when = both it is made
    here, where the fields read after the call are known; ``note`` is _recording's
    path where neither applies."""
    target = info.target
    both = runtime.spec.when == "both"
    program = runtime.spec.extract
    entries = dict(getattr(program, "entries", None) or ())
    names = list(entries) if entries else (
        program.names() if hasattr(program, "names") else [])
    # when = both: the capture state is taken at call time (the call may change it).
    early_capturing = both and "capturing" in names
    early_gid = both and "gid" in names
    capturing, current_gid = graphs.capturing, graphs.current_gid
    cap_fn = entries.get("capturing") == ("call0", "capturing")
    gid_fn = entries.get("gid") == ("call0", "gid")
    late = extract
    if both and cap_fn and gid_fn and hasattr(program, "bind"):
        # The fields read after the call, without the capture state read before it.
        late = program.bind(info.positions, info.defaults, offset, last="layer",
                            skip=("capturing", "gid"))
    if both:
        keyed = (_keyed_recording(runtime, info, add, offset, skip_late=("capturing", "gid"))
                 if late is not extract else None)
    if keyed is not None:
        around_keyed = _keyed_around(runtime, target, late, keyed, both, capturing, current_gid)
        around_keyed.aside = keyed.aside        # type: ignore[attr-defined]
        return around_keyed
    if note is None:
        note = _recording(runtime, info, add)

    def around(call: Callable, instance: Any, args: tuple, kwargs: dict) -> Any:
        early = None
        if both:
            try:
                if late is not extract:
                    early = {"capturing": capturing(), "gid": current_gid()}
                elif (early_capturing and not cap_fn) or (early_gid and not gid_fn):
                    early = extract(instance, args, kwargs, None)
                else:
                    early = {}
                    if early_capturing:
                        early["capturing"] = capturing()
                    if early_gid:
                        early["gid"] = current_gid()
            except Exception as exc:
                runtime.fail(target, exc)
                return call(*args, **kwargs)
        result = call(*args, **kwargs)
        if not runtime.disabled:
            try:
                fields = late(instance, args, kwargs, result)
                if early:
                    if "capturing" in early:
                        fields["capturing"] = early["capturing"]
                    if "gid" in early:
                        fields["gid"] = early["gid"]
                note(fields)
            except Exception as exc:
                runtime.fail(target, exc)
        return result

    return around


def _keyed_around(runtime: ProbeRuntime, target: str, late: Callable[..., dict],
                  keyed: Callable[..., None], both: bool, capturing: Callable[[], bool],
                  current_gid: Callable[[], Any]) -> Callable:
    """_recorder_around's call with _keyed_recording: for when = both, the capture state
    is read before the call and set on the fields read after it."""
    if not both:
        def around_return(call: Callable, instance: Any, args: tuple, kwargs: dict) -> Any:
            result = call(*args, **kwargs)
            if not runtime.disabled:
                try:
                    keyed(instance, args, kwargs, result, late)
                except Exception as exc:
                    runtime.fail(target, exc)
            return result

        return around_return

    def around_both(call: Callable, instance: Any, args: tuple, kwargs: dict) -> Any:
        try:
            cap, gid = capturing(), current_gid()
        except Exception as exc:
            runtime.fail(target, exc)
            return call(*args, **kwargs)
        result = call(*args, **kwargs)
        if not runtime.disabled:
            def build(instance: Any, args: tuple, kwargs: dict, result: Any) -> dict:
                fields = late(instance, args, kwargs, result)
                fields["capturing"] = cap
                fields["gid"] = gid
                return fields

            try:
                keyed(instance, args, kwargs, result, build, cap)
            except Exception as exc:
                runtime.fail(target, exc)
        return result

    return around_both


def _make_wrapper(runtime: ProbeRuntime, info: TargetInfo) -> Callable:
    """The wrapt wrapper (classmethods, staticmethods, other callables): same behaviour."""
    spec = runtime.spec
    when = spec.when
    target = info.target
    handler = runtime.handler
    positions, defaults = info.positions, info.defaults
    extract, _ = _extractors(spec, info, 0)
    bound = (spec, extract)
    add = _emitter(spec)
    state = STATE
    keyed = (_keyed_recording(runtime, info, add, 0)
             if handler is None and when != "both" else None)
    note = (_recording(runtime, info, add)
            if handler is None and keyed is None and when == "call" else None)

    if handler is not None:
        before = getattr(handler, "before", None)
        after = getattr(handler, "after", None)

        def handler_wrapper(wrapped, instance, args, kwargs):
            if runtime.disabled or not state.active:
                return wrapped(*args, **kwargs)
            runtime.hits += 1
            view = CallView(instance, args, kwargs, positions, defaults, None, bound)
            return _around_handler(runtime, info, before, after, view, wrapped, args, kwargs)

        return handler_wrapper

    local = runtime.local

    step = graphs.STEP
    if when == "call":
        aside = keyed.aside if keyed is not None else sampling.Awake()

        def call_wrapper(wrapped, instance, args, kwargs):
            if aside.asleep == step.value:      # stepped aside for the rest of this step
                aside.unseen += 1
                return wrapped(*args, **kwargs)
            if runtime.disabled or not state.active or local.inside:
                return wrapped(*args, **kwargs)
            runtime.hits += 1
            try:
                if keyed is not None:
                    keyed(instance, args, kwargs, None, extract)
                else:
                    note(extract(instance, args, kwargs, None))
            except Exception as exc:
                runtime.fail(target, exc)
            local.inside = True
            try:
                return wrapped(*args, **kwargs)
            finally:
                local.inside = False

        return call_wrapper

    around = _recorder_around(runtime, info, extract, note, 0, add, keyed)
    aside_after = getattr(around, "aside", None) or sampling.Awake()

    def return_wrapper(wrapped, instance, args, kwargs):
        if aside_after.asleep == step.value:    # stepped aside for the rest of this step
            aside_after.unseen += 1
            return wrapped(*args, **kwargs)
        if runtime.disabled or not state.active or local.inside:
            return wrapped(*args, **kwargs)
        runtime.hits += 1
        local.inside = True
        try:
            return around(wrapped, instance, args, kwargs)
        finally:
            local.inside = False

    return return_wrapper


@dataclass
class Engine:
    """The set of installed packs and the patches they made."""

    packs: list[Pack] = field(default_factory=list)
    runtimes: list[ProbeRuntime] = field(default_factory=list)
    patches: list[Patch] = field(default_factory=list)
    # pack files that did not load at all: path -> 'file:line: reason' (probe.__init__)
    failed_packs: dict[str, str] = field(default_factory=dict)
    user_packs: list[str] = field(default_factory=list)   # given with --probes (MLATRACE_PROBES)
    # targets whose module was imported (their hook ran): the rest were never imported
    imported: set[str] = field(default_factory=set)
    lock: threading.RLock = field(default_factory=threading.RLock)
    generation: int = 0

    def install(self, packs: list[Pack]) -> None:
        """Register every probe's targets for lazy patching."""
        with self.lock:
            STATE.generation += 1
            self.generation = STATE.generation
            STATE.active = True
            record.add_close_hook(sampling.close_all)
            self.packs = list(packs)
            by_module: dict[str, list[tuple[ProbeRuntime, str]]] = {}
            for pack in packs:
                for spec in pack.probes:
                    runtime = ProbeRuntime(spec)
                    self.runtimes.append(runtime)
                    try:
                        runtime.handler = _load_handler(spec)
                    except Exception as exc:  # this probe only: the others still install
                        runtime.disabled = True
                        error = (str(exc) if isinstance(exc, HandlerError)
                                 else f"{spec.source}: handler {spec.handler!r}: "
                                      f"{type(exc).__name__}: {exc}")
                        runtime.report(spec.handler or spec.qualname, error, "load")
                        runtime.skipped.update({t: f"load: {error}" for t in spec.targets})
                        continue
                    for target in spec.targets:
                        module, _ = split_target(target)
                        by_module.setdefault(module, []).append((runtime, target))
            for module_name, entries in by_module.items():
                try:
                    hook = self._hook_for(entries, self.generation)
                    if module_name in sys.modules:
                        hook(sys.modules[module_name])
                    else:
                        wrapt.register_post_import_hook(hook, module_name)
                except Exception as exc:
                    for runtime, target in entries:
                        runtime.report(target, f"cannot hook {module_name}: "
                                       f"{type(exc).__name__}: {exc}", "patch")

    def _hook_for(self, entries: list[tuple[ProbeRuntime, str]], generation: int
                  ) -> Callable[[Any], None]:
        def on_import(module: Any) -> None:
            if generation != STATE.generation or not STATE.active:
                return  # registered by an installation since undone
            for runtime, target in entries:
                self.imported.add(target)
                try:  # a hook that raised would fail the traced program's import
                    self.patch(runtime, target, module)
                except Exception as exc:
                    runtime.report(target, f"cannot patch: {type(exc).__name__}: {exc}",
                                   "patch")

        return on_import

    def patch(self, runtime: ProbeRuntime, target: str, module: Any) -> None:
        """Patch one target of one probe in an imported module (never raises)."""
        with self.lock:
            try:
                info = resolve(target, module, runtime.spec.params, runtime.spec.arg_names,
                               runtime.spec.inherited)
            except InheritedError as exc:
                runtime.skipped[target] = f"inherited: {exc}"
                return
            except Drift as exc:
                runtime.skipped[target] = f"drift: {exc}"
                runtime.report(target, f"signature drift: {exc}", "drift")
                return
            except LookupError as exc:
                runtime.skipped[target] = f"missing: {exc}"
                runtime.report(target, f"target missing: {exc}", "missing")
                return
            except Exception as exc:
                runtime.skipped[target] = f"patch: {exc}"
                runtime.report(target, f"cannot resolve: {type(exc).__name__}: {exc}", "patch")
                return
            carried = getattr(info.raw, MARK, None) or ()
            if runtime.spec.qualname in carried:
                return  # the same function reached through another module: already patched
            try:
                make = getattr(runtime.handler, "replacement", None)
                if make is not None:
                    replacement = make(info, runtime)
                else:
                    runtime.counted = True
                    if type(info.raw) is types.FunctionType:
                        replacement = _make_function(runtime, info)
                    else:
                        replacement = wrapt.FunctionWrapper(info.raw,
                                                            _make_wrapper(runtime, info))
                    setattr(replacement, MARK, tuple(carried) + (runtime.spec.qualname,))
                inherited_attr = (isinstance(info.owner, type)
                                  and info.attr not in info.owner.__dict__)
                setattr(info.owner, info.attr, replacement)
            except Exception as exc:
                runtime.skipped[target] = f"patch: {exc}"
                runtime.report(target, f"cannot patch: {type(exc).__name__}: {exc}", "patch")
                return
            self.patches.append(Patch(info.owner, info.attr, info.raw, replacement, target,
                                      inherited=inherited_attr))
            runtime.patched.append(target)

    def coverage(self) -> dict[str, Any]:
        """What this process's probes covered, for ``process.end`` (schema in
        docs/trace-format.md, "Coverage"). Takes no lock: it may run in a signal handler."""
        probes: dict[str, dict[str, Any]] = {}
        packs: dict[str, dict[str, int]] = {}
        modules: set[str] = set()
        imported = self.imported
        for runtime in list(self.runtimes):
            spec = runtime.spec
            patched = list(runtime.patched)
            skipped = dict(runtime.skipped)
            not_imported = [t for t in spec.targets
                            if t not in imported and t not in skipped and t not in patched]
            entry: dict[str, Any] = {"patched": patched}
            if not_imported:
                entry["not_imported"] = len(not_imported)
                modules.update(split_target(t)[0] for t in not_imported)
            if skipped:
                entry["skipped"] = skipped
            if runtime.errors:
                entry["errors"] = len(runtime.errors)   # each one is a probe.error record
            entry["hits"] = runtime.hits if runtime.counted or not patched else None
            if runtime.disabled:
                entry["disabled"] = True
            probes[spec.qualname] = entry
            totals = packs.setdefault(spec.pack, {"probes": 0, "attached": 0, "errors": 0})
            totals["probes"] += 1
            totals["attached"] += bool(patched)
            totals["errors"] += len(runtime.errors)
        return {"packs": packs, "failed_packs": dict(self.failed_packs), "probes": probes,
                "not_imported_modules": sorted(modules), "user_packs": list(self.user_packs)}

    def forked(self) -> None:
        """In a forked child: the patches are inherited, hits and errors start again (the
        parent's probe.error records are in the parent's file)."""
        for runtime in self.runtimes:
            runtime.hits = 0
            runtime.errors = []

    def uninstall(self) -> None:
        """Undo every patch (newest first) and turn remaining wrappers into pass-throughs."""
        with self.lock:
            STATE.active = False
            STATE.generation += 1
            graphs.forget_taken_off()       # a later step must not put a wrapper back
            try:
                sampling.close_all()
            except Exception:
                pass
            for patch in reversed(self.patches):
                try:
                    current = (patch.owner.__dict__.get(patch.attr)
                               if isinstance(patch.owner, type)
                               else getattr(patch.owner, patch.attr, None))
                    if current is patch.replacement:
                        if patch.inherited:
                            delattr(patch.owner, patch.attr)  # inherit it again
                        else:
                            setattr(patch.owner, patch.attr, patch.original)
                except Exception:
                    pass
            for runtime in self.runtimes:
                sampling.forget(runtime.samplers)
                close = getattr(runtime.handler, "close", None)
                if close is not None:
                    try:
                        close()
                    except Exception:
                        pass
            self.patches.clear()
            self.runtimes.clear()
            self.packs = []


class HandlerError(Exception):
    """A probe's handler that cannot be resolved; str() is 'file:line: handler ...: why'."""


def _load_handler(spec: ProbeSpec) -> Any:
    """Instantiate a probe's handler ``module:Name`` with (spec).

    The pack loader has resolved it already (spec.handler_factory / handler_error); a
    spec built by hand is resolved here. Raises HandlerError or whatever the factory raises.
    """
    if not spec.handler:
        return None
    factory, error = spec.handler_factory, spec.handler_error
    if factory is None and error is None:
        factory, error = resolve_handler(spec.handler, spec.source)
    if error is not None:
        raise HandlerError(error)
    return factory(spec)
