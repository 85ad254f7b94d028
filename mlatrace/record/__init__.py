"""Per-process trace writer: one `p<pid>.jsonl` per traced process.

The hot path (`Recorder.add`) appends a tuple to a deque and returns: no encoding,
no lock, no I/O. A daemon thread drains the deque every 200 ms (or sooner when 512
records are pending) and appends their JSON lines to the file, so a SIGKILLed process
leaves a valid file up to its last flush. It encodes in chunks of `CHUNK_RECORDS`
records, with msgspec (one `encode_lines` call per chunk) where it can be imported and
with stdlib json where not, and hands the GIL back between chunks, so it never holds it
long. When the program records faster than the thread writes (more than `max_pending`
records waiting) the producer waits for the writer, at most `BACKPRESSURE_S` at a time,
instead of dropping: the queue stays bounded and nothing is lost. Only a writer that
makes no progress in that time (a stuck disk) makes records drop; they are counted and
`seq` keeps counting, so drops show as gaps. Only the standard library (and msgspec,
when present) is imported here: this module runs in every process of a serving engine.

`process.end` counts every record kind exactly: `counts` is what the program emitted
per kind (written, sampled out, or dropped), `sampled` what sampling left out.
"""

from __future__ import annotations

import atexit
import collections
import itertools
import json
import os
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from mlatrace.record import fold as _fold
from mlatrace.record.redact import allowed_env, redact_argv

SCHEMA = "mlatrace/1"
FLUSH_INTERVAL_S = 0.2
FLUSH_EVERY_RECORDS = 512
MAX_PENDING = 200_000
YIELD_EVERY_RECORDS = 64
CHUNK_RECORDS = 1024
BACKPRESSURE_S = 0.25
DEFAULT_LAUNCH_SAMPLE = 8
DEFAULT_SAMPLE = 1
DEFAULT_STEP_ASIDE = (8, 64)
DEFAULT_REPLAY_TIMING = (8, 64)   # time the first 8 replays of each graph, then 1 in 64
CLOSE_TIMEOUT_S = 2.0
DEFAULT_FOLD_S = _fold.FOLD_S
# what a process file keeps once it reached --max-mb: captures, errors, folds and the
# records that rules read when they are written in full (changes: folding writes a
# set-up record or replay in full only when it differs from the step before)
KEEP_AT_CAP = frozenset(("process", "process.end", "process.rank", "process.info", "device",
                         "graph.capture.begin", "graph.capture.end", "graph.nodes",
                         "graph.eager_break", "probe.error", "record.error", "kernel.skip", "steady",
                         "sync",
                         "mark"))

_VERSIONED = ("torch", "triton", "vllm", "aiter", "sglang", "flashinfer")
"""Libraries whose installed version each process header records."""

Sink = Callable[[list[dict]], None]


