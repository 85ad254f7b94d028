"""The trace reader: streams the `p<pid>.jsonl` files of a trace directory.

Readers must survive what real runs leave behind: a SIGKILLed process's
truncated last line, a garbage line, a file without its header, records of
kinds this version does not know, a newer schema minor version. Each problem
is reported as `file:line: reason` and skipped; the rest of the data is kept.
Files are streamed a piece at a time, never loaded whole: each piece of whole lines is
decoded and checked at once (`ProcessFile.checked_chunk`), and a piece holding any bad
line goes line by line (`checked_lines`), which says what is wrong and where.
"""

from __future__ import annotations

import io
import json
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from operator import itemgetter, sub
from pathlib import Path
from typing import Any

from mlatrace.kinds import CAPTURE_BEGIN, PROCESS, PROCESS_END, STEADY
from mlatrace.trace.typed import TYPED_KINDS, Record, decode_records, to_record
from mlatrace.trace.validate import CHECKED_KINDS, steady_problem  # noqa: F401 (re-exported)
from mlatrace.trace.validate import check as check_fields

SCHEMA_NAME = "mlatrace"
SCHEMA_MAJOR = 1
REQUIRED_FIELDS = ("k", "t", "seq")
READ_BYTES = 1 << 20        # bytes the batch reader reads at once
DECODE_BYTES = 64 * 1024    # bytes of lines decoded into one list: the records are used
                            # while their memory is still in the CPU cache
_KIND, _T, _SEQ = itemgetter("k"), itemgetter("t"), itemgetter("seq")
_INT = {int}

try:  # a fast codec when installed; the stdlib otherwise (the H200 image has no msgspec)
    import msgspec

    _decode_line = msgspec.json.Decoder().decode
    _DecodeError: tuple[type[BaseException], ...] = (msgspec.DecodeError, ValueError)
except ImportError:  # pragma: no cover - exercised where msgspec is absent
    _decode_line = json.loads
    _DecodeError = (ValueError,)


class RecordChunk(list):
    """A piece of a file's records as the reader's checks passed them, with their kinds
    (`kinds`, in order, and `counts`, per kind) read on the way: the builder dispatches
    on them without reading every record's kind again; `typed`: the records of
    `TYPED_KINDS` are `Record`s (`mlatrace.trace.typed`). Not to be changed once read."""

    __slots__ = ("counts", "kinds", "typed")
    kinds: list[Any]
    counts: Counter
    typed: bool


class TraceError(Exception):
    """The path is not a readable trace at all (as opposed to a trace with bad lines)."""


@dataclass(frozen=True)
class Problem:
    """One thing wrong in a trace, located precisely enough to open the file there."""

    file: str
    line: int
    reason: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.reason}"


def check_schema(schema: object) -> str | None:
    """None when this reader understands `schema`, else why not (newer minors are fine)."""
    if not isinstance(schema, str) or "/" not in schema:
        return f"unknown schema {schema!r}"
    name, _, version = schema.partition("/")
    major = version.split(".", 1)[0]
    if name != SCHEMA_NAME or not major.isdigit():
        return f"unknown schema {schema!r}"
    if int(major) != SCHEMA_MAJOR:
        return f"schema {schema!r} is not {SCHEMA_NAME}/{SCHEMA_MAJOR}.x; records read as best effort"
    return None


