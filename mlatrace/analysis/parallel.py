"""Parallel build: a large trace of several processes is split over worker processes
(gids are per process, so process files are independent) and the parts merged.

Two uses: `build_model` of a finished trace (`build_parallel`: each worker streams
whole files into a partial model), and the incremental builder catching up on a
backlog (`feed_parallel`: forked workers continue the builders of their pids on the
records just read and hand the builders back).
"""

from __future__ import annotations

import gc
import os
import pickle
import signal
import threading
import time
from typing import Any

from mlatrace.analysis.model import TraceModel
from mlatrace.analysis.stream import stream_process
from mlatrace.trace import open_trace

PARALLEL_MIN_BYTES = 48 * 1024 * 1024  # below this, starting workers costs more than it saves
FEED_PARALLEL_MIN_BYTES = 8 * 1024 * 1024  # the same for one poll of the incremental builder

_FEED_WORK: Any = None   # what forked feed workers find: (builder, buckets, problem offsets)


def _can_fork() -> bool:
    """fork only: spawn/forkserver would re-import the caller's __main__ (a script, the
    CLI); and never fork a process that runs other threads (a recorder, a test harness)."""
    import multiprocessing

    return "fork" in multiprocessing.get_all_start_methods() and threading.active_count() == 1


def feed_parallel(incremental: Any, pieces: list[tuple[Any, Any]]) -> int | None:
    """Feed `pieces` ((process file, its record lists)) over forked workers, by pid.

    The process files are one reader's (they share its problems list); each worker's new
    problems come back with its builders, after the parent's own. Records that are read
    as they are consumed (the tailing reader's) are read by the worker that feeds them.

    The parent feeds the first bucket itself while the workers feed the others; each
    worker returns its builders (`IncrementalBuilder.export_pids`) through a pipe, and
    they replace the parent's. A worker is a bare fork (no pool: one runs for every
    poll of a backlog, so its start is on the view's path). None when it does not pay
    (one pid) or no worker could start: nothing was fed, the caller feeds serially. A
    worker that fails is made up for here.
    """
    global _FEED_WORK
    groups: dict[Any, list[tuple[Any, Any]]] = {}
    for proc_file, chunks in pieces:
        groups.setdefault(getattr(proc_file, "pid", None), []).append((proc_file, chunks))
    workers = min(len(groups), os.cpu_count() or 1)
    if workers < 2 or not _can_fork():
        return None
    buckets: list[list[tuple[Any, Any]]] = [[] for _ in range(workers)]
    sizes = [0] * workers
    for group in sorted(groups.values(), key=lambda g: -sum(_size(p) for p, _c in g)):
        i = sizes.index(min(sizes))
        buckets[i].extend(group)
        sizes[i] += sum(_size(p) for p, _c in group)
    files = [proc_file for proc_file, _c in pieces]
    reader_from = len(files[0].problems) if hasattr(files[0], "problems") else 0
    _FEED_WORK = (incremental, buckets, reader_from, len(incremental.problems))
    started: list[tuple[int, int, int]] = []   # (bucket, pid, read end of its pipe)
    try:
        for i in range(1, workers):
            try:
                started.append((i, *_fork_worker(i)))
            except OSError:  # no workers here (sandbox, limits): this process feeds them
                break
        if not started:
            return None
        count = sum(incremental.feed(f, chunk) for f, chunks in buckets[0] for chunk in chunks)
        fed_here = {i for i in range(1, workers)} - {i for i, _pid, _r in started}
        while started:
            i, pid, fd = started[0]
            result = _collect(pid, fd)
            started.pop(0)
            if result is None:  # this worker's records were not consumed here: feed them
                fed_here.add(i)
                continue
            data, fed, positions = result
            incremental.absorb(data, [f for f, _c in buckets[i]])
            for (_f, chunks), position in zip(buckets[i], positions, strict=True):
                if position is not None:  # read where consumed: the worker read it
                    chunks.resume(position)
            count += fed
        for i in sorted(fed_here):
            count += sum(incremental.feed(f, c) for f, chunks in buckets[i] for c in chunks)
    finally:
        for _i, pid, fd in started:  # interrupted (Ctrl-C): no worker is left behind
            try:
                os.close(fd)
            except OSError:
                pass  # closed as the interrupted read ended
            _reap(pid, kill=True)
        _FEED_WORK = None
    return count


def _fork_worker(index: int) -> tuple[int, int]:
    """Fork a worker for bucket `index`; (its pid, the read end of its result pipe).

    The child never returns: it writes its pickled result (`_feed_bucket`) and exits,
    with status 1 and nothing written when anything failed."""
    read_fd, write_fd = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(read_fd)
        os.close(write_fd)
        raise
    if pid == 0:  # pragma: no cover - the child (coverage does not follow it)
        status = 1
        try:
            os.close(read_fd)
            data = pickle.dumps(_feed_bucket(index), pickle.HIGHEST_PROTOCOL)
            with os.fdopen(write_fd, "wb") as out:
                out.write(data)
            status = 0
        finally:
            os._exit(status)
    os.close(write_fd)
    return pid, read_fd


def _collect(pid: int, fd: int) -> tuple[bytes, int, list] | None:
    """A worker's result, once it exited cleanly; None when it failed."""
    with os.fdopen(fd, "rb", closefd=True) as pipe:
        data = pipe.read()
    status = _reap(pid)
    if status != 0 or not data:
        return None
    try:
        return pickle.loads(data)
    except Exception:  # a worker killed mid-write
        return None


def _reap(pid: int, kill: bool = False) -> int | None:
    """Wait for worker `pid` (killed first when `kill`); its exit status."""
    try:
        if kill:
            os.kill(pid, signal.SIGKILL)
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    except (OSError, ValueError):
        return None


def _feed_bucket(index: int) -> tuple[bytes, int, list]:
    """Worker: feed bucket `index` into the builder inherited from the parent; with the
    builders, where each file's reading stopped (records read as they are consumed, the
    tailing reader's, carry a `position()`), so the parent goes on from there."""
    incremental, buckets, reader_from, own_from = _FEED_WORK
    bucket = buckets[index]
    count = sum(incremental.feed(f, chunk) for f, chunks in bucket for chunk in chunks)
    pids = {b.pid for f, _c in bucket if (b := incremental.builder_of(f)) is not None}
    positions = [chunks.position() if hasattr(chunks, "position") else None
                 for _f, chunks in bucket]
    return (incremental.export_pids(pids, [f for f, _c in bucket], reader_from, own_from),
            count, positions)


def pid_groups(processes: list) -> list[list]:
    """Process files grouped by pid (a rotated process has several parts, kept in order)."""
    groups: dict[Any, list] = {}
    for i, proc in enumerate(processes):
        pid = getattr(proc, "pid", None)
        groups.setdefault(pid if pid is not None else f"#{i}", []).append(proc)
    return list(groups.values())


def default_workers(processes: list, groups: int) -> int:
    if groups < 2:
        return 1
    try:
        total = sum(p.path.stat().st_size for p in processes)
    except (AttributeError, OSError):
        return 1
    if total < PARALLEL_MIN_BYTES:
        return 1
    return max(1, min(groups, os.cpu_count() or 1))


def build_parallel(trace: Any, groups: list[list], workers: int) -> list[TraceModel] | None:
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
    if not _can_fork():
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
            model.processes.append(stream_process(model, proc_file))
        model.problems = list(trace.problems) + model.problems
    model.worker_cpu_s = [time.process_time() - started]
    return model