def settings(environ: dict[str, str] | os._Environ | None = None) -> dict[str, Any]:
    """The MLATRACE_* settings of this process, parsed (the probe engine reads them too)."""
    env = os.environ if environ is None else environ
    ranks = env.get("MLATRACE_RANKS") or ""
    sample = env.get("MLATRACE_REPLAY_SAMPLE") or ""
    launch = env.get("MLATRACE_LAUNCH_SAMPLE") or ""
    calls = env.get("MLATRACE_SAMPLE") or ""
    call_sample = int(calls) if calls.isdigit() else DEFAULT_SAMPLE
    timing = env.get("MLATRACE_REPLAY_TIMING")
    return {
        "out": env.get("MLATRACE_OUT") or None,
        "run_id": env.get("MLATRACE_RUN_ID") or None,
        "ranks": {int(r) for r in ranks.split(",") if r.strip()} or None,
        "replay_sample": int(sample) if sample.isdigit() and int(sample) > 0 else None,
        # eager probed calls repeating their last record (all fields but `layer`): keep
        # the first N of each run, count the rest, close the run with a sample.run
        # record (0: keep all). Launches follow it unless MLATRACE_LAUNCH_SAMPLE is set.
        "sample": call_sample,
        "launch_sample": int(launch) if launch.isdigit() else call_sample,
        "graph_nodes": env.get("MLATRACE_GRAPH_NODES", "1") != "0",
        # replay GPU time: (first, every) = the first N replays of each graph, then 1 in M;
        # None = off ("off" or "0")
        "replay_timing": parse_replay_timing(timing),
        "probes": [p for p in (env.get("MLATRACE_PROBES") or "").split(os.pathsep) if p],
        "otlp": env.get("MLATRACE_OTLP") or None,
        "disabled": env.get("MLATRACE_DISABLE", "0") not in ("", "0"),
        # probes that look at only the first call of each steady step (sampling.StepAside):
        # (settle, verify) steps; None = off ("0")
        "step_aside": parse_step_aside(env.get("MLATRACE_STEP_ASIDE")),
        # steady steps folded into `steady` records, one per graph and this many seconds
        # (record.fold); 0 = off
        "fold": parse_seconds(env.get("MLATRACE_FOLD"), DEFAULT_FOLD_S),
        # per process file: at this many MB keep only KEEP_AT_CAP and changes; None = no cap
        "max_mb": parse_seconds(env.get("MLATRACE_MAX_MB"), None),
    }


def parse_seconds(text: str | None, default: float | None) -> float | None:
    """A non-negative number setting (MLATRACE_FOLD, MLATRACE_MAX_MB); unset or bad -> default."""
    if text is None or not text.strip():
        return default
    try:
        value = float(text)
    except ValueError:
        return default
    return value if value >= 0 and value == value and value != float("inf") else default


def parse_step_aside(text: str | None) -> tuple[int, int] | None:
    """MLATRACE_STEP_ASIDE "SETTLE,VERIFY" -> (SETTLE, VERIFY); unset -> the default;
    "0", "off" or anything else -> None (every call inspected)."""
    if text is None or text == "":
        return DEFAULT_STEP_ASIDE
    settle, _, verify = text.partition(",")
    if not (settle.isdigit() and verify.isdigit()) or int(settle) < 1 or int(verify) < 2:
        return None
    return int(settle), int(verify)


def parse_replay_timing(text: str | None) -> tuple[int, int] | None:
    """MLATRACE_REPLAY_TIMING "N:M" -> (N, M); unset -> the default; "off"/"0"/bad -> None."""
    if text is None or text == "":
        return DEFAULT_REPLAY_TIMING
    first, _, every = text.partition(":")
    if not (first.isdigit() and every.isdigit()) or int(every) < 1:
        return None
    return int(first), int(every)


def _env_rank() -> tuple[int | None, int | None]:
    def as_int(name: str) -> int | None:
        value = os.environ.get(name, "")
        return int(value) if value.lstrip("-").isdigit() else None

    rank = as_int("RANK")
    if rank is None:
        rank = as_int("LOCAL_RANK")
    return rank, as_int("WORLD_SIZE")


def _process_argv() -> list[str]:
    """The real command line (/proc/self/cmdline), falling back to sys.argv."""
    try:
        with open("/proc/self/cmdline", "rb") as f:
            raw = f.read()
        args = [a.decode(errors="replace") for a in raw.split(b"\0") if a]
        if args:
            return args
    except OSError:
        pass
    return [sys.executable, *getattr(sys, "argv", [])]


def _versions() -> dict[str, str | None]:
    from mlatrace import __version__
    from mlatrace.common import installed_version

    found: dict[str, str | None] = {"python": sys.version.split()[0], "mlatrace": __version__}
    for library in _VERSIONED:
        found[library] = installed_version(library)
    return found


def _json_default(obj: object) -> object:
    """Encode what json cannot: tuples come as lists already; others as a short repr."""
    if isinstance(obj, (set, frozenset)):
        return sorted(obj, key=repr)
    if isinstance(obj, bytes):
        return obj.decode(errors="replace")
    for cast in (int, float):
        try:
            return cast(obj)  # numpy scalars, torch.Size items, enums with int values
        except Exception:
            pass
    return repr(obj)[:200]


