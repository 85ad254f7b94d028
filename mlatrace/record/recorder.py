"""Per-process trace writer: one `p<pid>.jsonl` per traced process.

The hot path (`Recorder.add`) stamps the record, encodes it with msgspec where it can
be imported (a JSON bytes line) and appends it to a list: no lock, no I/O. A daemon
thread drains the list every 200 ms (or sooner when 512 records are pending) and appends
the lines to the file, so a SIGKILLed process leaves a valid file up to its last flush.
It takes the list's front in chunks of `CHUNK_RECORDS` records, writes each with one
join (records queued as dicts, without msgspec, are encoded there with stdlib json) and
hands the GIL back between chunks, so it never holds it long. When the program records
faster than the thread writes (more than `max_pending` records waiting) the producer
waits for the writer, at most `BACKPRESSURE_S` at a time, instead of dropping: the queue
stays bounded and nothing is lost. Only a writer that makes no progress in that time (a
stuck disk) makes records drop; they are counted and `seq` keeps counting, so drops show
as gaps. Only the standard library (and msgspec, when present) is imported here: this
module runs in every process of a serving engine.

`process.end` counts every record kind exactly: `counts` is what the program emitted
per kind (written, sampled out, or dropped), `sampled` what sampling left out.
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import sys
import threading
import time
from collections.abc import Callable

import mlatrace.record.fold as _fold
from mlatrace import kinds
from mlatrace.record.encode import encode_now, lines_bytes
from mlatrace.record.process_info import env_rank, process_header
from mlatrace.record.state import STATE, ProcessState

FLUSH_INTERVAL_S = 0.2
FLUSH_EVERY_RECORDS = 512
MAX_PENDING = 200_000
CHUNK_RECORDS = 1024
BACKPRESSURE_S = 0.25
CLOSE_TIMEOUT_S = 2.0
# what a process file keeps once it reached --max-mb: captures, errors, folds and the
# records that rules read when they are written in full (changes: folding writes a
# set-up record or replay in full only when it differs from the step before)
KEEP_AT_CAP = kinds.AT_CAP
# kinds Folder.take does more with than note on an idle thread (add's short path skips it)
_FOLDED_OR_PASSED = _fold.FOLDABLE | _fold.PASS

Sink = Callable[[list[dict]], None]
_clock = time.perf_counter_ns
_thread_id = threading.get_ident


class Recorder:
    """Buffers this process's records and writes them to `<out_dir>/p<pid>.jsonl`."""

    def __init__(
        self,
        out_dir: str,
        *,
        run_id: str | None = None,
        ppid: int | None = None,
        ranks: set[int] | None = None,
        replay_sample: int | None = None,
        max_pending: int = MAX_PENDING,
        flush_interval: float = FLUSH_INTERVAL_S,
        lazy_file: bool = False,
        fold_s: float | None = None,
        max_mb: float | None = None,
        state: ProcessState = STATE,
    ) -> None:
        self.out_dir = out_dir
        self._state = state     # this process's end-info parts and close hooks
        self.run_id = run_id
        self.pid = os.getpid()
        self.ppid = os.getppid() if ppid is None else ppid
        self.ranks = ranks
        self.replay_sample = replay_sample
        self.max_pending = max_pending
        self.flush_interval = flush_interval
        self.rank, self.world_size = env_rank()
        self.enabled = ranks is None or self.rank is None or self.rank in ranks
        self.probes: list[str] = []
        self.dropped = 0
        self.sampled_out = 0
        self.probe_errors = 0
        self.sink_errors = 0
        self.task_errors = 0
        self.waits = 0
        # emitted (kept or dropped) and left out by sampling, per kind: defaultdicts, whose
        # `+= 1` costs a third of a Counter's on the hot path
        self.kinds: collections.defaultdict = collections.defaultdict(int)
        self.sampled_kinds: collections.defaultdict = collections.defaultdict(int)
        self._flush_tasks: list[Callable[[], None]] = []
        self._close_hooks: list[Callable[[], None]] = []
        self._stalled = False
        self._encode_now = encode_now()    # None while sinks need the records as dicts
        self._drained = threading.Event()
        self._writer_ident: int | None = None
        self.replays: dict[int, int] = {}
        # replays counted in `replays` that wrote no record (their probe stepped aside):
        # the probe bumps these two inline (no call); sampled_out and sampled count them
        self.unrecorded_replays = 0
        self.folded_kinds: collections.defaultdict = collections.defaultdict(int)
        self.fold_s = fold_s or 0.0
        self._folder = _fold.Folder(fold_s, self._put, self._count_folded) if fold_s else None
        # probes hand it the records they did not build (fold.Folder.hold), t from t0
        self.folder = self._folder
        # the size cap: bytes written so far, the cap (None: none), what it left out
        self.max_mb = max_mb
        self.max_bytes = None if max_mb is None else int(max_mb * 1_000_000)
        self.bytes_written = 0
        self.capped = self.max_bytes == 0
        self.capped_at_ns: int | None = 0 if self.capped else None
        self.capped_kinds: collections.defaultdict = collections.defaultdict(int)
        self.write_error: str | None = None
        self._seq = itertools.count(1)
        # the queue: a list, which the flush thread takes from the front in slices (the
        # producers only append; one flush at a time, under the write lock)
        self._pending: list = []
        self._sinks: list[Sink] = []
        self._wake = threading.Event()
        self._write_lock = threading.Lock()
        self._closed = False
        self._header_written = False
        # Set once the bootstrap knows the probes; until then the flush thread waits so that
        # the header (the file's first line) can name them. close() never waits.
        self._started = threading.Event()
        self.wall_ns = time.time_ns()
        self.t0 = time.perf_counter_ns()
        os.makedirs(out_dir, exist_ok=True)
        # lazy_file (a forked child): the file is made at the first write, so a child that
        # execs a program at once (subprocess with preexec_fn: Ray's raylet, GCS) leaves none.
        self.path: str | None = None
        self._fd: int | None = None
        self._file_pending = lazy_file
        if not lazy_file:
            self.path, self._fd = self._open_unique_file()
        self._thread = threading.Thread(target=self._flush_loop, name="mlatrace-flush", daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------- hot path
    def add(self, kind: str, fields: dict) -> None:
        """Queue one record. Never raises, never does I/O; waits only when the queue is full.

        The record is `fields` itself (the caller hands it over) with k, t, seq and tid
        added, encoded here when msgspec is at hand: a queued bytes line is no work for
        the garbage collector, while queued dicts are promoted and traversed by every
        full collection (1-2 us per record in a process holding torch), and the flush
        thread then only joins and writes.
        """
        if not self.enabled:
            return
        folder = self._folder
        pending = self._pending
        if folder is not None:
            tid = _thread_id()
            t = fields["t"] = _clock() - self.t0
            state = folder.threads.get(tid)
            if state is not None and state.fold is None and not state.held and not state.step \
                    and kind not in _FOLDED_OR_PASSED:
                state.last_kind = kind  # Folder.take of a kind it never holds, idle thread
            elif folder.take(kind, fields, t, tid):
                return
            # _put, inline (one call fewer per record)
            if self.capped and kind not in KEEP_AT_CAP and kind not in _fold.FOLDABLE:
                self.capped_kinds[kind] += 1
                return
            if len(pending) >= self.max_pending and not self._make_room(kind):
                return
            fields["k"] = kind
            fields["seq"] = next(self._seq)
            fields["tid"] = tid
        else:
            if len(pending) >= self.max_pending and not self._make_room(kind):
                return
            if self.capped and kind not in KEEP_AT_CAP:
                self.capped_kinds[kind] += 1
                return
            fields["k"] = kind
            fields["t"] = _clock() - self.t0
            fields["seq"] = next(self._seq)
            fields["tid"] = _thread_id()
        self.kinds[kind] += 1
        encode = self._encode_now
        if encode is not None:
            try:
                fields = encode(fields)
            except Exception:
                pass    # the flush thread writes what the json path makes of it
        pending.append(fields)
        if len(pending) == FLUSH_EVERY_RECORDS:
            self._wake.set()

    def add_keyed(self, kind: str, fields: dict) -> object:
        """add(), returning the key the fold gave the record (None: folding off, or the
        record is in no step): what a probe hands to hold() for its next call."""
        self.add(kind, fields)
        folder = self._folder
        if folder is None or not self.enabled:
            return None
        return folder.key_of_last(_thread_id(), fields)

    def _put(self, kind: str, fields: dict, tid: int) -> None:
        """Queue a record whose `t` is set (folding on: what the folder writes in full;
        add has its lines inline)."""
        if self.capped and kind not in KEEP_AT_CAP and kind not in _fold.FOLDABLE:
            self.capped_kinds[kind] += 1
            return
        pending = self._pending
        if len(pending) >= self.max_pending and not self._make_room(kind):
            return
        fields["k"] = kind
        fields["seq"] = next(self._seq)
        fields["tid"] = tid
        self.kinds[kind] += 1
        encode = self._encode_now
        if encode is not None:
            try:
                fields = encode(fields)
            except Exception:
                pass
        pending.append(fields)
        if len(pending) == FLUSH_EVERY_RECORDS:
            self._wake.set()

    def _count_folded(self, kind: str, n: int = 1) -> None:
        self.folded_kinds[kind] += n

    def close_folds(self) -> None:
        """Write every open fold and held step now (exit, a signal, uninstall)."""
        folder = self._folder
        if folder is not None:
            try:
                folder.close_all()
            except Exception:
                self.task_errors += 1

    def _make_room(self, kind: str) -> bool:
        """The queue is full: wait for the writer (bounded), else drop and count.

        The producer gives the writer the GIL and waits until it has drained the queue
        to half, as long as the writer makes progress; a writer that made no room in
        BACKPRESSURE_S is stalled (its disk, say), and records then drop without waiting
        until it drains.
        """
        if not self._stalled and threading.get_ident() != self._writer_ident \
                and self._thread.is_alive():
            self.waits += 1
            before = len(self._pending)
            while True:
                self._drained.clear()
                self._wake.set()
                self._drained.wait(BACKPRESSURE_S)
                now = len(self._pending)
                if now < self.max_pending:
                    return True
                if now >= before:       # no progress in BACKPRESSURE_S: a stalled writer
                    break
                before = now
            self._stalled = True
        next(self._seq)  # the gap in seq is how readers see the drop
        self.dropped += 1
        self.kinds[kind] += 1
        return False

    def count_sampled(self, kind: str, n: int = 1) -> None:
        """Records of `kind` that sampling left out (exact counts for process.end)."""
        self.sampled_kinds[kind] += n

    def count_replay(self, gid: int) -> None:
        """A replay of `gid` that writes no record (its probe stepped aside): counted
        exactly per gid and in the sampled graph.replay records. The replay probe's
        fast path does the same inline (handlers/torch_graph.GraphReplay.wrapper)."""
        replays = self.replays
        replays[gid] = replays.get(gid, 0) + 1
        self.unrecorded_replays += 1

    def _sampled(self) -> dict[str, int]:
        """sampled_kinds with the unrecorded replays counted in."""
        sampled = dict(self.sampled_kinds)
        if self.unrecorded_replays:
            sampled["graph.replay"] = sampled.get("graph.replay", 0) + self.unrecorded_replays
        return sampled

    def add_replay(self, gid: int, fields: dict) -> None:
        """Queue a graph.replay, counting replays per gid exactly and sampling the records.

        A replay of a held steady step with no fields of its own is held by the folder
        without its record being built (fold.Folder.replay)."""
        n = self.replays.get(gid, 0) + 1
        self.replays[gid] = n
        sample = self.replay_sample
        if sample and n > sample and n % sample:
            self.sampled_out += 1
            self.sampled_kinds["graph.replay"] += 1
            return
        folder = self._folder
        if folder is not None and not fields and self.enabled:
            tid = _thread_id()
            t = _clock() - self.t0
            if folder.replay(gid, n, t, tid):
                return
            fields = {"gid": gid, "n": n, "t": t}
            if not folder.take("graph.replay", fields, t, tid):
                self._put("graph.replay", fields, tid)
            return
        fields["gid"] = gid
        fields["n"] = n
        self.add("graph.replay", fields)

    # -------------------------------------------------------------- management
    def set_rank(self, rank: int, world_size: int | None = None) -> None:
        """Learn the rank after start (a probe found it): apply --ranks from now on."""
        self.rank = rank
        if world_size is not None:
            self.world_size = world_size
        self.enabled = True
        self.add("process.rank", {"rank": rank, "world_size": self.world_size})
        self.enabled = self.ranks is None or rank in self.ranks

    def add_sink(self, sink: Sink) -> None:
        """Also hand every flushed batch of records to `sink` (on the flush thread)."""
        self._encode_now = None
        self._sinks.append(sink)

    def remove_sink(self, sink: Sink) -> None:
        """Stop handing batches to `sink` (a batch under way may still reach it)."""
        self._sinks = [s for s in self._sinks if s is not sink]

    def flush(self, timeout_s: float = -1) -> None:
        """Write everything queued so far (called by the flush thread, exit and signals).

        A signal handler passes a timeout: the signal may interrupt this very thread
        inside a flush, and waiting for its own lock would never end.
        """
        if not self._write_lock.acquire(timeout=timeout_s):
            return
        try:
            self._flush_locked()
        finally:
            self._write_lock.release()

    def add_flush_task(self, task: Callable[[], None]) -> None:
        """Run `task()` on the flush thread before each flush (it may add records)."""
        self._flush_tasks.append(task)

    def add_close_hook(self, hook: Callable[[], None]) -> None:
        """Run `hook()` once in close(), before the last flush, so that records it adds
        (recorder.add) still reach the file; record.emit no longer reaches a stopped recorder."""
        if hook not in self._close_hooks:
            self._close_hooks.append(hook)

    def _run_tasks(self) -> None:
        for task in self._flush_tasks:
            try:
                task()
            except Exception:
                self.task_errors += 1

    def _flush_locked(self) -> None:
        if self._fd is None:
            if not self._file_pending:
                return
            self._file_pending = False
            self.path, self._fd = self._open_unique_file()
        if not self._header_written:
            self._write_bytes(lines_bytes([self.header()]))
            self._header_written = True
        pending = self._pending
        first = True
        while pending:
            if not first:
                # Between chunks the program gets the GIL back; with a producer waiting
                # in _make_room, the drain goes on at once.
                time.sleep(0)
            first = False
            # the front of the queue, then its removal: producers only append meanwhile
            batch = pending[:CHUNK_RECORDS]
            del pending[:len(batch)]
            if len(pending) <= self.max_pending // 2:
                self._stalled = False
                self._drained.set()
            if not self._sinks:
                self._write_bytes(lines_bytes(batch))
                continue
            records = [json.loads(item) if type(item) is bytes else item for item in batch]
            self._write_bytes(lines_bytes(records))
            for sink in self._sinks:
                try:
                    sink(records)
                except Exception:
                    self.sink_errors += 1
        self._stalled = False
        self._drained.set()

    def _end_record(self, reason: str, final: bool = False) -> dict:
        """A `process.end` for everything written so far (call with the write lock held).

        It carries each `set_end_info` part; a `once` part is dropped after the final end.
        """
        counts = dict(self.kinds)
        sampled = self._sampled()
        for kind, n in sampled.items():
            counts[kind] = counts.get(kind, 0) + n
        for kind, n in self.folded_kinds.items():
            counts[kind] = counts.get(kind, 0) + n
        for kind, n in self.capped_kinds.items():
            counts[kind] = counts.get(kind, 0) + n
        end_seq = next(self._seq)
        end = {
            "k": "process.end",
            "t": time.perf_counter_ns() - self.t0,
            "seq": end_seq,
            "tid": threading.get_ident(),
            "events": end_seq - 1,
            "dropped": self.dropped,
            "sampled_out": self.sampled_out + self.unrecorded_replays,
            "launches_sampled_out": sampled.get("kernel.launch", 0),
            "probe_errors": self.probe_errors,
            "sink_errors": self.sink_errors,
            "counts": dict(sorted(counts.items())),
            "sampled": dict(sorted(sampled.items())),
            "waits": self.waits,
            "replays": {str(gid): n for gid, n in self.replays.items()},
            "reason": reason,
        }
        if self._folder is not None:
            end["fold_s"] = self.fold_s
            end["folded"] = dict(sorted(self.folded_kinds.items()))
            end["folds"] = self._folder.folds
        if self.max_bytes is not None:
            end["cap"] = {"max_mb": self.max_mb, "reached": self.capped,
                          "reached_t": self.capped_at_ns,
                          "left_out": dict(sorted(self.capped_kinds.items())),
                          "kept": sorted(KEEP_AT_CAP | (_fold.FOLDABLE if self._folder else
                                                        frozenset()))}
        if self.write_error is not None:
            end["write_error"] = self.write_error
        end_info = self._state.end_info
        for name, info in list(end_info.items()):
            try:
                end[name] = info()
            except Exception as exc:  # never lose the end record for a part of it
                end[name] = {"error": repr(exc)[:200]}
            if final and name in self._state.end_info_once:
                end_info.pop(name, None)
                self._state.end_info_once.discard(name)
        return end

    def end_now(self, reason: str, timeout_s: float = 0.2) -> None:
        """Write what is queued and a `process.end` now, and keep recording.

        For a signal that usually ends the process (SIGTERM): its parent may SIGKILL it
        milliseconds later (vLLM's shutdown does), before atexit can run. If the process
        lives on, its later records follow and the exit writes another `process.end`;
        the last one in the file is the final one. Sinks (live export) see only that one.
        Bounded wait for the writer, as in `flush`.
        """
        if self._closed or not self._write_lock.acquire(timeout=timeout_s):
            return
        self.close_folds()
        try:
            self._flush_locked()
            if self._fd is not None:
                self._write_bytes(lines_bytes([self._end_record(reason)]))
        finally:
            self._write_lock.release()

    def close(self, reason: str = "exit", timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Flush, write `process.end` and close the file. Idempotent.

        Bounded wait for the writer: close may run in a signal handler that
        interrupted this thread's own flush.
        """
        if self._closed:
            return
        self.close_folds()      # before the hooks: a live sink they close still sees them
        for hook in self._state.close_hooks + self._close_hooks:
            try:
                hook()
            except Exception:
                self.task_errors += 1
        self.close_folds()
        self._closed = True
        self._wake.set()
        if not self._write_lock.acquire(timeout=timeout_s):
            return
        try:
            self._run_tasks()
            self._flush_locked()
            if self._fd is None:
                return
            end = self._end_record(reason, final=True)
            self._write_bytes(lines_bytes([end]))
            os.close(self._fd)
            self._fd = None
        finally:
            self._write_lock.release()
        for sink in self._sinks:
            try:
                sink([end])
            except Exception:
                self.sink_errors += 1

    def abandon(self) -> None:
        """Forget this recorder in a forked child: the parent owns the file and thread."""
        self._closed = True
        self._file_pending = False
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.close(fd)  # only the child's copy; the parent keeps writing
            except OSError:
                pass

    # --------------------------------------------------------------- internals
    def _open_unique_file(self) -> tuple[str, int]:
        # A re-exec'd interpreter keeps its pid: give it a second file, never append.
        for attempt in itertools.count():
            name = f"p{self.pid}.jsonl" if attempt == 0 else f"p{self.pid}.{attempt}.jsonl"
            path = os.path.join(self.out_dir, name)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
                return path, fd
            except FileExistsError:
                continue
        raise AssertionError("unreachable")

    def header(self) -> dict:
        """The `process` record that opens this process's file."""
        return process_header(self)

    def _write_bytes(self, data: bytes) -> None:
        fd = self._fd
        if fd is None or self.write_error is not None:
            return
        size = len(data)
        try:
            while data:
                written = os.write(fd, data)
                data = data[written:]
        except OSError as exc:
            # a full disk (or a file gone): say so once, stop tracing, never stop the program
            self.write_error = f"{type(exc).__name__}: {exc.strerror or exc}"
            self.enabled = False
            try:
                sys.stderr.write(f"mlatrace: pid {self.pid} cannot write {self.path}: "
                                 f"{self.write_error}; tracing stopped, the program goes on\n")
            except Exception:
                pass
            return
        self.bytes_written += size
        limit = self.max_bytes
        if limit is not None and not self.capped and self.bytes_written >= limit:
            self.capped = True
            self.capped_at_ns = time.perf_counter_ns() - self.t0

    def started(self) -> None:
        """The process set-up is done: the header may be written."""
        self._started.set()

    def _flush_loop(self) -> None:
        self._writer_ident = threading.get_ident()
        self._started.wait(5.0)
        while not self._closed:
            self._wake.wait(self.flush_interval)
            self._wake.clear()
            self._run_tasks()
            try:
                self.flush()
            except Exception:
                # The disk is full or gone: stop writing, never disturb the program.
                self.enabled = False
                self._drained.set()
                return

