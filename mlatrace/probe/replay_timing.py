"""Replay GPU time without a sync: CUDA events around a sample of graph replays.

Which replays: the first N of each graph, then 1 in M, chosen by the replay's ``n`` (the
count the recorder keeps per gid), so the torch segments of one wrapper replay are timed
at the same ``n``. A timed replay records a start event before it and an end event after
it, on the current stream (the one the replay is launched on). The pair waits in a
bounded queue until ``query()`` says its end event completed: at a later replay on the
same thread, or at process exit (the recorder's close hook). Never ``synchronize()``,
and never from the flush thread: an event query from another thread while some thread
captures in global mode is illegal and would break that capture. A resolved pair becomes
one ``graph.replay.time {gid, n, gpu_ns, via}`` record; a pair never resolved (the
process was killed, the GPU never finished) is simply absent.

Cost: an untimed replay pays a dict lookup and a modulo. A timed one reads the current
stream (Stream objects cached by raw stream id: ``torch.cuda.current_stream()`` builds a
new one per call, ~7.5 us on the H200 host) and records two events from a pool.

The reference HostGraph (CPU) runs its device work on the host inside ``replay()``, so
its timer reads the host clock around the replay (``via: "host"``).
"""

from __future__ import annotations

import functools
import os
import time
from collections import deque
from typing import Any

from mlatrace import record, settings

MAX_PAIRS = 64          # event pairs in flight; a replay due while all are busy goes untimed
POLL_PER_REPLAY = 4     # completed pairs resolved per later replay
MAX_STREAMS = 64        # cached Stream objects


class CudaReplayTimer:
    """CUDA events around sampled replays, resolved later with query()."""

    via = "cuda-event"

    def __init__(self, first: int, every: int) -> None:
        import torch

        self.first, self.every = first, every
        self.pending: deque = deque()    # (gid, n, start, end, device), in replay order
        self.free: dict[int, list[tuple[Any, Any]]] = {}   # device -> idle event pairs
        self.pairs = 0
        self.streams: dict[tuple, Any] = {}
        self.hooked: Any = None
        self._event = torch.cuda.Event
        self._stream = torch.cuda.Stream
        self._current = torch._C._cuda_getCurrentStream
        self._device = torch._C._cuda_getDevice

    def start(self) -> Any:
        """Record a start event on the current stream; the token for stop(), or None."""
        device = self._device()
        idle = self.free.get(device)
        if idle:
            pair = idle.pop()
        elif self.pairs < MAX_PAIRS:
            pair = (self._event(enable_timing=True), self._event(enable_timing=True))
            self.pairs += 1
        else:
            return None
        raw = self._current(device)
        stream = self.streams.get(raw)
        if stream is None:
            stream = self._stream(stream_id=raw[0], device_index=raw[1], device_type=raw[2])
            if len(self.streams) < MAX_STREAMS:
                self.streams[raw] = stream
        pair[0].record(stream)
        recorder = record.current()
        if recorder is not None and recorder is not self.hooked:
            recorder.add_close_hook(functools.partial(self.drain, recorder))
            self.hooked = recorder
        return pair, stream, device

    def stop(self, token: Any, gid: int, n: int) -> None:
        pair, stream, device = token
        pair[1].record(stream)
        self.pending.append((gid, n, pair[0], pair[1], device))

    def abandon(self, token: Any) -> None:
        """The replay raised: give its events back."""
        self.free.setdefault(token[2], []).append(token[0])

    def poll(self, limit: int = POLL_PER_REPLAY) -> None:
        """Resolve up to `limit` completed pairs from the head of the queue (no sync)."""
        pending = self.pending
        for _ in range(limit):
            if not pending:
                return
            item = pending[0]
            if not item[3].query():
                return
            pending.popleft()
            self._emit(item)

    def drain(self, recorder: Any) -> None:
        """At exit (the recorder's close hook): resolve every pair whose end completed;
        the others stay absent."""
        from mlatrace.probe import graphs

        if graphs.capturing():
            return
        for item in list(self.pending):
            try:
                if item[3].query():
                    self._emit(item, recorder)
            except Exception:
                continue
        self.pending.clear()

    def _emit(self, item: tuple, recorder: Any = None) -> None:
        gid, n, begin, end, device = item
        gpu_ns = int(begin.elapsed_time(end) * 1e6)
        self.free.setdefault(device, []).append((begin, end))
        fields = {"gid": gid, "n": n, "gpu_ns": gpu_ns, "via": self.via}
        if recorder is not None:
            recorder.add("graph.replay.time", fields)
        else:
            record.emit_fields("graph.replay.time", fields)


class HostReplayTimer:
    """The host clock around a replay that runs its work on the host (reference HostGraph)."""

    via = "host"
    pending = ()

    def __init__(self, first: int, every: int) -> None:
        self.first, self.every = first, every

    def start(self) -> Any:
        return time.perf_counter_ns()

    def stop(self, token: Any, gid: int, n: int) -> None:
        record.emit("graph.replay.time", gid=gid, n=n,
                    gpu_ns=time.perf_counter_ns() - token, via=self.via)

    def abandon(self, token: Any) -> None:
        pass

    def poll(self, limit: int = POLL_PER_REPLAY) -> None:
        pass


_cuda_timer: CudaReplayTimer | None = None


def timer_for(clock: str) -> CudaReplayTimer | HostReplayTimer | None:
    """The process's timer for `clock` ("cuda" or "host") under MLATRACE_REPLAY_TIMING; None
    when timing is off, or for "cuda" when this torch has no usable CUDA (HIP counts).

    One CUDA timer per process, shared by every replay probe (one event pool, one queue).
    """
    global _cuda_timer
    timing = settings.current().replay_timing
    if timing is None or clock not in ("cuda", "host"):
        return None
    if clock == "host":
        return HostReplayTimer(*timing)
    if _cuda_timer is None:
        import torch

        if not torch.cuda.is_available():   # a look-alike graph class on a CPU build
            return None
        _cuda_timer = CudaReplayTimer(*timing)
    return _cuda_timer


def _forget_in_child() -> None:
    """A forked child cannot use its parent's CUDA events: start afresh."""
    global _cuda_timer
    _cuda_timer = None


os.register_at_fork(after_in_child=_forget_in_child)