# Built once: json.dumps with non-default arguments builds an encoder per call.
_ENCODER = json.JSONEncoder(separators=(",", ":"), default=_json_default)


def _fast_encoder() -> Callable[[Any], str] | None:
    """_ENCODER.encode without its per-call set-up: one C encoder made once, reused.

    JSONEncoder.encode builds a new C encoder (and a circular-reference table) for
    every record; this one is built once, without the table (a circular record raises
    RecursionError here, and the caller then encodes it with _ENCODER, which gives the
    error it always gave). None when the C encoder is missing or its output differs.
    """
    try:
        from json.encoder import c_make_encoder, encode_basestring_ascii

        if c_make_encoder is None:
            return None
        make = c_make_encoder(None, _json_default, encode_basestring_ascii, None, ":", ",",
                              False, False, True)
        join = "".join

        def encode(obj: Any) -> str:
            return join(make(obj, 0))

        sample = {"k": "x\u00e9\n", "t": 1, "a": [1, 2.5, None, True, False, (3, 4)],
                  "b": {"c": float("inf"), "d": {}}, "e": {2, 1}, "f": b"x", "g": object}
        if encode(sample) != _ENCODER.encode(sample):
            return None
        return encode
    except Exception:
        return None


_FAST_ENCODE = _fast_encoder()


def _msgspec_encode() -> Callable[[Any], bytes] | None:
    """msgspec's JSON encoder (a fraction of a microsecond per record), when it imports.

    Types msgspec does not know go through the same default as the json path.
    """
    try:
        import msgspec

        return msgspec.json.Encoder(enc_hook=_json_default).encode
    except Exception:
        return None


# msgspec encodes at add time (see Recorder.add); without it records are queued as dicts
# and the flush thread encodes them with stdlib json, while the program is in GIL-free
# calls (a CUDA launch, say): the C encoder costs a few us per record, too much for the
# hot path of a traced GPU program.
_ENCODE_NOW = _msgspec_encode() if os.environ.get("MLATRACE_JSON") != "stdlib" else None
_ESCAPE = json.encoder.encode_basestring_ascii
_clock = time.perf_counter_ns
_thread_id = threading.get_ident


def _encode(record: dict) -> str:
    """One record as a JSON line (raises as _ENCODER.encode does)."""
    if _FAST_ENCODE is not None:
        try:
            return _FAST_ENCODE(record)
        except Exception:
            pass
    return _ENCODER.encode(record)


