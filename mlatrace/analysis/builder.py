"""Streaming builder: one pass over each process file of a trace fills the TraceModel.

`build_model` builds a finished trace (over worker processes when it pays: `parallel`);
`IncrementalBuilder` the model of a trace still being written (`mlatrace watch`). Both feed
records through `stream` to one `ProcessBuilder` per process file."""

from __future__ import annotations

import gc
import os
import pickle
from collections.abc import Iterable
from typing import Any

from mlatrace.analysis import parallel as parallel_build
from mlatrace.analysis.model import ProcessModel, TraceModel
from mlatrace.analysis.parallel import build_parallel, default_workers, pid_groups
from mlatrace.analysis.process_builder import ProcessBuilder
from mlatrace.analysis.stream import chunks_of, feed_records
from mlatrace.trace import Problem


def _infer_role(proc: ProcessModel, pids: set[int | None], captured: bool) -> str:
    """A short name for what the process is, from its rank, argv and lineage."""
    argv = proc.argv
    text = " ".join(argv)
    suffix = ", captures graphs" if captured else ""
    if proc.rank is not None:
        role = f"rank {proc.rank}" + (f"/{proc.world_size}" if proc.world_size else "")
    elif "resource_tracker" in text:
        role = "resource tracker"
    elif "spawn_main" in text or "--multiprocessing-fork" in text or "forkserver" in text:
        role = "mp spawn child"
    elif any(a.endswith("vllm") for a in argv[:3]) and "serve" in argv:
        role = "vllm serve"
    elif "-m" in argv[:-1]:
        role = "-m " + argv[argv.index("-m") + 1]
    elif "-c" in argv:
        role = "python -c"
    elif len(argv) > 1:
        role = os.path.basename(argv[1])
    else:
        role = "process"
    if proc.ppid not in pids and proc.rank is None:
        role += " (root)"
    return role + suffix


class IncrementalBuilder:
    """The model of a trace, updated record by record as records arrive.

    `build_model` feeds every file of a finished trace through it in one go; `mlatrace
    watch` feeds each piece of each file as the tailing reader finds it and takes a
    `snapshot()` whenever it refreshes. Both go through the same `ProcessBuilder`
    handlers, so the model after the last record is the one `report` builds. Files are
    independent (gids are per process): pieces of different files may interleave.
    """

    def __init__(self, root: str = "") -> None:
        self.model = TraceModel(root=root)
        self.problems: list[Problem] = []   # what the builder itself found (bad field types)
        self._builders: dict[int, tuple[Any, ProcessBuilder, dict[str, Any]]] = {}

    def feed(self, proc_file: Any, records: Iterable[dict]) -> int:
        """Apply `records` (the next ones of `proc_file`, in file order); returns how many."""
        entry = self._builders.get(id(proc_file))
        if entry is None:
            builder = ProcessBuilder(self.model, proc_file)
            header = getattr(proc_file, "header", None)
            if isinstance(header, dict):
                builder.header(header)
            handlers = builder.handlers()
            entry = self._builders[id(proc_file)] = (proc_file, builder, handlers)
            self.model.processes.append(builder.proc)
        _, builder, handlers = entry
        count = feed_records(builder, handlers, records, self.problems)
        builder.proc.records += count
        return count

    def feed_files(self, pieces: list[tuple[Any, Iterable[list[dict]]]],
                   parallel: bool = False) -> int:
        """Feed each file's next records (lists of them, in file order); returns how many.

        `parallel`: files of different pids are independent, so a large backlog is fed
        over worker processes (forked, one bucket of pids each, the parent taking one
        too) whose builders then replace this process's builders of those pids; where
        no worker can run, or one fails, the rest is fed here.
        """
        if parallel:
            done = parallel_build.feed_parallel(self, pieces)
            if done is not None:
                return done
        return sum(self.feed(proc_file, chunk) for proc_file, chunks in pieces
                   for chunk in chunks)

    def export_pids(self, pids: set[Any], proc_files: list[Any], reader_from: int,
                    own_from: int) -> bytes:
        """A worker's result: the builders of `pids` with their part of the model, and
        the reader state of `proc_files`, pickled together (so shared objects stay shared)."""
        builders = [(key, proc_file, builder) for key, (proc_file, builder, _h)
                    in self._builders.items() if builder.pid in pids]
        for _key, _file, builder in builders:
            builder.model = None  # the parent's model takes the parts below
        model = self.model
        state = {
            "builders": [(key, builder) for key, _file, builder in builders],
            "graphs": {k: g for k, g in model.graphs.items() if k[0] in pids},
            "runtime_eager": {k: v for k, v in model.runtime_eager.items() if k[0] in pids},
            "runtime_splits": {k: v for k, v in model.runtime_splits.items() if k in pids},
            "files": {id(f): f.reading_state() for f in proc_files},
            "reader_problems": proc_files[0].problems[reader_from:] if proc_files else [],
            "problems": self.problems[own_from:],
        }
        return pickle.dumps(state, pickle.HIGHEST_PROTOCOL)

    def absorb(self, data: bytes, proc_files: list[Any]) -> None:
        """Take a worker's `export_pids` in place of this process's state of those pids."""
        state = pickle.loads(data)
        model = self.model
        pids = set()
        for key, builder in state["builders"]:
            builder.model = model
            pids.add(builder.pid)
            old = self._builders.get(key)
            proc_file = old[0] if old else next(f for f in proc_files if id(f) == key)
            if old is None:
                model.processes.append(builder.proc)
            else:
                index = next(i for i, p in enumerate(model.processes) if p is old[1].proc)
                model.processes[index] = builder.proc
            self._builders[key] = (proc_file, builder, builder.handlers())
        for part, new in ((model.graphs, state["graphs"]),
                          (model.runtime_eager, state["runtime_eager"])):
            for k in [k for k in part if k[0] in pids]:
                del part[k]
            part.update(new)
        for k in [k for k in model.runtime_splits if k in pids]:
            del model.runtime_splits[k]
        model.runtime_splits.update(state["runtime_splits"])
        for proc_file in proc_files:
            if id(proc_file) in state["files"]:
                proc_file.resume_reading(state["files"][id(proc_file)])
        if proc_files:
            proc_files[0].problems.extend(state["reader_problems"])
        self.problems.extend(state["problems"])

    def builder_of(self, proc_file: Any) -> ProcessBuilder | None:
        entry = self._builders.get(id(proc_file))
        return entry[1] if entry else None

    def snapshot(self, reader_problems: Iterable[Problem] = (),
                 order: list[Any] | None = None) -> TraceModel:
        """The model as of the records fed so far, finished as `report` finishes it.

        Cheap (no record is read again): per-process aggregates are closed, roles
        inferred; `order` (process files) sorts the processes as the batch reader lists them.
        """
        for proc_file, builder, _ in self._builders.values():
            builder.finish(proc_file)
        if order is not None:
            rank = {id(f): i for i, f in enumerate(order)}
            by_proc = {id(b.proc): rank.get(id(f), len(rank))
                       for f, b, _ in self._builders.values()}
            self.model.processes.sort(key=lambda p: by_proc.get(id(p), len(rank)))
        self.model.problems = list(reader_problems) + self.problems
        return _finish_model(self.model, None, None)



