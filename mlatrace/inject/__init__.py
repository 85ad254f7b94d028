"""Process-tree injection: what runs at the start of every traced Python process.

`bootstrap_process()` is called by `bootstrap/sitecustomize.py`. It starts the
recorder from the MLATRACE_* environment, makes sure the last records reach
the file however the process ends (exit, SIGTERM, os._exit in forked children,
exec), installs the probes, and starts live OTLP export when asked.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

from mlatrace import record

BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bootstrap")
_installed = False


def bootstrap_process() -> None:
    """Start tracing this process as configured by MLATRACE_* (idempotent)."""
    global _installed
    if _installed:
        return
    recorder = record.start_from_env()
    if recorder is None:
        return
    _installed = True
    _flush_before_os_exit()
    _flush_before_exec()
    _flush_on_sigterm()
    _install_probes()
    config = record.settings()
    if config["otlp"]:
        _start_live_export(config["otlp"])


def _report_failure(what: str, target: str, exc: BaseException) -> None:
    record.note_probe_error()
    record.emit("probe.error", probe=what, target=target, error=repr(exc)[:300])
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
        from mlatrace.export.live import start_live_export

        start_live_export(endpoint)
    except Exception as exc:
        _report_failure("otlp", endpoint, exc)


def _flush_before_os_exit() -> None:
    """multiprocessing's fork children (and some engines) leave through os._exit: no atexit."""
    real_exit = os._exit

    def _exit(code: int) -> None:
        try:
            record.stop("os._exit")
        finally:
            real_exit(code)

    _exit.__wrapped__ = real_exit  # type: ignore[attr-defined]
    os._exit = _exit


def _flush_before_exec() -> None:
    """An exec replaces the image without atexit: flush first; the new image traces itself."""
    for name in ("execv", "execve"):
        real = getattr(os, name)

        def wrapper(*args, _real=real):  # type: ignore[no-untyped-def]
            record.stop("exec")
            try:
                return _real(*args)
            except BaseException:
                record.start_from_env()  # exec failed: keep tracing this image
                raise

        wrapper.__wrapped__ = real  # type: ignore[attr-defined]
        setattr(os, name, wrapper)


def _flush_on_sigterm() -> None:
    """Default SIGTERM kills without atexit: flush, then die of SIGTERM as before."""
    if threading.current_thread() is not threading.main_thread():
        return
    try:
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return

        def on_sigterm(signum: int, frame: object) -> None:
            record.stop("SIGTERM")
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

        signal.signal(signal.SIGTERM, on_sigterm)
    except (ValueError, OSError):
        pass
