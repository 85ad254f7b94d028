"""Run-length sampling of identical eager records (probed calls and kernel launches).

A decode loop makes the same eager call on every layer of every step: the same shapes,
hints, split and grid, only the layer differs. Each probe keeps, per thread, the last
record it kept (all fields but `layer`) and how many identical ones followed it: the
first N of a run are recorded (each with `repeat`, its place in the run), the rest are
only counted, and the run's end is written as one `sample.run` record with the run's
exact length and the layers it covered. A run ends when a record differs (any change of
shape, hint, split, grid, ... starts a new run, recorded), when a capture
begins on any thread (`graphs.EPOCH`), or when the process ends. Records made while
capturing are never sampled. `process.end` counts every kind exactly (record.counts).

N is MLATRACE_SAMPLE (default 1, `mlatrace run --sample N`); 0 keeps every record.

Stepping aside (StepAside): even a call that is only counted runs its wrapper and its
key, a few microseconds on a busy host, and an eager decode step makes a hundred such
calls (every layer's attention call, split choice and kernel launches). So a probe
whose steps have become steady looks at the first call of each step only, and passes
the rest of that step straight through, uninspected. A step begins with a step-marking
call (`graphs.STEP_KINDS`: a forward's attention metadata, the runner's dispatch) or
a capture begin. A probe's step is steady when the calls after its first repeat the
previous step's (each compared with the step's first call: the layers of one step
make the same call, whatever hint advanced since the last step; a sequence of graph
replays repeats its graph ids). After SETTLE steady steps in a row the probe steps
aside; every VERIFY-th step it looks at the whole step again, and any difference
keeps it looking until it has been steady for SETTLE steps again. So a change that
lasts a step is seen at once if it touches the step's first call, and within VERIFY
steps otherwise; captured calls are always seen (a capture begin moves the step);
the calls not inspected are counted per probe (`process.end` `unseen`), except where
callers look the wrapper up at every call (on its class or module, or in a module that
imported it by name; Triton's `run`): it is taken off for the rest of the step, so those
calls cost nothing and are not counted (`steps_off`: how many steps). Without step-marking
calls nothing steps aside.

An asleep probe still looks at the first call of every step, and that look costs one
Python function entry: the probe's wrapper, which computes the key, the step-aside and
the run in its own frame (recording.keyed_lines) and takes itself off there. It is not
kept off across steps: what a first call shows (a new hint, a split or grid that
follows the lengths) would then wait for the next whole-step look, and nothing else
can say when to look sooner (a step-marking call's lengths move every decode step). MLATRACE_STEP_ASIDE="SETTLE,VERIFY" (default
"8,64", `mlatrace run --step-aside`); 0 turns it off.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

from mlatrace import record, settings
from mlatrace.probe import graphs
from mlatrace.probe.paths import NO_LAYER

MAX_LAYERS = 64
# Fields a run does not compare: the layer (recorded in sample.run) and, except for
# attn.metadata (MLT003 compares its pointers with those a graph captured), the pointers
# of eager records, which no rule reads (a fresh output buffer per layer is usual).
VOLATILE_POINTERS = "ptrs"
POINTERS_COMPARED = frozenset(("attn.metadata",))
_samplers: list[Sampler] = []
_lock = threading.Lock()


class ThreadRuns(threading.local):
    """Per thread: the current run of one probe target (class default: no AttributeError)."""

    run: RunState | None = None


def ignored_fields(kind: str, fields: dict) -> tuple[str, ...]:
    """Top-level fields other than `layer` that a run of `kind` does not compare."""
    if VOLATILE_POINTERS in fields and kind not in POINTERS_COMPARED:
        return (VOLATILE_POINTERS,)
    return ()


class RunState:
    """One thread's current run of one probe (or of one kernel's launches)."""

    __slots__ = ("last", "run", "epoch", "layers", "tid")

    def __init__(self) -> None:
        self.last: Any = None
        self.run = 0
        self.epoch = -1
        self.layers: dict | None = None
        self.tid = 0


class Sampler:
    """The sampling of one probe's eager records: keep the first `limit` of each run."""

    def __init__(self, probe: str, kind: str, limit: int) -> None:
        self.probe = probe
        self.kind = kind
        self.limit = limit
        self.open: dict[int, tuple[RunState, str]] = {}  # runs with records left out
        self.sampled = 0            # records left out, handed to the recorder at close
        with _lock:
            _samplers.append(self)

    def keep(self, state: RunState, key: Any, layer: Any = NO_LAYER, name: str = "") -> int:
        """The record's place in its run (1, 2, ...) when it is to be recorded; 0 when
        it only counts. `key` is what must match (a record's fields without `layer`);
        it is kept as given, so the caller must not change it afterwards."""
        epoch = graphs.EPOCH.value
        if state.epoch == epoch and key == state.last and state.last is not None:
            n = state.run = state.run + 1
            if layer is not NO_LAYER:
                layers = state.layers
                if layers is None:
                    layers = state.layers = {}
                if len(layers) < MAX_LAYERS:
                    layers[layer] = None
            if n <= self.limit:
                return n
            if n == self.limit + 1:
                state.tid = threading.get_ident()     # the run's thread: this one
                self.open[id(state)] = (state, name)
            self.sampled += 1
            return 0
        if state.run > self.limit:
            self.close(state, name)
        state.last = key
        state.run = 1
        state.epoch = epoch
        state.layers = None if layer is NO_LAYER else {layer: None}
        return 1

    def close(self, state: RunState, name: str = "") -> None:
        """Write the end of a run that left records out (`sample.run`)."""
        self.open.pop(id(state), None)
        if state.run <= self.limit:
            return
        fields: dict[str, Any] = {"probe": self.probe, "of": self.kind, "repeat": state.run,
                                  "sampled": state.run - self.limit, "thread": state.tid}
        if name:
            fields["name"] = name
        if state.layers:
            fields["layers"] = [layer if layer is None or isinstance(layer, (int, str))
                                else str(layer) for layer in state.layers]
        state.run = 0
        state.last = None
        record.emit_fields("sample.run", fields)