@dataclass
class ProcessFile:
    """One traced process: its header (read eagerly) and its records (streamed)."""

    path: Path
    problems: list[Problem]
    header: dict[str, Any] | None = None
    end: dict[str, Any] | None = None
    gaps: int = 0
    dropped: int = 0
    records_read: int = 0
    label: str | None = None         # the name shown for it: its path from the run's root
    # fields that replace the header's (pids of a host whose pids another host has too)
    header_overrides: dict[str, Any] | None = None
    _header_line_ok: bool = field(default=False, repr=False)
    _header_problem: bool = field(default=False, repr=False)
    _last_seq: int | None = field(default=None, repr=False)
    # the last record taken jumped ahead: (seq before it, its seq, its line, records it
    # counted as dropped); a later record going on from before the jump shows it was wild
    _jump: tuple[int, int, int, int] | None = field(default=None, repr=False)
    # unreadable lines since the last record taken: the seqs they held are not drops
    _unreadable: int = field(default=0, repr=False)
    # the number of the last line handed to the checks (`checked_chunk`) so far: where
    # the next piece of the file begins
    lines_checked: int = field(default=0, repr=False)
    # the gids of the graph.capture.begin records read so far: a `steady` record naming
    # any other gid stands for replays of a graph this process never captured (skipped)
    _captured: set = field(default_factory=set, repr=False)

    # what reading the file advances: a worker that read on hands these back
    # (`reading_state`, `resume_reading`; analysis/builder.py, parallel builds)
    READING_STATE = ("header", "end", "gaps", "dropped", "records_read", "lines_checked",
                     "_header_line_ok", "_header_problem", "_last_seq", "_jump", "_unreadable",
                     "_captured")

    def reading_state(self) -> tuple:
        """Where reading this file got to (picklable), for `resume_reading` elsewhere."""
        return tuple(getattr(self, name) for name in self.READING_STATE)

    def resume_reading(self, state: tuple) -> None:
        """Go on from where another reader of this file got to (`reading_state`)."""
        for name, value in zip(self.READING_STATE, state, strict=True):
            setattr(self, name, value)

    @property
    def name(self) -> str:
        """How problems and evidence name this file: `p<pid>.jsonl`, or `<host dir>/p<pid>.jsonl`
        when the run spans several trace directories."""
        return self.label or self.path.name

    @property
    def pid(self) -> int | None:
        if self.header and isinstance(self.header.get("pid"), int):
            return self.header["pid"]
        if self.header_overrides and isinstance(self.header_overrides.get("pid"), int):
            return self.header_overrides["pid"]
        stem = self.path.name.split(".", 1)[0]
        return int(stem[1:]) if stem[1:].isdigit() else None

    def _problem(self, line: int, reason: str) -> None:
        self.problems.append(Problem(self.name, line, reason))

    def read_header(self) -> None:
        """Read the first line; a missing or bad header is a problem, not a failure."""
        try:
            with self.path.open("rb") as f:
                first = f.readline()
        except OSError as exc:
            self._problem(0, f"cannot read: {exc.strerror or exc}")
            return
        self.accept_header_line(first)

    def accept_header_line(self, first: bytes) -> None:
        """Take `first` (the file's first line, as read) as the header; the tailing reader
        calls this once the line is complete."""
        if not first.strip():
            self._problem(1, "empty file (the process wrote nothing before it ended)")
            return
        record = self._decode(first, 1)
        if record is None:
            self._header_problem = True
            return
        if record.get("k") != PROCESS:
            self._problem(1, f"missing process header (first record is {record.get('k')!r})")
            return
        reason = check_schema(record.get("schema"))
        if reason:
            self._problem(1, reason)
        if self.header_overrides:
            record.update(self.header_overrides)
        self.header = record
        self._header_line_ok = True

    def _decode(self, raw: bytes, lineno: int) -> dict[str, Any] | None:
        try:
            record = _decode_line(raw)
        except _DecodeError as exc:
            truncated = not raw.endswith(b"\n")
            what = "truncated line (process killed mid-write?)" if truncated else "not JSON"
            self._problem(lineno, f"{what}: {str(exc)[:120]}")
            return None
        if not isinstance(record, dict):
            self._problem(lineno, f"not a JSON object: {type(record).__name__}")
            return None
        missing = [name for name in REQUIRED_FIELDS if name not in record]
        if missing:
            self._problem(lineno, f"record without {', '.join(missing)}")
            return None
        if not isinstance(record["seq"], int) or not isinstance(record["t"], int):
            self._problem(lineno, "seq and t must be integers")
            return None
        return record

    def records(self) -> Iterator[dict[str, Any]]:
        """Stream every readable record in file order, the header first when present."""
        for chunk in self.record_chunks():
            yield from chunk

    def record_chunks(self, typed: bool = False) -> Iterator[list[dict[str, Any]]]:
        """The readable records in file order, as lists of the records of a few hundred
        lines each (`checked_chunks`); the file is read a piece at a time, never whole.
        `typed`: those of `TYPED_KINDS` as `Record`s (the builder's reads)."""
        self.gaps = self.dropped = self.records_read = self.lines_checked = 0
        self._last_seq = self._jump = None
        self._unreadable = 0
        self._captured = set()
        try:
            f = self.path.open("rb")
        except OSError as exc:
            self._problem(0, f"cannot read: {exc.strerror or exc}")
            return
        with f:
            held = b""
            while data := f.read(READ_BYTES):
                if held:
                    data = held + data
                cut = data.rfind(b"\n") + 1
                held = data[cut:]
                if cut:
                    yield from self.checked_chunks(data, end=cut, typed=typed)
            if held:  # the last line has no newline (a truncated write, or just unended)
                yield self.checked_chunk(held, self.lines_checked + 1, typed)

    def checked_chunks(self, data: bytes, start: int = 0, end: int | None = None,
                       typed: bool = False) -> Iterator[list[dict[str, Any]]]:
        """`checked_chunk` over `data[start:end]` (whole lines, the first of them the line
        after `lines_checked`) cut at newlines into pieces of about DECODE_BYTES; the
        pieces are cut as they are consumed, so `data` is never copied whole."""
        size = len(data) if end is None else end
        while start < size:
            stop = data.rfind(b"\n", start, min(start + DECODE_BYTES, size)) + 1
            if stop <= start:  # one line longer than a piece, or the unended last line
                stop = data.find(b"\n", start + DECODE_BYTES, size) + 1 or size
            piece = data[start:stop] if start or stop < len(data) else data
            yield self.checked_chunk(piece, self.lines_checked + 1, typed)
            start = stop

    def checked_chunk(self, data: bytes, first: int = 1,
                      typed: bool = False) -> list[dict[str, Any]]:
        """The records of `data` (whole lines, the first of them line `first`; the last
        may lack its newline), with the same checks and state as `checked_lines`.

        Fast path: the chunk is decoded and checked in a few passes that run in C (one
        decode per line through map, itemgetter, set of types, seq order); its records
        come as a `RecordChunk`, which carries the kinds so read. Any line that is not a
        clean record (not JSON, blank, a field missing or not an int, a seq out of
        order, a gap just before process.end) sends the whole chunk through
        `checked_lines`, which says precisely what is wrong and where. `typed` (with
        msgspec): the lines are decoded in one call, as a JSON array of `Record`s (which
        check k, t and seq as they are built; one per line), and a line of a kind not in
        `TYPED_KINDS` is decoded again into its dict.
        """
        as_records = typed and decode_records is not None
        if as_records:
            ended = data.endswith(b"\n")
            self.lines_checked = first - 1 + data.count(b"\n") + (not ended)
        else:
            lines = data.split(b"\n")
            if not lines[-1]:
                lines.pop()
            self.lines_checked = first - 1 + len(lines)
        try:
            if as_records:  # one decode of the lines as a JSON array; k, t and seq checked
                # as each Record is built; one record per line (not two on one line)
                body = data.replace(b"\n", b",")
                records = RecordChunk(decode_records(b"[" + (body[:-1] if ended else body) + b"]"))
                ok = len(records) == self.lines_checked - first + 1 and bool(records)
                seqs = [r.seq for r in records]  # (attribute reads: faster than attrgetter)
                kinds = [r.k for r in records]
            else:
                records = RecordChunk(map(_decode_line, lines))
                seqs = list(map(_SEQ, records))
                kinds = list(map(_KIND, records))
                ok = (bool(records) and set(map(type, seqs)) == _INT
                      and set(map(type, map(_T, records))) == _INT)
        except (KeyError, TypeError, IndexError, *_DecodeError):
            ok = False
        if ok and first == 1:
            if self._header_line_ok:
                records[0] = self.header  # as read (host overrides applied)
                seqs[0], kinds[0] = self.header["seq"], self.header["k"]
            elif self._header_problem:
                ok = False
        if ok:
            try:
                counts = Counter(kinds)
            except TypeError:  # a kind that is not hashable: the precise path keeps it
                ok = False
        if ok and not counts.keys().isdisjoint(CHECKED_KINDS):
            # rare kinds whose fields a rule trusts: a malformed one goes the precise way
            ok = not any(check_fields(_decode_line(line)) for line, kind in
                         zip(data.split(b"\n"), kinds, strict=False) if kind in CHECKED_KINDS)
        if ok:
            last = self._last_seq
            base = seqs[0] if last is None else last + 1
            if seqs[-1] - base == len(seqs) - 1 and seqs == list(range(base, base + len(seqs))):
                jumps = 0  # the usual case: every seq one after the previous
            else:
                steps = list(map(sub, seqs[1:] if last is None else seqs,
                                 seqs[:-1] if last is None else [last, *seqs[:-1]]))
                jumps = len(steps) - steps.count(1) if steps else 0
                ok = not steps or min(steps) > 0
                if ok and jumps and (PROCESS_END in counts or self._unreadable):
                    ok = False  # a gap before process.end, or after unreadable lines, is
                    # not a drop: the precise path
        captured = None
        if ok and (CAPTURE_BEGIN in counts or STEADY in counts):
            captured = self._graphs_in(records, kinds)
            ok = captured is not None   # a steady record of a graph never captured: precise
        if not ok:
            return list(self.checked_lines(enumerate(io.BytesIO(data), start=first), typed))
        if captured is not None:
            self._captured = captured
        if jumps:
            self.gaps += jumps
            self.dropped += sum(steps) - len(steps)
            step = steps[-1]
            self._jump = ((seqs[-1] - step, seqs[-1], first + len(seqs) - 1, step - 1)
                          if step > 1 and kinds[-1] != PROCESS_END else None)
        else:
            self._jump = None
        self._unreadable = 0
        if as_records:
            if not counts.keys() <= TYPED_KINDS:  # other kinds: their whole dicts
                lines = data.split(b"\n")
                for i, kind in enumerate(kinds):
                    if kind not in TYPED_KINDS and type(records[i]) is Record:
                        records[i] = _decode_line(lines[i])  # (not the header: a dict)
        elif typed and not counts.keys().isdisjoint(TYPED_KINDS):
            for i, kind in enumerate(kinds):
                if kind in TYPED_KINDS:
                    records[i] = to_record(records[i])
        records.typed = typed
        if PROCESS_END in counts:
            self.end = records[len(kinds) - 1 - kinds[::-1].index(PROCESS_END)]
        self._last_seq = seqs[-1]
        self.records_read += len(records)
        records.kinds, records.counts = kinds, counts
        return records

    def _phantom(self, rec: dict[str, Any]) -> str | None:
        """Why a `steady` record names a graph this process never captured, or None."""
        gid = rec.get("gid")
        if type(gid) is not int or gid in self._captured:
            return None
        return (f"steady record (seq {rec.get('seq')}) names gid {gid}, which no "
                "graph.capture.begin before it in this file captured")

    def _graphs_in(self, records: list, kinds: list) -> set | None:
        """The captured gids after `records` (a chunk), or None when a `steady` record
        among them names a graph not captured before it (`_phantom`)."""
        captured = set(self._captured)
        for rec, kind in zip(records, kinds, strict=True):
            if kind == CAPTURE_BEGIN:
                gid = rec.get("gid")
                if type(gid) is int:   # a malformed gid is the validator's problem, not ours
                    captured.add(gid)
            elif kind == STEADY:
                gid = rec.get("gid")
                if type(gid) is int and gid not in captured:
                    return None
        return captured

    def checked_lines(self, lines: Iterable[tuple[int, bytes]],
                      typed: bool = False) -> Iterator[dict[str, Any]]:
        """Decode and check (line number, raw line) pairs: the one path every reader takes.

        Keeps the seq order, gaps and drops across calls, so the tailing reader can hand
        over each new piece of the file as it arrives. `typed`: the records of
        `TYPED_KINDS` come as `Record`s.
        """
        last_seq, jump, unreadable = self._last_seq, self._jump, self._unreadable
        decode, errors = _decode_line, _DecodeError
        held: tuple[dict[str, Any], int] | None = None  # a record whose seq jumped ahead,
        # held until the next record shows whether the writer skipped seqs or it is wild

        def taken(record: dict[str, Any], lineno: int) -> dict[str, Any] | None:
            if type(record["k"]) is str and record["k"] in CHECKED_KINDS:
                reason = check_fields(record) or (self._phantom(record)
                                                  if record["k"] == STEADY else None)
                if reason:
                    self._problem(lineno, f"{reason}; record skipped")
                    return None
            if record["k"] == CAPTURE_BEGIN and type(record.get("gid")) is int:
                self._captured.add(record["gid"])
            if record["k"] == PROCESS_END:
                self.end = record
            self.records_read += 1
            if typed and type(record["k"]) is str and record["k"] in TYPED_KINDS:
                record = to_record(record)
            return record

        def wild(at: tuple[int, int, int, int], handed_on: bool) -> int:
            """The jumped record was wild: its gap is not a drop; the seq before it again."""
            self.gaps -= 1
            self.dropped -= at[3]
            what = "read anyway (already handed on)" if handed_on else "record skipped"
            self._problem(at[2], f"seq {at[1]} out of order (the records after it go on from "
                                 f"seq {at[0]}); {what}")
            return at[0]

        try:
            for lineno, raw in lines:
                if lineno == 1 and self._header_line_ok:
                    record = self.header
                else:
                    try:  # fast path: one decode and three type checks per good line
                        record = decode(raw)
                        if (type(record["seq"]) is not int or type(record["t"]) is not int
                                or "k" not in record):
                            raise TypeError
                    except (KeyError, TypeError, IndexError, *errors):
                        # read_header already reported a bad first line
                        if raw.strip() and not (lineno == 1 and self._header_problem):
                            self._decode(raw, lineno)  # slow path: says precisely what is wrong
                            unreadable += 1
                        continue
                seq = record["seq"]
                if held is not None:
                    if jump is not None and jump[0] < seq < jump[1]:
                        last_seq, jump = wild(jump, False), None
                    else:
                        checked = taken(*held)
                        if checked is not None:
                            yield checked
                    held = None
                if last_seq is not None:
                    if seq <= last_seq:
                        if jump is not None and jump[0] < seq:
                            last_seq, jump = wild(jump, True), None
                        else:
                            self._problem(lineno, f"seq {seq} not after {last_seq}; record skipped")
                            continue
                    # a seq the unreadable lines before this record held is theirs, already
                    # reported: not a record the writer dropped
                    lost = seq - last_seq - 1 - unreadable
                    unreadable = 0
                    if lost > 0 and record["k"] != PROCESS_END:
                        self.gaps += 1
                        self.dropped += lost
                        jump = (last_seq, seq, lineno, lost)
                        last_seq, held = seq, (record, lineno)
                        continue
                    jump = None
                unreadable = 0
                last_seq = seq
                checked = taken(record, lineno)
                if checked is not None:
                    yield checked
            if held is not None:
                checked = taken(*held)
                if checked is not None:
                    yield checked
                held = None
        finally:
            self._last_seq, self._jump, self._unreadable = last_seq, jump, unreadable


