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
"""

from __future__ import annotations

import os
import threading
from typing import Any

from mlatrace import record
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


os.register_at_fork(after_in_child=_forget_in_forked_child)


def limit() -> int:
    """N of MLATRACE_SAMPLE (0: sampling off)."""
    return int(record.settings().get("sample") or 0)
