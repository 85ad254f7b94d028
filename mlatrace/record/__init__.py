"""Per-process trace writer: one `p<pid>.jsonl` per traced process.

The face of the package: the functions probes call (`emit`, `emit_replay`, ...), which
reach this process's running recorder through `state.STATE`, and the names the rest of
mlatrace uses. The writer is `recorder.Recorder` (its hot path, `add`, queues and
returns; a flush thread writes), its encoders `encode`, the process header's facts
`process_info`, starting, stopping and the fork hook `lifecycle`, folding `fold`.
Only the standard library (and msgspec, when present) is imported here: this package
runs in every process of a serving engine.
"""

from __future__ import annotations

from typing import Any

from mlatrace import SCHEMA
from mlatrace.record.lifecycle import (
    add_close_hook,
    remove_close_hook,
    restart_in_forked_child,
    set_end_info,
    start,
    start_from_env,
    stop,
)
from mlatrace.record.process_info import host_out_dir
from mlatrace.record.recorder import KEEP_AT_CAP, MAX_PENDING, Recorder, Sink
from mlatrace.record.state import STATE, ProcessState
from mlatrace.settings import (
    DEFAULT_FOLD_S,
    DEFAULT_LAUNCH_SAMPLE,
    DEFAULT_REPLAY_TIMING,
    DEFAULT_SAMPLE,
    DEFAULT_STEP_ASIDE,
    parse_replay_timing,
    parse_seconds,
    parse_step_aside,
    settings,
)

_restart_in_forked_child = restart_in_forked_child


def emit(kind: str, **fields: Any) -> None:
    """Record one event of `kind` in this process's trace; a no-op when not tracing."""
    recorder = STATE.recorder
    if recorder is not None:
        recorder.add(kind, fields)


def emit_fields(kind: str, fields: dict) -> None:
    """emit(kind, **fields) for fields already in a dict, which the recorder keeps as is."""
    recorder = STATE.recorder
    if recorder is not None:
        recorder.add(kind, fields)


def emit_replay(gid: int, **fields: Any) -> None:
    """Record a `graph.replay` of `gid` (exact count in `n`, sampled by --replay-sample)."""
    recorder = STATE.recorder
    if recorder is not None:
        recorder.add_replay(gid, fields)


def active() -> bool:
    """True when this process is being traced."""
    return STATE.recorder is not None


def current() -> Recorder | None:
    """The running recorder, if any."""
    return STATE.recorder


def set_rank(rank: int, world_size: int | None = None) -> None:
    """Tell the recorder this process's rank (probes call this when they learn it)."""
    recorder = STATE.recorder
    if recorder is not None:
        recorder.set_rank(rank, world_size)


def set_probes(names: list[str]) -> None:
    """Name the installed probe packs in the header."""
    recorder = STATE.recorder
    if recorder is not None:
        recorder.probes = list(names)
        recorder.started()



def flush_now(timeout_s: float = 0.2) -> None:
    """Write what is queued now (a signal arrived); skipped if the writer stays busy."""
    recorder = STATE.recorder
    if recorder is not None:
        recorder.flush(timeout_s)


def end_now(reason: str, timeout_s: float = 0.2) -> None:
    """Write what is queued and a `process.end` now, and keep recording (see Recorder)."""
    recorder = STATE.recorder
    if recorder is not None:
        recorder.end_now(reason, timeout_s)


def count_sampled_launch() -> None:
    """An eager kernel launch left out by the launch sampling (counted in process.end)."""
    recorder = STATE.recorder
    if recorder is not None:
        recorder.sampled_kinds["kernel.launch"] += 1


def count_sampled(kind: str, n: int = 1) -> None:
    """Records of `kind` that eager sampling left out (counted in process.end)."""
    recorder = STATE.recorder
    if recorder is not None:
        recorder.sampled_kinds[kind] += n


def note_probe_error() -> None:
    """Count a probe failure for `process.end`."""
    recorder = STATE.recorder
    if recorder is not None:
        recorder.probe_errors += 1


def add_sink(sink: Sink) -> None:
    """Hand every flushed batch of records to `sink` too (live export)."""
    recorder = STATE.recorder
    if recorder is not None:
        recorder.add_sink(sink)



__all__ = [
    "DEFAULT_FOLD_S", "DEFAULT_LAUNCH_SAMPLE", "DEFAULT_REPLAY_TIMING", "DEFAULT_SAMPLE",
    "DEFAULT_STEP_ASIDE", "KEEP_AT_CAP", "MAX_PENDING", "SCHEMA", "STATE", "ProcessState",
    "Recorder", "Sink", "active", "add_close_hook", "add_sink", "count_sampled",
    "count_sampled_launch", "current", "emit", "emit_fields", "emit_replay", "end_now",
    "flush_now", "host_out_dir", "note_probe_error", "parse_replay_timing", "parse_seconds",
    "parse_step_aside", "remove_close_hook", "set_end_info", "set_probes", "set_rank",
    "settings", "start", "start_from_env", "stop",
]