def _line_of(record: dict) -> str:
    """A record's JSON line; a record.error line (same t/seq/tid) if it cannot be encoded."""
    try:
        return _encode(record)
    except Exception as exc:  # keep seq so the reader does not see a phantom drop
        return json.dumps({"k": "record.error", "t": record.get("t", 0),
                           "seq": record.get("seq", 0), "tid": record.get("tid", 0),
                           "kind": str(record.get("k")), "error": repr(exc)[:200]})


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
    ) -> None:
        self.out_dir = out_dir
        self.run_id = run_id
        self.pid = os.getpid()
        self.ppid = os.getppid() if ppid is None else ppid
        self.ranks = ranks
        self.replay_sample = replay_sample
        self.max_pending = max_pending
        self.flush_interval = flush_interval
        self.rank, self.world_size = _env_rank()
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
        self._encode_now = _ENCODE_NOW     # None while sinks need the records as dicts
        self._drained = threading.Event()
        self._writer_ident: int | None = None
        self.replays: dict[int, int] = {}
        self.folded_kinds: collections.defaultdict = collections.defaultdict(int)
        self.fold_s = fold_s or 0.0
        self._folder = _fold.Folder(fold_s, self._put, self._count_folded) if fold_s else None
        # the size cap: bytes written so far, the cap (None: none), what it left out
        self.max_mb = max_mb
        self.max_bytes = None if max_mb is None else int(max_mb * 1_000_000)
        self.bytes_written = 0
        self.capped = self.max_bytes == 0
        self.capped_at_ns: int | None = 0 if self.capped else None
        self.capped_kinds: collections.defaultdict = collections.defaultdict(int)
        self.write_error: str | None = None
        self._seq = itertools.count(1)
        self._pending: deque = deque()
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
        if folder is not None:
            tid = _thread_id()
            t = fields["t"] = _clock() - self.t0
            if not folder.take(kind, fields, t, tid):
                self._put(kind, fields, tid)
            return
        pending = self._pending
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

    def _put(self, kind: str, fields: dict, tid: int) -> None:
        """Queue a record whose `t` is set (folding on: what the folder writes in full)."""
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
        exactly per gid and in the sampled graph.replay records."""
        self.replays[gid] = self.replays.get(gid, 0) + 1
        self.sampled_out += 1
        self.sampled_kinds["graph.replay"] += 1

    def add_replay(self, gid: int, fields: dict) -> None:
        """Queue a graph.replay, counting replays per gid exactly and sampling the records."""
        n = self.replays.get(gid, 0) + 1
        self.replays[gid] = n
        sample = self.replay_sample
        if sample and n > sample and n % sample:
            self.sampled_out += 1
            self.sampled_kinds["graph.replay"] += 1
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
            self._write_lines([self.header()])
            self._header_written = True
        pending = self._pending
        first = True
        while pending:
            if not first:
                # Between chunks the program gets the GIL back; with a producer waiting
                # in _make_room, the drain goes on at once.
                time.sleep(0)
            first = False
            batch = [pending.popleft() for _ in range(min(len(pending), CHUNK_RECORDS))]
            if len(pending) <= self.max_pending // 2:
                self._stalled = False
                self._drained.set()
            if not self._sinks:
                self._write_items(batch)
                continue
            records = [json.loads(item) if type(item) is bytes else item for item in batch]
            self._write_lines(records)
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
        for kind, n in self.sampled_kinds.items():
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
            "sampled_out": self.sampled_out,
            "launches_sampled_out": self.sampled_kinds.get("kernel.launch", 0),
            "probe_errors": self.probe_errors,
            "sink_errors": self.sink_errors,
            "counts": dict(sorted(counts.items())),
            "sampled": dict(sorted(self.sampled_kinds.items())),
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
        for name, info in list(_end_info.items()):
            try:
                end[name] = info()
            except Exception as exc:  # never lose the end record for a part of it
                end[name] = {"error": repr(exc)[:200]}
            if final and name in _end_info_once:
                _end_info.pop(name, None)
                _end_info_once.discard(name)
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
                self._write_lines([self._end_record(reason)])
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
        for hook in _close_hooks + self._close_hooks:
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
            self._write_lines([end])
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
        from mlatrace import __version__

        return {
            "k": "process",
            "t": 0,
            "seq": 0,
            "tid": threading.main_thread().ident,
            "schema": SCHEMA,
            "pid": self.pid,
            "ppid": self.ppid,
            "run_id": self.run_id,
            "host": socket.gethostname(),
            "argv": redact_argv(_process_argv()),
            "env": allowed_env(os.environ),
            "rank": self.rank,
            "world_size": self.world_size,
            "wall_ns": self.wall_ns,
            "versions": _versions(),
            "device": None,
            "probes": list(self.probes),
            "ranks_kept": sorted(self.ranks) if self.ranks else None,
            "replay_sample": self.replay_sample,
            "sample": settings().get("sample"),
            "fold_s": self.fold_s,
            "max_mb": self.max_mb,
            "mlatrace": __version__,
        }

    def _write_lines(self, records: list[dict]) -> None:
        lines = []
        for i, record in enumerate(records):
            if i and not i % YIELD_EVERY_RECORDS:
                time.sleep(0)  # hand the GIL back: the traced program never waits on encoding
            lines.append(_line_of(record))
        self._write_text(lines)

    def _write_items(self, items: list) -> None:
        """Write queued records: JSON bytes as they are, dicts through the json path."""
        if all(type(item) is bytes for item in items):
            self._write_bytes(b"\n".join(items) + b"\n")
            return
        parts = []
        for i, item in enumerate(items):
            if type(item) is bytes:
                parts.append(item)
                continue
            if i and not i % YIELD_EVERY_RECORDS:
                time.sleep(0)  # hand the GIL back: the traced program never waits on encoding
            parts.append(_line_of(item).encode())
        self._write_bytes(b"\n".join(parts) + b"\n")

    def _write_text(self, lines: list[str]) -> None:
        self._write_bytes(("\n".join(lines) + "\n").encode())

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


_recorder: Recorder | None = None
_hooks_registered = False
# name -> callable giving an extra field of process.end (the probe engine's coverage);
# module-level so that a forked child's recorder writes it too
_end_info: dict[str, Callable[[], Any]] = {}
_end_info_once: set[str] = set()   # names given once=True: dropped after one process.end

_close_hooks: list[Callable[[], None]] = []


def add_close_hook(hook: Callable[[], None]) -> None:
    """Run `hook()` when any recorder closes, before its last flush (records may be added)."""
    if hook not in _close_hooks:
        _close_hooks.append(hook)


def remove_close_hook(hook: Callable[[], None]) -> None:
    if hook in _close_hooks:
        _close_hooks.remove(hook)


def emit(kind: str, **fields: Any) -> None:
    """Record one event of `kind` in this process's trace; a no-op when not tracing."""
    recorder = _recorder
    if recorder is not None:
        recorder.add(kind, fields)


