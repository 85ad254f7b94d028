"""Starting and stopping this process's recorder, the exit and fork hooks, and what
every `process.end` carries. The state lives in `record.state.STATE`."""

from __future__ import annotations

import atexit
import os
from collections.abc import Callable
from typing import Any

from mlatrace.record.process_info import host_out_dir
from mlatrace.record.recorder import Recorder
from mlatrace.record.state import STATE
from mlatrace.settings import settings


def add_close_hook(hook: Callable[[], None]) -> None:
    """Run `hook()` when any recorder closes, before its last flush (records may be added)."""
    if hook not in STATE.close_hooks:
        STATE.close_hooks.append(hook)


def remove_close_hook(hook: Callable[[], None]) -> None:
    if hook in STATE.close_hooks:
        STATE.close_hooks.remove(hook)


def set_end_info(name: str, info: Callable[[], Any] | None, once: bool = False) -> None:
    """Have `process.end` carry `name: info()` (None removes it); info must be quick.

    once: only the next `process.end` written carries it (a snapshot taken at uninstall).
    """
    STATE.end_info_once.discard(name)
    if info is None:
        STATE.end_info.pop(name, None)
        return
    STATE.end_info[name] = info
    if once:
        STATE.end_info_once.add(name)


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
    if STATE.recorder is not None:
        STATE.recorder.close("restart")
    recorder = STATE.recorder = Recorder(out_dir, run_id=run_id, ranks=ranks,
                                         replay_sample=replay_sample, ppid=ppid,
                                         fold_s=fold_s, max_mb=max_mb, state=STATE)
    if not hold_header:
        recorder.started()
    return recorder


def stop(reason: str = "exit") -> None:
    """Close the running recorder (flush, `process.end`)."""
    recorder = STATE.recorder
    if recorder is not None:
        recorder.close(reason)      # its close hooks may still record (sampling runs)
        if STATE.recorder is recorder:
            STATE.recorder = None


def start_from_env() -> Recorder | None:
    """Start recording as configured by MLATRACE_* (the bootstrap of every traced process)."""
    config = settings()
    if config["disabled"] or not config["out"]:
        return None
    out = host_out_dir(config["out"], config["run_id"])
    recorder = start(out, run_id=config["run_id"], ranks=config["ranks"],
                     replay_sample=config["replay_sample"], hold_header=True,
                     fold_s=config["fold"], max_mb=config["max_mb"])
    if not STATE.hooks_registered:
        STATE.hooks_registered = True
        atexit.register(stop, "exit")
        os.register_at_fork(after_in_child=restart_in_forked_child)
    return recorder


def restart_in_forked_child() -> None:
    """A forked child gets its own file and flush thread; the parent's queue is not its own.
    It keeps STATE: its recorder's process.end carries the same parts."""
    parent = STATE.recorder
    if parent is None:
        return
    parent.abandon()
    recorder = STATE.recorder = Recorder(
        parent.out_dir, run_id=parent.run_id, ppid=parent.pid, ranks=parent.ranks,
        replay_sample=parent.replay_sample, lazy_file=True, fold_s=parent.fold_s,
        max_mb=parent.max_mb, state=STATE)
    recorder.probes = list(parent.probes)
    recorder.started()
