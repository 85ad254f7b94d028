"""Graph ids and the per-thread capture stack shared by every probe.

A capture (torch.cuda.CUDAGraph, vLLM's wrapper, the reference host graph) pushes
its gid while it records; launches and calls made meanwhile carry the innermost
gid, and a nested capture names the enclosing one as its parent. Everything here
is pure Python: asking "are we capturing?" costs no CUDA call and never syncs.
"""

from __future__ import annotations

import itertools
import threading

_gid_counter = itertools.count(1)
_local = threading.local()


def next_gid() -> int:
    """A process-unique, small graph id (1, 2, 3, ...)."""
    return next(_gid_counter)


def _stack() -> list[int]:
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


def push_capture(gid: int) -> None:
    """Enter a capture on this thread."""
    _stack().append(gid)


def pop_capture() -> int | None:
    """Leave the innermost capture on this thread; None when none was open."""
    stack = _stack()
    return stack.pop() if stack else None


def remove_capture(gid: int) -> None:
    """Drop gid from this thread's stack wherever it is (capture ended out of order)."""
    stack = _stack()
    if gid in stack:
        stack.remove(gid)


def push_eager() -> None:
    """Run eagerly inside a capture (a breakable capture's eager break): not capturing."""
    _stack().append(None)


def pop_eager() -> None:
    """End an eager break opened by push_eager()."""
    stack = _stack()
    if stack and stack[-1] is None:
        stack.pop()


def current_gid() -> int | None:
    """The innermost capturing gid on this thread, or None (none, or an eager break)."""
    stack = getattr(_local, "stack", None)
    return stack[-1] if stack else None


def capturing() -> bool:
    """True while this thread is inside a capture and not in an eager break."""
    stack = getattr(_local, "stack", None)
    return bool(stack) and stack[-1] is not None


def reset() -> None:
    """Forget this thread's captures (tests, fork children)."""
    _local.stack = []
