"""Graph ids and the per-thread capture stack shared by every probe.

A capture (torch.cuda.CUDAGraph, vLLM's wrapper, the reference host graph) pushes
its gid while it records; launches and calls made meanwhile carry the innermost
gid, and a nested capture names the enclosing one as its parent. Everything here
is pure Python: asking "are we capturing?" costs no CUDA call and never syncs.
"""

from __future__ import annotations

import itertools
import threading

from mlatrace import kinds

_gid_counter = itertools.count(1)


class _ThreadState(threading.local):
    """This thread's capture state. The class defaults let a thread that never captured
    read None/0 without an AttributeError: a getattr() miss on a threading.local costs
    ~0.3 us, paid by capturing()/current_gid() on every probed call of such a thread
    (vLLM's eager mode)."""

    stack = None
    sources = None
    dummy = 0
    layers = None


_local = _ThreadState()


class _Epoch:
    """Counts capture begins on any thread: eager sampling runs end at each (sampling)."""

    value = 0


EPOCH = _Epoch()


class _Step:
    """Counts the steps of the traced program: a step-marking probe's call (a forward's
    attention metadata, the runner's dispatch) and every capture begin advance it.
    Probes that step aside in steady steps (sampling.StepAside) sleep until it moves."""

    value = 0


STEP = _Step()
# Record kinds whose calls begin a step (once per forward pass in every backend).
STEP_KINDS = kinds.STEP


# Wrappers a stepped-aside probe took off for the rest of a step (owner, attr, wrapper,
# original): the next step puts them back (sampling.StepAside).
_taken_off: list[tuple] = []


def next_step() -> None:
    """A new step begins: probes stepped aside for the last one look again (the
    wrappers taken off are put back). The hot step markers run these lines in their own
    frame (recording.keyed_lines, the vLLM dispatch handler)."""
    STEP.value += 1
    if _taken_off:
        put_back_wrappers()


def take_off_wrapper(owner: object, attr: str, wrapper: object, original: object) -> bool:
    """Put `original` back on `owner` for the rest of this step (no wrapper, no cost per
    call) if `wrapper` is what `owner` holds now; the next step puts the wrapper back."""
    if owner.__dict__.get(attr) is not wrapper:
        return False
    setattr(owner, attr, original)
    _taken_off.append((owner, attr, wrapper, original))
    return True


def put_back_wrappers() -> None:
    """Put back every wrapper taken off, unless something else replaced the attribute."""
    while _taken_off:
        try:
            owner, attr, wrapper, original = _taken_off.pop()
        except IndexError:      # another thread's step emptied it meanwhile
            return
        if owner.__dict__.get(attr) is original:
            setattr(owner, attr, wrapper)


def forget_taken_off() -> None:
    """The probes are uninstalled: nothing is put back."""
    _taken_off.clear()


def next_gid() -> int:
    """A process-unique, small graph id (1, 2, 3, ...)."""
    return next(_gid_counter)


def _stack() -> list[int]:
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


def push_capture(gid: int, src: str | None = None) -> None:
    """Enter a capture on this thread (src: who captures, e.g. torch, vllm)."""
    EPOCH.value += 1
    next_step()
    _stack().append(gid)
    if src is not None:
        _sources()[gid] = src


def _sources() -> dict[int, str]:
    sources = getattr(_local, "sources", None)
    if sources is None:
        sources = _local.sources = {}
    return sources


def enclosing_gid(skip_srcs: tuple[str, ...] = ("torch",)) -> int | None:
    """The innermost open capture on this thread not made by skip_srcs (eager-break owner)."""
    sources = getattr(_local, "sources", None) or {}
    for gid in reversed(getattr(_local, "stack", None) or []):
        if gid is not None and sources.get(gid) not in skip_srcs:
            return gid
    return None


def remove_capture(gid: int) -> None:
    """Drop gid from this thread's stack wherever it is (segments end out of order)."""
    stack = _stack()
    for index in range(len(stack) - 1, -1, -1):
        if stack[index] == gid:
            del stack[index]
            break
    _sources().pop(gid, None)


def push_eager() -> None:
    """Run eagerly inside a capture (a breakable capture's eager break): not capturing."""
    _stack().append(None)


def pop_eager() -> None:
    """End the innermost eager break (captures begun inside it may sit above it)."""
    stack = _stack()
    for index in range(len(stack) - 1, -1, -1):
        if stack[index] is None:
            del stack[index]
            break


def current_gid() -> int | None:
    """The innermost capturing gid on this thread, or None (none, or an eager break)."""
    stack = getattr(_local, "stack", None)
    return stack[-1] if stack else None


def parent_gid() -> int | None:
    """The innermost open capture, looking through eager breaks (a new capture's parent)."""
    for gid in reversed(getattr(_local, "stack", None) or []):
        if gid is not None:
            return gid
    return None


def capturing() -> bool:
    """True while this thread is inside a capture and not in an eager break."""
    stack = getattr(_local, "stack", None)
    return bool(stack) and stack[-1] is not None


def reset() -> None:
    """Forget this thread's captures (tests, fork children)."""
    _local.stack = []
    _local.sources = {}
    _local.dummy = 0


def enter_dummy_run() -> None:
    """A runner's dummy run starts on this thread (metadata built now is dummy)."""
    _local.dummy = getattr(_local, "dummy", 0) + 1


def exit_dummy_run() -> None:
    _local.dummy = max(0, getattr(_local, "dummy", 0) - 1)


def in_dummy_run() -> bool:
    """True inside a probed dummy run (vLLM's _dummy_run) on this thread."""
    return getattr(_local, "dummy", 0) > 0


def enter_layer(layer: object) -> None:
    """An attention forward for `layer` starts on this thread."""
    layers = getattr(_local, "layers", None)
    if layers is None:
        layers = _local.layers = []
    layers.append(layer)


def exit_layer() -> None:
    layers = getattr(_local, "layers", None)
    if layers:
        layers.pop()


def current_layer() -> object:
    """The layer of the attention forward under way on this thread, or None."""
    layers = getattr(_local, "layers", None)
    return layers[-1] if layers else None
