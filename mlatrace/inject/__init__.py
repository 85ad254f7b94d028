"""Process-tree injection: what runs at the start of every traced Python process.

`bootstrap_process()` is called by `bootstrap/sitecustomize.py`. It starts the
recorder from the MLATRACE_* environment, makes sure the last records reach
the file however the process ends (exit, SIGTERM, os._exit in forked children,
exec), installs the probes, and starts live OTLP export when asked.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time

from mlatrace import record
from mlatrace.settings import Settings, current

BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bootstrap")
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
    _flush_before_os_exit()
    _flush_before_exec()
    _flush_on_sigterm()
    _die_with_launcher(config)
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
    """An exec replaces the image without atexit: flush first; the new image traces itself.

    os.execvp and friends try execve on every PATH entry: a path that cannot be executed
    fails without a flush, so the search does not cut the trace into one file per try.
    """
    for name in ("execv", "execve"):
        real = getattr(os, name)

        def wrapper(*args, _real=real):  # type: ignore[no-untyped-def]
            path = args[0] if args else None
            if isinstance(path, (str, bytes, os.PathLike)) and not os.access(path, os.X_OK):
                return _real(*args)  # raises as it would have
            record.stop("exec")
            try:
                return _real(*args)
            except BaseException:
                record.start_from_env()  # exec failed: keep tracing this image
                raise

        wrapper.__wrapped__ = real  # type: ignore[attr-defined]
        setattr(os, name, wrapper)


ENDING_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _flush_on_sigterm() -> None:
    """Write the end of the trace on SIGTERM or SIGINT, whoever handles it.

    Default SIGTERM kills without atexit, and serving engines install their own
    handlers (and reset them to the default on shutdown, just before a parent
    SIGKILLs them: vLLM's API server kills its engine's tree ~20 ms after the
    SIGTERM, Ctrl-C included). So `signal.signal` is wrapped: a handler the program
    installs for either signal runs after the records and a `process.end` are
    written (the exit writes the final one if the process gets that far), and the
    default becomes flush-then-die. The program still sees its own handler through
    `signal.signal`/`getsignal`.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    real_signal, real_getsignal = signal.signal, signal.getsignal
    originals: dict[object, object] = {}

    def ending(signalnum: int, handler: object) -> object:
        reason = signal.Signals(signalnum).name

        def on_signal(signum: int, frame: object) -> None:
            if handler is signal.SIG_DFL:
                record.stop(reason)
                real_signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)
                return
            # A parent may SIGKILL this process right after the signal, long before the
            # handler's shutdown path reaches atexit.
            record.end_now(reason)
            handler(signum, frame)  # type: ignore[operator]

        originals[on_signal] = handler
        return on_signal

    def mlatrace_signal(signalnum: int, handler: object) -> object:
        if signalnum in ENDING_SIGNALS and (handler is signal.SIG_DFL or callable(handler)):
            handler = ending(signalnum, handler)
        previous = real_signal(signalnum, handler)
        return originals.get(previous, previous)

    def mlatrace_getsignal(signalnum: int) -> object:
        current = real_getsignal(signalnum)
        return originals.get(current, current)

    try:
        for signalnum in ENDING_SIGNALS:
            current = real_getsignal(signalnum)
            if current is signal.SIG_DFL or callable(current):
                real_signal(signalnum, ending(signalnum, current))
    except (ValueError, OSError):
        return
    mlatrace_signal.__wrapped__ = real_signal  # type: ignore[attr-defined]
    mlatrace_getsignal.__wrapped__ = real_getsignal  # type: ignore[attr-defined]
    signal.signal = mlatrace_signal  # type: ignore[assignment]
    signal.getsignal = mlatrace_getsignal  # type: ignore[assignment]


LAUNCHER_POLL_S = 0.5   # how often a traced process looks for its launcher
LAUNCHER_GRACE_S = 5.0  # from the SIGTERM to the SIGKILL of a process that lives on


def _die_with_launcher(config: Settings) -> None:
    """End this process when the launcher dies before the run ended (SIGKILL of
    `mlatrace run`): no traced server keeps running untraced with PPID 1.

    A daemon thread looks for the launcher (MLATRACE_LAUNCHER_PID, on the launcher's host)
    every LAUNCHER_POLL_S. Once it is gone while run.json has no end (a launcher that
    ended normally wrote it), the thread writes the abnormal end into run.json and sends
    this process SIGTERM (the program's handler runs after mlatrace wrote process.end),
    then SIGKILL after LAUNCHER_GRACE_S. Forked children start their own thread."""
    pid, host, out = config.launcher_pid or "", config.host, config.out
    if not pid.isdigit() or not out or (host and host != socket.gethostname()):
        return
    launcher, run_json = int(pid), os.path.join(out, "run.json")

    def watch() -> None:
        while _alive(launcher):
            time.sleep(LAUNCHER_POLL_S)
        if not _mark_abnormal_end(run_json, launcher):
            return  # the run ended normally: this process outlives it on purpose
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(LAUNCHER_GRACE_S)
        os.kill(os.getpid(), signal.SIGKILL)

    def start() -> None:
        threading.Thread(target=watch, name="mlatrace-launcher-watch", daemon=True).start()

    start()
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=start)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _mark_abnormal_end(run_json: str, launcher: int) -> bool:
    """Say in run.json that the run ended abnormally; False when the launcher had ended it."""
    try:
        with open(run_json) as f:
            info = json.load(f)
    except (OSError, ValueError):
        return True  # no run.json to read: the launcher is gone all the same
    if info.get("end_ns") is not None and not info.get("abnormal_end"):
        return False
    info.setdefault("end_ns", None)
    info["end_ns"] = info["end_ns"] or time.time_ns()
    info["abnormal_end"] = (f"the launcher (pid {launcher}) died before the command ended "
                            "(SIGKILL?): the traced processes were stopped")
    tmp = f"{run_json}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as f:
            f.write(json.dumps(info, indent=2) + "\n")
        os.replace(tmp, run_json)
    except OSError:
        pass
    return True
