"""Tailing reader: follows the `p<pid>.jsonl` files of a trace that is still being written.

`mlatrace watch` reads a trace while the traced processes append to it. Each poll looks
at the directory (and its per-host subdirectories) for new files, compares each known
file's size with the offset read so far, and reads only the new bytes: a file is never
read twice. A writer flushes whole batches of lines, but a poll can land mid-write, so
the bytes after the last newline are held until their line completes. Every complete
line goes through the batch reader's own checks (`ProcessFile.checked_chunk`), so a
malformed line is reported as `file:line: reason` exactly as `report` would, and the
records handed out are the ones `report` would stream.

    tail = TailReader([run_dir])
    for proc, chunks in tail.poll():    # new records since the last poll, per file, as
        for records in chunks: ...      # lists: consume them before the next poll
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

from mlatrace.trace import Problem, ProcessFile, _file_order

READ_CHUNK = 8 * 1024 * 1024   # bytes read from one file per poll: a long backlog is
                                # caught up over several polls, so the view stays live


@dataclass
class TailFile:
    """One process file being followed: how far it was read, and the line held back."""

    proc: ProcessFile
    offset: int = 0
    partial: bytes = b""           # bytes after the last newline (a line still being written)
    closed: bool = False
    started: bool = False          # the first line was seen (header taken or refused)


class TailReader:
    """Follows every process file under `roots` (each root and its direct subdirectories)."""

    def __init__(self, roots: list[Path], chunk: int = READ_CHUNK) -> None:
        self.roots = [Path(r) for r in roots]
        self.chunk = chunk
        self.problems: list[Problem] = []
        self.files: dict[Path, TailFile] = {}
        self.run: dict[str, Any] | None = None
        self.behind = False   # the last poll left bytes unread (a backlog over one chunk)
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
    def poll(self) -> list[tuple[ProcessFile, Iterator[list[dict[str, Any]]]]]:
        """The records added to each file since the last poll (files with none left out).

        Each file's records come as an iterator of lists (a few hundred records each,
        `ProcessFile.checked_chunks`), decoded as they are consumed: consume them in
        order, before the next poll. At most `chunk` bytes are read from a file per poll.
        """
        self._read_run_json()
        self.behind = False
        for path, label in self._scan():
            if path not in self.files:
                self.files[path] = TailFile(ProcessFile(path, self.problems, label=label))
        out = []
        for tail in self._ordered():
            records = self._read_new(tail)
            if records is not None:
                out.append((tail.proc, records))
        return out

    def _ordered(self) -> list[TailFile]:
        return sorted(self.files.values(), key=lambda t: (_file_order(t.proc.path),
                                                         t.proc.name))

    def _read_new(self, tail: TailFile) -> Iterator[list[dict[str, Any]]] | None:
        """The records of the complete lines appended since the last read, or None."""
        if tail.closed:
            return None
        try:
            size = os.stat(tail.proc.path).st_size
        except OSError:
            return None  # removed: keep what was read
        if size < tail.offset:
            self.problems.append(Problem(tail.proc.name, tail.proc.lines_checked + 1,
                                         f"file shrank from {tail.offset} to {size} bytes while "
                                         "followed; no longer read"))
            tail.closed = True
            return None
        if size == tail.offset:
            return None
        try:
            with open(tail.proc.path, "rb") as f:
                f.seek(tail.offset)
                data = f.read(min(size - tail.offset, self.chunk))
        except OSError:
            return None
        self.behind = self.behind or size - tail.offset > len(data)
        tail.offset += len(data)
        if tail.partial:
            data = tail.partial + data
        cut = data.rfind(b"\n") + 1
        tail.partial = data[cut:]
        if cut == 0:
            return None
        return self._lines(tail, data, cut)

    def _lines(self, tail: TailFile, data: bytes,
               end: int) -> Iterator[list[dict[str, Any]]]:
        """Hand complete lines, `data[:end]` (or, at close, the last partial one) to the
        batch checks."""
        if not tail.started:
            tail.proc.accept_header_line(bytes(data[:data.find(b"\n", 0, end) + 1 or end]))
            tail.started = True
        return tail.proc.checked_chunks(data, end=end)

    def close(self) -> list[tuple[ProcessFile, list[list[dict[str, Any]]]]]:
        """The run is over: read what is left, then each held partial line as a truncated one.

        Returns every file with its records as a list of lists (the run is over, nothing
        more comes), those without new records too, so that a consumer knows of each (an
        empty file is a problem the batch reader reports as well).
        """
        out = {id(proc): (proc, list(records)) for proc, records in self.poll()}
        for tail in self._ordered():
            records = out.pop(id(tail.proc), (tail.proc, []))[1]
            while not tail.closed:  # a backlog larger than one chunk
                before = tail.offset
                more = self._read_new(tail)
                if more is not None:
                    records += more
                if tail.offset == before:
                    break
            if not tail.closed and (tail.partial or not tail.started):
                data, tail.partial = tail.partial, b""
                if data:
                    records += self._lines(tail, data, len(data))
                else:
                    tail.proc.accept_header_line(b"")  # an empty file, as the batch reader says
                    tail.started = True
            tail.closed = True
            out[id(tail.proc)] = (tail.proc, records)
        return [out[id(t.proc)] for t in self._ordered()]

    def processes(self) -> list[ProcessFile]:
        return [t.proc for t in self._ordered()]

    def stat_total(self) -> int:
        """Bytes read so far over all files."""
        return sum(t.offset for t in self.files.values())


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


__all__ = ["READ_CHUNK", "TailFile", "TailReader"]
