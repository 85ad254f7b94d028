"""A traced process ends when its launcher dies before the run ended (SIGKILL of
`mlatrace run`): no traced server keeps running untraced with PPID 1."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time

from mlatrace.common import pid_alive

__all__ = ["LAUNCHER_GRACE_S", "LAUNCHER_POLL_S", "die_with_launcher"]


LAUNCHER_POLL_S = 0.5   # how often a traced process looks for its launcher
LAUNCHER_GRACE_S = 5.0  # from the SIGTERM to the SIGKILL of a process that lives on


def die_with_launcher(environ: dict[str, str] | os._Environ) -> None:
    """End this process when the launcher dies before the run ended (SIGKILL of
    `mlatrace run`): no traced server keeps running untraced with PPID 1.

    A daemon thread looks for the launcher (MLATRACE_LAUNCHER_PID, on the launcher's host)
    every LAUNCHER_POLL_S. Once it is gone while run.json has no end (a launcher that
    ended normally wrote it), the thread writes the abnormal end into run.json and sends
    this process SIGTERM (the program's handler runs after mlatrace wrote process.end),
    then SIGKILL after LAUNCHER_GRACE_S. Forked children start their own thread."""
    pid = str(environ.get("MLATRACE_LAUNCHER_PID") or "")
    host = environ.get("MLATRACE_HOST")
    out = environ.get("MLATRACE_OUT")
    if not pid.isdigit() or not out or (host and host != socket.gethostname()):
        return
    launcher, run_json = int(pid), os.path.join(out, "run.json")

    def watch() -> None:
        while pid_alive(launcher):
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
