"""What a process header says about its process: rank, command line, library versions,
the header record itself, and the host directory its trace goes to. Stdlib only."""

from __future__ import annotations

import os
import socket
import sys
import threading
from typing import Any

VERSIONED = ("torch", "triton", "vllm", "aiter", "sglang", "flashinfer")
"""Libraries whose installed version each process header records."""


def env_rank() -> tuple[int | None, int | None]:
    def as_int(name: str) -> int | None:
        value = os.environ.get(name, "")
        return int(value) if value.lstrip("-").isdigit() else None

    rank = as_int("RANK")
    if rank is None:
        rank = as_int("LOCAL_RANK")
    return rank, as_int("WORLD_SIZE")


def process_argv() -> list[str]:
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


def versions() -> dict[str, str | None]:
    from mlatrace import __version__
    from mlatrace.common import installed_version

    found: dict[str, str | None] = {"python": sys.version.split()[0], "mlatrace": __version__}
    for library in VERSIONED:
        found[library] = installed_version(library)
    return found


def process_header(recorder: Any) -> dict:
    """The `process` record that opens a process's file: this process, and what its
    recorder keeps (probes, ranks, sampling, folding, the size cap)."""
    from mlatrace import SCHEMA, __version__
    from mlatrace.record.redact import allowed_env, redact_argv
    from mlatrace.settings import current

    return {
        "k": "process",
        "t": 0,
        "seq": 0,
        "tid": threading.main_thread().ident,
        "schema": SCHEMA,
        "pid": recorder.pid,
        "ppid": recorder.ppid,
        "run_id": recorder.run_id,
        "host": socket.gethostname(),
        "argv": redact_argv(process_argv()),
        "env": allowed_env(os.environ),
        "rank": recorder.rank,
        "world_size": recorder.world_size,
        "wall_ns": recorder.wall_ns,
        "versions": versions(),
        "device": None,
        "probes": list(recorder.probes),
        "ranks_kept": sorted(recorder.ranks) if recorder.ranks else None,
        "replay_sample": recorder.replay_sample,
        "sample": current().sample,
        "fold_s": recorder.fold_s,
        "max_mb": recorder.max_mb,
        "mlatrace": __version__,
    }


def host_out_dir(out: str, run_id: str | None = None, launcher_host: str | None = None) -> str:
    """This host's trace directory: `out` on the launcher's host (MLATRACE_HOST), `out/<host>`
    on any other (a Ray worker on another node writes there, on its own disk). Where that
    cannot be made, `$TMPDIR/mlatrace-trace/<run_id>/<host>`, said once on stderr."""
    host = socket.gethostname()
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
