"""`mlatrace run --watch`: the watch view of the run's own trace while its command runs.

The launcher (mlatrace.inject.launcher) starts the command with its output in `cmd.log`
and hands this view the trace directory; the view follows it until the command exits,
then prints the final report and, when the command failed, the last lines of its output
(why it failed, without opening the log).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mlatrace.output.watch.loop import follow, print_final
from mlatrace.output.watch.state import LiveRun

LOG_NAME = "cmd.log"     # the command's output, in the trace dir
LOG_TAIL_LINES = 20


class RunView:
    """The view `run --watch` shows (the launcher's `RunView` protocol)."""

    log_name = LOG_NAME

    def __init__(self) -> None:
        self._shown: tuple[LiveRun, Any] | None = None

    def follow(self, out_dir: Path, done: Callable[[], bool]) -> None:
        """The watch view until `done()` (Ctrl-C reaches the command, not this loop)."""
        from mlatrace.output.tables import make_console

        console = make_console()
        live = LiveRun([out_dir])
        follow(live, console, str(out_dir / self.log_name), until=done)
        self._shown = live, console

    def finish(self, out_dir: Path, exit_code: int) -> None:
        """The final report of what was followed; a failed command's last output lines."""
        if self._shown is None:
            return
        live, console = self._shown
        print_final(live, console)
        if exit_code:
            print_log_tail(out_dir / self.log_name)


def print_log_tail(log: Path, lines: int = LOG_TAIL_LINES) -> None:
    """The last lines of the command's output (`run --watch` sent it to cmd.log)."""
    try:
        with log.open("rb") as f:
            f.seek(max(0, log.stat().st_size - 64 * 1024))
            tail = f.read().decode(errors="replace").splitlines()[-lines:]
    except OSError:
        return
    if tail:
        print(f"mlatrace: the command's last {len(tail)} lines of output ({log}):",
              file=sys.stderr)
        for line in tail:
            print(f"  | {line}", file=sys.stderr)
