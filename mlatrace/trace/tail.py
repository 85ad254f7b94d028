"""Tailing reader: follows the `p<pid>.jsonl` files of a trace that is still being written.

`mlatrace watch` reads a trace while the traced processes append to it. Each poll looks
at the directory (and its per-host subdirectories) for new files and compares each known
file's size with the offset read so far; the new bytes are read, a piece at a time, only
as the poll's records are consumed, so a file is never read twice, the reader holds no
more than a piece of each file however long the backlog, and a forked feed worker
(`mlatrace.analysis.parallel`) reads its own files. A writer flushes whole batches of
lines, but a poll can land mid-write, so the bytes after the last newline are held until
their line completes. Every complete line goes through the batch reader's own checks
(`ProcessFile.checked_chunk`), so a malformed line is reported as `file:line: reason`
exactly as `report` would, and the records handed out are the ones `report` would stream.

A poll takes at most `chunk` bytes of a file, so a long backlog is caught up over several
polls and the view refreshes meanwhile; while a backlog remains, each poll takes twice
the last one's, up to `MAX_GROWTH` times `chunk` (fewer polls, each with its fixed cost).

    tail = TailReader([run_dir])
    for proc, chunks in tail.poll():    # new records since the last poll, per file, as
        for records in chunks: ...      # lists: consume them in order, before the next poll
    tail.close()                        # the run is over: held partial lines are read as
                                        # the batch reader reads them (a truncated line)
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlatrace.trace.reader import READ_BYTES, Problem, ProcessFile, file_order

READ_CHUNK = 8 * 1024 * 1024   # bytes taken from one file by a poll after one that caught up
MAX_GROWTH = 4                 # while behind, a poll takes up to this many times READ_CHUNK


@dataclass
class TailFile:
    """One process file being followed: how far it was read, and the line held back."""

    proc: ProcessFile
    offset: int = 0
    partial: bytes = b""           # bytes after the last newline (a line still being written)
    closed: bool = False
    started: bool = False          # the first line was seen (header taken or refused)
    typed: bool = False            # hand records of TYPED_KINDS as Records (the builder's)

    def lines(self, data: bytes, end: int) -> Iterator[list[dict[str, Any]]]:
        """Hand complete lines, `data[:end]` (or, at close, the last partial one) to the
        batch checks, the first line of the file as its header."""
        if not self.started:
            self.proc.accept_header_line(bytes(data[:data.find(b"\n", 0, end) + 1 or end]))
            self.started = True
        return self.proc.checked_chunks(data, end=end, typed=self.typed)


class NewRecords:
    """The records of one file's bytes up to `end`, read a piece at a time as they are
    iterated (the bytes after the last newline are held in the `TailFile`).

    Iterate once. A forked feed worker that consumed them in its own memory hands back
    `position()`, and the watch process `resume`s from it.
    """

    __slots__ = ("end", "tail")

    def __init__(self, tail: TailFile, end: int) -> None:
        self.tail, self.end = tail, end

    def __iter__(self) -> Iterator[list[dict[str, Any]]]:
        tail = self.tail
        try:
            f = open(tail.proc.path, "rb")  # noqa: SIM115 - held while the records are consumed
        except OSError:
            return  # removed since the poll: keep what was read
        with f:
            f.seek(tail.offset)
            while tail.offset < self.end:
                data = f.read(min(self.end - tail.offset, READ_BYTES))
                if not data:
                    return  # replaced since the poll: the next poll sees its size
                tail.offset += len(data)
                if tail.partial:
                    data = tail.partial + data
                cut = data.rfind(b"\n") + 1
                tail.partial = data[cut:]
                if cut:
                    yield from tail.lines(data, cut)

    def position(self) -> tuple[int, bytes, bool]:
        return self.tail.offset, self.tail.partial, self.tail.started

    def resume(self, position: tuple[int, bytes, bool]) -> None:
        self.tail.offset, self.tail.partial, self.tail.started = position


class TailReader:
    """Follows every process file under `roots` (each root and its direct subdirectories).

    `typed`: the records of `mlatrace.trace.typed.TYPED_KINDS` come as `Record`s (what
    the builder reads), the others as dicts."""

    def __init__(self, roots: list[Path], chunk: int = READ_CHUNK, typed: bool = False) -> None:
        self.roots = [Path(r) for r in roots]
        self.chunk = chunk
        self.typed = typed
        self.problems: list[Problem] = []
        self.files: dict[Path, TailFile] = {}
        self.run: dict[str, Any] | None = None
        self.behind = False   # the last poll left bytes unread (a backlog over one chunk)
        self.pending = 0      # bytes the last poll's records will read, over all files
        self._budget: int | None = None  # bytes the next poll takes from one file (None: chunk)
        self._run_stat: tuple[int, int] | None = None

    # -- discovery -------------------------------------------------------------
    def _scan(self) -> list[tuple[Path, str]]:
        """(path, label) of every process file now present, in the batch reader's order."""
        found: list[tuple[Path, str]] = []
        for root in self.roots:
            for path, label in _process_files(root):
                found.append((path, label))
        return found

    def _read_run_json(self) -> None:
        """Re-read the launcher's run.json when it changed (it is replaced atomically)."""
        path = self.roots[0] / "run.json"
        try:
            st = path.stat()
        except OSError:
            return
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == self._run_stat:
            return
        try:
            self.run = json.loads(path.read_text())
            self._run_stat = stamp
        except (OSError, ValueError):
            pass  # mid-replace or damaged: try again next poll

    # -- reading ---------------------------------------------------------------
    def poll(self) -> list[tuple[ProcessFile, NewRecords]]:
        """The records added to each file since the last poll (files with no new bytes
        left out).

        Each file's records come as an iterable of lists (a few hundred records each,
        `ProcessFile.checked_chunks`), read and decoded as they are consumed: consume
        them in order, before the next poll (records not consumed are read by a later
        poll). A poll takes at most its budget of bytes from each file (see the module
        docstring).
        """
        self._discover()
        budget = self._budget or self.chunk
        out = []
        behind = False
        self.pending = 0
        for tail in self._ordered():
            new = self._new_bytes(tail)
            if new:
                behind = behind or new > budget
                take = min(new, budget)
                self.pending += take
                out.append((tail.proc, NewRecords(tail, tail.offset + take)))
        self.behind = behind
        self._budget = min(budget * 2, self.chunk * MAX_GROWTH) if behind else None
        return out

    def _discover(self) -> None:
        self._read_run_json()
        for path, label in self._scan():
            if path not in self.files:
                self.files[path] = TailFile(ProcessFile(path, self.problems, label=label),
                                            typed=self.typed)

    def _ordered(self) -> list[TailFile]:
        return sorted(self.files.values(), key=lambda t: (file_order(t.proc.path),
                                                         t.proc.name))

    def _new_bytes(self, tail: TailFile) -> int:
        """How many bytes were appended to the file since it was read (0: none, closed,
        removed, or shrunk: a file that shrinks is no longer read)."""
        if tail.closed:
            return 0
        try:
            size = os.stat(tail.proc.path).st_size
        except OSError:
            return 0  # removed: keep what was read
        if size < tail.offset:
            self.problems.append(Problem(tail.proc.name, tail.proc.lines_checked + 1,
                                         f"file shrank from {tail.offset} to {size} bytes while "
                                         "followed; no longer read"))
            tail.closed = True
            return 0
        return size - tail.offset

    def close(self) -> list[tuple[ProcessFile, list[list[dict[str, Any]]]]]:
        """The run is over: read what is left, then each held partial line as a truncated one.

        Returns every file with its records as a list of lists (the run is over, nothing
        more comes), those without new records too, so that a consumer knows of each (an
        empty file is a problem the batch reader reports as well).
        """
        self._discover()
        out = []
        for tail in self._ordered():
            records: list[list[dict[str, Any]]] = []
            while new := self._new_bytes(tail):  # the whole backlog, whatever the budget
                before = tail.offset
                records += NewRecords(tail, tail.offset + new)
                if tail.offset == before:
                    break
            if not tail.closed and (tail.partial or not tail.started):
                data, tail.partial = tail.partial, b""
                if data:
                    records += tail.lines(data, len(data))
                else:
                    tail.proc.accept_header_line(b"")  # an empty file, as the batch reader says
                    tail.started = True
            tail.closed = True
            out.append((tail.proc, records))
        self.behind, self.pending = False, 0
        return out

    def processes(self) -> list[ProcessFile]:
        return [t.proc for t in self._ordered()]


def _process_files(root: Path) -> list[tuple[Path, str]]:
    """p*.jsonl of `root` (label: the file name) and of its subdirectories (label: sub/name)."""
    out: list[tuple[Path, str]] = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return out
    subdirs = []
    for entry in entries:
        name = entry.name
        if name.startswith("p") and name.endswith(".jsonl"):
            out.append((Path(entry.path), name))
        elif entry.is_dir(follow_symlinks=False) and not name.startswith("."):
            subdirs.append(entry)
    for sub in subdirs:
        try:
            for entry in os.scandir(sub.path):
                if entry.name.startswith("p") and entry.name.endswith(".jsonl"):
                    out.append((Path(entry.path), f"{sub.name}/{entry.name}"))
        except OSError:
            continue
    return out


__all__ = ["MAX_GROWTH", "READ_CHUNK", "NewRecords", "TailFile", "TailReader"]
