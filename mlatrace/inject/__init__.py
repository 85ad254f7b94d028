"""Process-tree injection: what runs at the start of every traced Python process.

`bootstrap_process()` is called by `bootstrap/sitecustomize.py`. It starts the
recorder from the MLATRACE_* environment, makes sure the last records reach
the file however the process ends (exit, SIGTERM, os._exit in forked children,
exec), installs the probes, and starts live OTLP export when asked.
"""

from __future__ import annotations

import os
import sys

from mlatrace import record
from mlatrace.inject.flush_hooks import install_flush_hooks
from mlatrace.inject.launcher_watch import die_with_launcher
from mlatrace.settings import Settings, current

_installed = False


def bootstrap_process(config: Settings | None = None) -> None:
    """Start tracing this process as configured by MLATRACE_* (idempotent)."""
    global _installed
    if _installed:
        return
    config = current() if config is None else config
    recorder = record.start_from_env(config)
    if recorder is None:
        return
    _installed = True
    install_flush_hooks()
    die_with_launcher(config)
    _install_probes()
    if config.otlp:
        _start_live_export(config.otlp)


def _report_failure(what: str, target: str, exc: BaseException) -> None:
    record.note_probe_error()
    record.emit("probe.error", probe=what, target=target, reason="load", error=repr(exc)[:300])
    sys.stderr.write(f"mlatrace: {what} disabled in pid {os.getpid()}: {exc!r}\n")


def _install_probes() -> None:
    try:
        from mlatrace import probe

        names = probe.install_default()
        record.set_probes(list(names or []))
    except Exception as exc:
        _report_failure("probes", "mlatrace.probe.install_default", exc)
        record.set_probes([])


def _start_live_export(endpoint: str) -> None:
    try:
        from mlatrace.output.export.live import start_live_export

        start_live_export(endpoint)
    except Exception as exc:
        _report_failure("otlp", endpoint, exc)