def emit_fields(kind: str, fields: dict) -> None:
    """emit(kind, **fields) for fields already in a dict, which the recorder keeps as is."""
    recorder = _recorder
    if recorder is not None:
        recorder.add(kind, fields)


def emit_replay(gid: int, **fields: Any) -> None:
    """Record a `graph.replay` of `gid` (exact count in `n`, sampled by --replay-sample)."""
    recorder = _recorder
    if recorder is not None:
        recorder.add_replay(gid, fields)


def active() -> bool:
    """True when this process is being traced."""
    return _recorder is not None


def current() -> Recorder | None:
    """The running recorder, if any."""
    return _recorder


def set_rank(rank: int, world_size: int | None = None) -> None:
    """Tell the recorder this process's rank (probes call this when they learn it)."""
    recorder = _recorder
    if recorder is not None:
        recorder.set_rank(rank, world_size)


def set_probes(names: list[str]) -> None:
    """Name the installed probe packs in the header."""
    recorder = _recorder
    if recorder is not None:
        recorder.probes = list(names)
        recorder.started()


def set_end_info(name: str, info: Callable[[], Any] | None, once: bool = False) -> None:
    """Have `process.end` carry `name: info()` (None removes it); info must be quick.

    once: only the next `process.end` written carries it (a snapshot taken at uninstall).
    """
    _end_info_once.discard(name)
    if info is None:
        _end_info.pop(name, None)
        return
    _end_info[name] = info
    if once:
        _end_info_once.add(name)


def flush_now(timeout_s: float = 0.2) -> None:
    """Write what is queued now (a signal arrived); skipped if the writer stays busy."""
    recorder = _recorder
    if recorder is not None:
        recorder.flush(timeout_s)


def end_now(reason: str, timeout_s: float = 0.2) -> None:
    """Write what is queued and a `process.end` now, and keep recording (see Recorder)."""
    recorder = _recorder
    if recorder is not None:
        recorder.end_now(reason, timeout_s)


def count_sampled_launch() -> None:
    """An eager kernel launch left out by the launch sampling (counted in process.end)."""
    recorder = _recorder
    if recorder is not None:
        recorder.sampled_kinds["kernel.launch"] += 1