def build_model(trace: Any, workers: int | None = None) -> TraceModel:
    """Stream every process file of an opened trace (mlatrace.trace API) into a TraceModel.

    Process files are independent (gids are per process), so a large trace with several
    processes is split over `workers` processes (default: the CPUs, when it pays off).
    """
    groups = pid_groups(trace.processes)
    if workers is None:
        workers = default_workers(trace.processes, len(groups))
    if workers > 1 and len(groups) > 1:
        parts = build_parallel(trace, groups, workers)
        if parts is not None:
            return _finish_model(TraceModel(root=str(getattr(trace, "root", ""))), trace, parts)
    incremental = IncrementalBuilder(root=str(getattr(trace, "root", "")))
    gc_was_enabled = gc.isenabled()
    gc.disable()  # millions of short-lived dicts, no cycles: collections only cost time
    try:
        for proc_file in trace.processes:
            incremental.feed(proc_file, [])  # a file without records is a process too
            for chunk in chunks_of(proc_file):
                incremental.feed(proc_file, chunk)
    finally:
        if gc_was_enabled:
            gc.enable()
    return incremental.snapshot(getattr(trace, "problems", []))


def _finish_model(model: TraceModel, trace: Any, parts: list[TraceModel] | None) -> TraceModel:
    if parts is not None:
        done_files = set()
        for part in parts:
            model.processes.extend(part.processes)
            model.graphs.update(part.graphs)
            model.runtime_eager.update(part.runtime_eager)
            model.runtime_splits.update(part.runtime_splits)
            model.step_syncs.update(part.step_syncs)
            model.worker_cpu_s.extend(part.worker_cpu_s)
            done_files.update(p.file for p in part.processes)
        order = {getattr(p, "name", None): i for i, p in enumerate(trace.processes)}
        model.processes.sort(key=lambda p: order.get(p.file, 0))
        # header problems were found again by the workers: keep the parent's for other files
        model.problems = [p for p in getattr(trace, "problems", []) if p.file not in done_files]
        for part in parts:
            model.problems.extend(part.problems)
    pids = {p.pid for p in model.processes}
    captured = {g.pid for g in model.graphs.values()}
    for proc in model.processes:
        proc.role = _infer_role(proc, pids, proc.pid in captured)
    return model