SAME = object()       # in a step's trail: this call equals the step's first
MAX_TRAIL = 4096      # a step longer than this is never judged steady (no steps marked?)
NEVER = -1            # StepAside.asleep of a probe that never steps aside
_asides: list[StepAside] = []


class StepAside:
    """Whether one probe target looks at the rest of the current step (module doc).

    Wrappers read ``asleep`` first: while it equals ``graphs.STEP.value`` the call is
    passed straight through and counted in ``unseen``; else the call is inspected and,
    when eager, handed to ``seen(key)``.
    """

    __slots__ = ("probe", "settle", "verify", "asleep", "unseen", "step", "first",
                 "trail", "last_trail", "steady", "countdown", "take_off", "steps_off",
                 "sites")

    def __init__(self, probe: str, settle: int, verify: int) -> None:
        self.probe = probe
        self.settle = settle
        self.verify = verify
        self.asleep = NEVER       # the step whose remaining calls pass uninspected
        self.unseen = 0
        self.step = NEVER         # the step of the last inspected call
        self.first: Any = None    # that step's first key
        self.trail: list | None = None   # its later keys (SAME: equal to the first)
        self.last_trail: list | None = None
        self.steady = 0           # steady steps in a row
        self.countdown = verify   # steps until the next whole step is looked at
        # (owner, attr, wrapper, original) of a wrapper that callers look up on its owner
        # (a class's method, a module's function, Triton's JITFunction.run): asleep, it is
        # taken off until the next step, there and wherever a module imported it under
        # its name (`sites`, found at the first take-off), so the step's later calls cost
        # nothing and are not counted (steps_off says how often). Callers holding it some
        # other way still reach the wrapper, which counts their calls (unseen).
        self.take_off: tuple | None = None
        self.steps_off = 0
        self.sites: list[tuple[Any, str]] | None = None
        with _lock:
            _asides.append(self)

    def seen(self, key: Any) -> None:
        """An inspected eager call with this key: sleep for the rest of its step?"""
        step = graphs.STEP.value
        trail = self.trail
        if step == self.step:
            if trail is not None:
                if len(trail) < MAX_TRAIL:
                    trail.append(SAME if key == self.first else key)
                else:
                    self.trail = self.last_trail = None
                    self.steady = 0
            return
        if trail is not None:     # the whole last step was looked at: judge it
            if trail == self.last_trail:
                self.steady += 1
            else:
                self.steady = 0
                self.last_trail = trail
        self.step = step
        self.first = key
        self.countdown -= 1
        if self.steady >= self.settle and self.countdown > 0:
            self.asleep = step
            self.trail = None
            if self.take_off is not None:
                self.take_off_now()
        else:
            if self.countdown <= 0:
                self.countdown = self.verify
            self.trail = []

    def take_off_now(self) -> None:
        """Take the wrapper off its sites for the rest of this step (graphs.take_off_wrapper
        for each, inline)."""
        owner, attr, wrapper, original = self.take_off
        sites = self.sites
        if sites is None:
            sites = self.sites = [(owner, attr), *imported_as(attr, wrapper, owner)]
        off = False
        taken_off = graphs._taken_off
        for site, name in sites:
            if site.__dict__.get(name) is wrapper:
                setattr(site, name, original)
                taken_off.append((site, name, wrapper, original))
                off = True
        if off:
            self.steps_off += 1