def count_sampled(kind: str, n: int = 1) -> None:
    """Records of `kind` that eager sampling left out (counted in process.end)."""
    recorder = _recorder
    if recorder is not None:
        recorder.sampled_kinds[kind] += n


def note_probe_error() -> None:
    """Count a probe failure for `process.end`."""
    recorder = _recorder
    if recorder is not None:
        recorder.probe_errors += 1


def add_sink(sink: Sink) -> None:
    """Hand every flushed batch of records to `sink` too (live export)."""
    recorder = _recorder
    if recorder is not None:
        recorder.add_sink(sink)


def start(
    out_dir: str,
    *,
    run_id: str | None = None,
    ranks: set[int] | None = None,
    replay_sample: int | None = None,
    ppid: int | None = None,
    hold_header: bool = False,
    fold_s: float | None = None,
    max_mb: float | None = None,
) -> Recorder:
    """Start recording this process into `out_dir` (replacing any running recorder).

    With `hold_header`, the first write waits for `set_probes()` (or 5 s) so the
    header can list the installed probe packs. `fold_s`: fold steady steps into
    `steady` records of this many seconds (record.fold; None or 0: off). `max_mb`: the
    size cap of the file (None: none).
    """
    global _recorder
    if _recorder is not None:
        _recorder.close("restart")
    _recorder = Recorder(out_dir, run_id=run_id, ranks=ranks, replay_sample=replay_sample,
                         ppid=ppid, fold_s=fold_s, max_mb=max_mb)
    if not hold_header:
        _recorder.started()
    return _recorder


def stop(reason: str = "exit") -> None:
    """Close the running recorder (flush, `process.end`)."""
    global _recorder
    recorder = _recorder
    if recorder is not None:
        recorder.close(reason)      # its close hooks may still record (sampling runs)
        if _recorder is recorder:
            _recorder = None


def host_out_dir(out: str, run_id: str | None = None) -> str:
    """This host's trace directory: `out` on the launcher's host (MLATRACE_HOST), `out/<host>`
    on any other (a Ray worker on another node writes there, on its own disk). Where that
    cannot be made, `$TMPDIR/mlatrace-trace/<run_id>/<host>`, said once on stderr."""
    host = socket.gethostname()
    launcher_host = os.environ.get("MLATRACE_HOST")
    if launcher_host and launcher_host != host:
        out = os.path.join(out, host)
    try:
        os.makedirs(out, exist_ok=True)
        if os.access(out, os.W_OK):
            return out
    except OSError:
        pass
    fallback = os.path.join(os.environ.get("TMPDIR") or "/tmp", "mlatrace-trace",
                            run_id or "no-run-id", host)
    sys.stderr.write(f"mlatrace: cannot write {out} on {host}; pid {os.getpid()} traces "
                     f"into {fallback}\n")
    return fallback


def start_from_env() -> Recorder | None:
    """Start recording as configured by MLATRACE_* (the bootstrap of every traced process)."""
    config = settings()
    if config["disabled"] or not config["out"]:
        return None
    out = host_out_dir(config["out"], config["run_id"])
    recorder = start(out, run_id=config["run_id"], ranks=config["ranks"],
                     replay_sample=config["replay_sample"], hold_header=True,
                     fold_s=config["fold"], max_mb=config["max_mb"])
    global _hooks_registered
    if not _hooks_registered:
        _hooks_registered = True
        atexit.register(stop, "exit")
        os.register_at_fork(after_in_child=_restart_in_forked_child)
    return recorder


def _restart_in_forked_child() -> None:
    """A forked child gets its own file and flush thread; the parent's queue is not its own."""
    global _recorder
    parent = _recorder
    if parent is None:
        return
    parent.abandon()
    _recorder = Recorder(parent.out_dir, run_id=parent.run_id, ppid=parent.pid,
                         ranks=parent.ranks, replay_sample=parent.replay_sample,
                         lazy_file=True, fold_s=parent.fold_s, max_mb=parent.max_mb)
    _recorder.probes = list(parent.probes)
    _recorder.started()
