"""HostGraph: the CPU stand-in for torch.cuda.CUDAGraph used by the reference engine.

A CUDA graph freezes every host-side decision made while it was captured (launch
grid, constexprs such as NUM_KV_SPLITS, workspace allocations, which kernels exist
at all) and, on replay, re-runs only the device work, which reads the *current*
contents of the static buffers it was captured with. HostGraph reproduces exactly
that on any device, so the seed-002 bug (one KV split frozen at a dummy length)
happens on a laptop CPU too:

- while a HostGraph is capturing on this thread, ``launch(fn, *args, **kwargs)``
  records ``fn`` with its arguments (tensors by reference, Python values frozen)
  and does NOT run it, like a kernel launch on a capturing stream;
- ``replay()`` calls the recorded closures in order; they read whatever the
  static tensors (seq_info, page_table, q, ...) hold at that moment;
- when no HostGraph is capturing (eager runs, or a real torch.cuda.CUDAGraph
  capture on CUDA), ``launch`` simply calls ``fn``.

How kernel wrappers must use it (mlatrace.reference.mla and the engine):

1. Everything the *host* decides (split count via policies.num_kv_splits, grid,
   workspace tensors from torch.empty, whether stage 2 exists) happens in plain
   Python before the launch, so it is frozen at capture.
2. Every piece of *device work* goes through ``graph.launch(impl, *args, **kw)``,
   where ``impl`` is a private function doing the work (the torch stage body or a
   call of the Triton kernel ``kernel[grid](...)``). Device work includes reading
   sequence lengths: ``impl`` must read ``seq_info`` itself (e.g. ``.tolist()`` on
   CPU inside ``impl``), never the caller, or the dummy length is frozen.
3. The public probed launch functions (``launch_stage1``, ``launch_stage2``) call
   ``graph.launch(_stage1_impl, ...)`` internally; never pass the probed function
   itself to ``graph.launch``, or replays would be recorded as launches (on CUDA a
   replay launches nothing from Python).
4. Tensors that device work writes must be passed in (``out=`` style); a return
   value of ``impl`` is not available while capturing (launch returns None then).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

_state = threading.local()


def _stack() -> list[HostGraph]:
    stack = getattr(_state, "stack", None)
    if stack is None:
        stack = _state.stack = []
    return stack


@dataclass
class HostLaunch:
    """One recorded piece of device work: the function and its frozen arguments."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]

    @property
    def name(self) -> str:
        return getattr(self.fn, "__name__", repr(self.fn))

    def __call__(self) -> None:
        self.fn(*self.args, **self.kwargs)


@dataclass
class HostGraph:
    """Same methods as torch.cuda.CUDAGraph: capture_begin(), capture_end(), replay(), reset()."""

    launches: list[HostLaunch] = field(default_factory=list)
    captured: bool = False
    replay_count: int = 0

    def capture_begin(self, pool: Any = None, capture_error_mode: str = "global") -> None:
        """Start recording launches made on this thread (pool and mode accepted for parity)."""
        if self.captured or self in _stack():
            raise RuntimeError("HostGraph already captured; call reset() first")
        _stack().append(self)

    def capture_end(self) -> None:
        stack = _stack()
        if not stack or stack[-1] is not self:
            raise RuntimeError("capture_end() without a matching capture_begin() on this thread")
        stack.pop()
        self.captured = True

    def replay(self) -> None:
        """Re-run the recorded device work; host decisions stay as they were at capture."""
        if not self.captured:
            raise RuntimeError("replay() before capture_end()")
        for host_launch in self.launches:
            host_launch()
        self.replay_count += 1

    def reset(self) -> None:
        self.launches.clear()
        self.captured = False
        self.replay_count = 0

    def launch_names(self) -> list[str]:
        """Names of the recorded launches, in order (the engine's introspection uses this)."""
        return [host_launch.name for host_launch in self.launches]


def current_host_graph() -> HostGraph | None:
    """The HostGraph capturing on this thread, innermost first, or None."""
    stack = _stack()
    return stack[-1] if stack else None


def launch(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run ``fn`` now, or record it without running when a HostGraph is capturing."""
    host_graph = current_host_graph()
    if host_graph is None:
        return fn(*args, **kwargs)
    host_graph.launches.append(HostLaunch(fn, args, dict(kwargs)))
    return None


@contextlib.contextmanager
def graph(host_graph: HostGraph, pool: Any = None) -> Iterator[HostGraph]:
    """Capture context like ``torch.cuda.graph(g)``: capture_begin on entry, capture_end on exit."""
    host_graph.capture_begin(pool=pool)
    try:
        yield host_graph
    finally:
        host_graph.capture_end()