@dataclass
class Trace:
    """A trace directory: run.json from the launcher and one file per process."""

    root: Path
    run: dict[str, Any] | None
    processes: list[ProcessFile]
    problems: list[Problem]
    # A run read from several directories (one per host): the directories, and every
    # directory's run.json (the launcher of each host that ran `mlatrace run`).
    dirs: list[Path] = field(default_factory=list)
    runs: list[dict[str, Any]] = field(default_factory=list)

    def records(self) -> Iterator[tuple[ProcessFile, dict[str, Any]]]:
        """Every record of every process, file by file."""
        for proc in self.processes:
            for record in proc.records():
                yield proc, record


def file_order(path: Path) -> tuple[int, int, str]:
    stem = path.name.split(".")
    pid = int(stem[0][1:]) if stem[0][1:].isdigit() else 0
    part = int(stem[1]) if len(stem) > 2 and stem[1].isdigit() else 0
    return pid, part, path.name


def open_trace(path: str | Path) -> Trace:
    """Open a trace directory (or a single process file); TraceError when it is neither."""
    root = Path(path)
    problems: list[Problem] = []
    if not root.exists():
        raise TraceError(f"{root}: does not exist")
    if root.is_file() and root.suffix == ".jsonl":
        files, root = [root], root.parent
        run = None
    elif root.is_dir():
        files = sorted(root.glob("p*.jsonl"), key=file_order)
        run = None
        run_json = root / "run.json"
        if run_json.exists():
            try:
                run = json.loads(run_json.read_text())
            except (OSError, ValueError) as exc:
                problems.append(Problem("run.json", 1, f"unreadable: {exc}"))
            else:
                try:
                    from mlatrace.trace.run_info import run_problem
                except ImportError:   # no msgspec (the H200 image): read leniently
                    def run_problem(run: Any) -> str | None:
                        return None if isinstance(run, dict) else "not a JSON object"
                problem = run_problem(run)
                if problem:
                    problems.append(Problem("run.json", 1, problem))
                    run = run if isinstance(run, dict) else None   # a list reads as no run.json
            if isinstance(run, dict) and run.get("abnormal_end"):
                problems.append(Problem("run.json", 0, "the run ended abnormally: "
                                        f"{run['abnormal_end']}"))
        if not files and run is None:
            raise TraceError(f"{root}: no trace here (no run.json and no p<pid>.jsonl files)")
        if not files:
            problems.append(Problem("run.json", 0, "no process files: nothing was traced "
                                    "(was the command a Python program?)"))
    else:
        raise TraceError(f"{root}: not a trace directory")
    processes = []
    for file in files:
        proc = ProcessFile(file, problems)
        proc.read_header()
        processes.append(proc)
    return Trace(root, run, processes, problems, dirs=[root], runs=[run] if run else [])