def may_take_off(aside: StepAside | Awake, owner: Any, attr: str, wrapper: Any,
                 original: Any) -> None:
    """Let a stepped-aside probe take `wrapper` off `owner` (a class or module) for the
    rest of a step (StepAside.take_off): the step's later calls then run `original` with
    no wrapper at all, instead of a wrapper that passes them through."""
    if isinstance(aside, StepAside) and hasattr(owner, "__dict__"):
        aside.take_off = (owner, attr, wrapper, original)


def imported_as(attr: str, wrapper: Any, owner: Any) -> list[tuple[Any, str]]:
    """The modules other than `owner` that hold `wrapper` as `attr` (`from m import f`
    after the patch): one dict lookup per loaded module, once per probe target."""
    found = []
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if module is not owner and type(namespace) is dict \
                and namespace.get(attr) is wrapper:
            found.append((module, attr))
    return found


class Awake:
    """The StepAside of a probe that never steps aside (no settings, or not eligible)."""

    __slots__ = ("asleep", "unseen")

    def __init__(self) -> None:
        self.asleep = NEVER
        self.unseen = 0

    def seen(self, key: Any) -> None:
        pass


def stop_stepping_aside() -> None:
    """A step-marking probe failed: steps may never advance again, so no probe may stay
    asleep (it would be blind for the rest of the process). Every probe looks at every
    call from now on, and the wrappers taken off are put back."""
    with _lock:
        asides = list(_asides)
    for aside in asides:
        aside.settle = 1 << 62
        aside.asleep = NEVER
    graphs.put_back_wrappers()


def step_aside_for(probe: str, kind: str | None = None) -> StepAside | Awake:
    """The StepAside of one probe target, per MLATRACE_STEP_ASIDE; Awake when off or
    when the probe marks steps itself (it must see every call to advance them)."""
    config = settings.current().step_aside
    if not config or kind in graphs.STEP_KINDS:
        return Awake()
    return StepAside(probe, *config)


def unseen_counts() -> dict[str, int]:
    """Calls not inspected per probe, summed over its targets (for process.end)."""
    return _summed("unseen")


def steps_off_counts() -> dict[str, int]:
    """Steps per probe whose later calls ran with the wrapper taken off (uncounted)."""
    return _summed("steps_off")


def _summed(name: str) -> dict[str, int]:
    with _lock:
        asides = list(_asides)
    counts: dict[str, int] = {}
    for aside in asides:
        value = getattr(aside, name)
        if value:
            counts[aside.probe] = counts.get(aside.probe, 0) + value
    return dict(sorted(counts.items()))


def forget_asides() -> tuple[dict[str, int], dict[str, int]]:
    """Drop every StepAside (the probes are uninstalled: Engine.uninstall forgets the
    wrappers taken off); their unseen and steps-off counts, returned."""
    counts = unseen_counts(), steps_off_counts()
    with _lock:
        _asides.clear()
    return counts


def close_all() -> None:
    """End every open run and hand the counts of what was left out to the recorder
    (the process ends, or the probes are uninstalled)."""
    with _lock:
        samplers = list(_samplers)
    for sampler in samplers:
        for state, name in list(sampler.open.values()):
            sampler.close(state, name)
        if sampler.sampled:
            record.count_sampled(sampler.kind, sampler.sampled)
            sampler.sampled = 0


def forget(samplers: list[Sampler]) -> None:
    """Drop samplers of an uninstalled engine (after close_all)."""
    with _lock:
        for sampler in samplers:
            if sampler in _samplers:
                _samplers.remove(sampler)


def _forget_in_forked_child() -> None:
    """A forked child has its own trace: its counts and runs start afresh."""
    for sampler in _samplers:
        for state, _ in sampler.open.values():
            state.run = 0
            state.last = None
        sampler.open.clear()
        sampler.sampled = 0
    for aside in _asides:
        aside.unseen = aside.steps_off = 0


os.register_at_fork(after_in_child=_forget_in_forked_child)


def limit() -> int:
    """N of MLATRACE_SAMPLE (0: sampling off)."""
    return settings.current().sample
