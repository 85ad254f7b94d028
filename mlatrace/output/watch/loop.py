"""The follow loop of `mlatrace watch`: catch up on what was written, refresh the rules and
the view at most every POLL_S (less often while a backlog is read, a few stat() calls while
nothing is written), print one snapshot (`--once`) or the final report."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Any

from mlatrace.output.watch.state import LiveRun

POLL_S = 0.25           # between polls while caught up: at most 4 refreshes a second
BACKLOG_REFRESH_S = 1.0  # catching up on a backlog: the rules and the view this often
IDLE_REFRESH_S = 3.0    # nothing new: redraw only this often (elapsed time, process states)


def catch_up(live: LiveRun) -> None:
    """Read everything already written (a backlog takes several polls)."""
    while live.poll() or live.tail.behind:
        pass


def refresh_due(live: LiveRun, unseen: bool, since: float) -> bool:
    """Whether the follow loop runs the rules and redraws now, `since` seconds after it
    last did, `unseen` when records were read since then.

    New records are shown at most every POLL_S; while a backlog is caught up (the last
    poll left bytes unread) only every BACKLOG_REFRESH_S, since each refresh (the rules,
    the view's tables) holds up the reading; the poll that catches up is always shown
    within POLL_S. Nothing new: every IDLE_REFRESH_S (elapsed time, process states).
    """
    if unseen:
        return since >= (BACKLOG_REFRESH_S if live.tail.behind else POLL_S)
    return since >= IDLE_REFRESH_S


def snapshot(live: LiveRun, console: Any, log_path: str | None = None,
             as_json: bool = False, page: Any = None) -> None:
    """One refresh printed as plain output (`--once`); a finished run is read to the end."""
    from mlatrace.output.watch.view import render, snapshot_dict

    catch_up(live)
    if live.finished():
        live.close()
    else:
        live.refresh()
    if page is not None:  # --html: html_report.LivePage
        page.update(live, final=live.finished())
    if as_json:
        sys.stdout.write(json.dumps(snapshot_dict(live, log_path), indent=1, default=str) + "\n")
    else:
        console.print(render(live, log_path, console.width))


def follow(live: LiveRun, console: Any, log_path: str | None = None,
           until: Callable[[], bool] | None = None, page: Any = None) -> bool:
    """The live view until `until()` (default: every process ended); False on Ctrl-C.
    `page` (html_report.LivePage, --html) is rewritten at each refresh."""
    from rich.live import Live

    from mlatrace.output.watch.view import render

    done = until or live.finished
    live.poll()
    live.refresh()
    last = time.monotonic()
    try:
        with Live(render(live, log_path, console.width, console.height), console=console,
                  auto_refresh=False, redirect_stdout=False, redirect_stderr=False) as view:
            unseen = False  # records read since the last refresh
            while True:
                unseen = bool(live.poll()) or unseen
                over = done()
                now = time.monotonic()
                if over or refresh_due(live, unseen, now - last):
                    live.refresh()
                    view.update(render(live, log_path, console.width, console.height),
                                refresh=True)
                    if page is not None:
                        page.update(live)
                    last, unseen = now, False
                if over:
                    return True
                if not live.tail.behind:  # caught up: wait for the writers
                    time.sleep(max(0.0, last + POLL_S - now) if unseen else POLL_S)
    except KeyboardInterrupt:
        return False


def print_final(live: LiveRun, console: Any, interrupted: bool = False) -> None:
    """Read the rest of the trace and print the report `mlatrace report` would print."""
    from mlatrace.output.report import render as render_report
    from mlatrace.output.report import report_dict

    analysis = live.close()
    console.rule("final report" + (" (interrupted: the run may still be going)"
                                   if interrupted else ""))
    data = report_dict(str(live.roots[0]), analysis)
    render_report(console, data, verbose=False)
