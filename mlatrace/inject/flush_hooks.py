"""The last records reach the file however a traced process ends: os._exit (fork
children), exec (the new image traces itself) and SIGTERM/SIGINT (whoever handles them)."""

from __future__ import annotations

import os
import signal
import threading

from mlatrace import record

__all__ = ["ENDING_SIGNALS", "flush_before_exec", "flush_before_os_exit", "flush_on_sigterm",
           "install_flush_hooks"]


def install_flush_hooks() -> None:
    """All three, in the order bootstrap_process installs them."""
    flush_before_os_exit()
    flush_before_exec()
    flush_on_sigterm()


def flush_before_os_exit() -> None:
    """multiprocessing's fork children (and some engines) leave through os._exit: no atexit."""
    real_exit = os._exit

    def _exit(code: int) -> None:
        try:
            record.stop("os._exit")
        finally:
            real_exit(code)

    _exit.__wrapped__ = real_exit  # type: ignore[attr-defined]
    os._exit = _exit


def flush_before_exec() -> None:
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


def flush_on_sigterm() -> None:
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
