"""Parallel build: a large trace of several processes is split over worker processes
(gids are per process, so process files are independent) and the parts merged."""

from __future__ import annotations

import gc
import os
import threading
import time
from typing import Any

from mlatrace.analysis.model import TraceModel

PARALLEL_MIN_BYTES = 48 * 1024 * 1024  # below this, starting workers costs more than it saves


def _pid_groups(processes: list) -> list[list]:
    """Process files grouped by pid (a rotated process has several parts, kept in order)."""
    groups: dict[Any, list] = {}
    for i, proc in enumerate(processes):
        pid = getattr(proc, "pid", None)
        groups.setdefault(pid if pid is not None else f"#{i}", []).append(proc)
    return list(groups.values())


def _default_workers(processes: list, groups: int) -> int:
    if groups < 2:
        return 1
    try:
        total = sum(p.path.stat().st_size for p in processes)
    except (AttributeError, OSError):
        return 1
    if total < PARALLEL_MIN_BYTES:
        return 1
    return max(1, min(groups, os.cpu_count() or 1))


def _build_parallel(trace: Any, groups: list[list], workers: int) -> list[TraceModel] | None:
    """Build one partial model per worker (files balanced by size); None when workers fail."""
    import concurrent.futures
    import multiprocessing

    buckets: list[list[tuple[str, str, Any]]] = [[] for _ in range(workers)]
    sizes = [0] * workers
    for group in sorted(groups, key=lambda g: -sum(_size(p) for p in g)):
        i = sizes.index(min(sizes))
        buckets[i].extend((str(p.path), p.name, getattr(p, "header_overrides", None))
                          for p in group)
        sizes[i] += sum(_size(p) for p in group)
    buckets = [b for b in buckets if b]
    # fork only: spawn/forkserver would re-import the caller's __main__ (a script, the CLI);
    # and never fork a process that runs other threads (a recorder, a test harness)
    if "fork" not in multiprocessing.get_all_start_methods() or threading.active_count() > 1:
        return None
    try:
        ctx = multiprocessing.get_context("fork")
        with concurrent.futures.ProcessPoolExecutor(len(buckets), mp_context=ctx) as pool:
            return list(pool.map(_build_partial, buckets))
    except Exception:  # no workers here (sandbox, pickling): the serial path still works
        return None


def _size(proc: Any) -> int:
    try:
        return proc.path.stat().st_size
    except (AttributeError, OSError):
        return 0


def _build_partial(paths: list[tuple[str, str, Any]]) -> TraceModel:
    """Worker: open each process file on its own, named and with the header as the parent
    read it (a run of several host directories names files by their path, and may give a
    host's processes pids of their own), and stream it into a partial model."""
    from mlatrace.analysis.builder import _stream_process
    from mlatrace.trace import open_trace

    model = TraceModel(root="")
    started = time.process_time()
    gc.disable()
    for path, name, overrides in paths:
        trace = open_trace(path)
        for proc_file in trace.processes:
            proc_file.label = name
            proc_file.header_overrides = overrides
            proc_file.problems.clear()
            proc_file.read_header()  # header problems under the parent's name
            model.processes.append(_stream_process(model, proc_file))
        model.problems = list(trace.problems) + model.problems
    model.worker_cpu_s = [time.process_time() - started]
    return model
