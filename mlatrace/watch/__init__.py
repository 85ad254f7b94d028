"""`mlatrace watch [DIR]`: the findings of a run while it runs.

Follows every process file of the run (new files and per-host subdirectories too),
reading only what was appended, updates the analysis model record by record, runs the
rules at each refresh and shows the result in a rich `Live` view: at most 4 refreshes a
second, and while nothing is written only a few stat() calls per poll. It exits when
every process of the run has ended, or on Ctrl-C, and prints the final report (the one
`mlatrace report` prints for the same records). `--once` prints one snapshot and exits
(`--json`: the same as JSON, schema `mlatrace.watch/1`, see `view.snapshot_dict`).

`--html FILE` keeps a self-contained HTML report of the run there (html_report), rewritten
at each refresh that read new records and once at the end.

Exit codes: 0 the view ran (and ended) or the snapshot was printed; 2 no trace at DIR,
a bad --config, or the --html page could not be written.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mlatrace.exitcodes import ExitCode
from mlatrace.watch.state import LiveRun, newest_run

DEFAULT_DIR = "mlatrace-trace"
POLL_S = 0.25           # between polls while caught up: at most 4 refreshes a second
BACKLOG_REFRESH_S = 1.0  # catching up on a backlog: the rules and the view this often
IDLE_REFRESH_S = 3.0    # nothing new: redraw only this often (elapsed time, process states)
LOG_NAME = "cmd.log"    # `run --watch`: the command's output, in the trace dir

__all__ = ["DEFAULT_DIR", "LOG_NAME", "LiveRun", "catch_up", "follow", "main", "newest_run",
           "print_final", "refresh_due", "snapshot"]


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
    from mlatrace.watch.view import render, snapshot_dict

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

    from mlatrace.watch.view import render

    done = until or live.finished
    live.poll()
    live.refresh()
    last = time.monotonic()
    try:
        with Live(render(live, log_path, console.width), console=console, auto_refresh=False,
                  redirect_stdout=False, redirect_stderr=False) as view:
            unseen = False  # records read since the last refresh
            while True:
                unseen = bool(live.poll()) or unseen
                over = done()
                now = time.monotonic()
                if over or refresh_due(live, unseen, now - last):
                    live.refresh()
                    view.update(render(live, log_path, console.width), refresh=True)
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
    from mlatrace.report import render as render_report
    from mlatrace.report import report_dict

    analysis = live.close()
    console.rule("final report" + (" (interrupted: the run may still be going)"
                                   if interrupted else ""))
    data = report_dict(str(live.roots[0]), analysis)
    render_report(console, data, verbose=False)


def main(path: str | None, once: bool = False, config: str | None = None,
         as_json: bool = False, html: str | None = None) -> int:
    """`mlatrace watch`: see the module docstring for what and the exit codes."""
    from mlatrace.analysis import ConfigError
    from mlatrace.report import make_console, resolve_config

    err = make_console(stderr=True)
    try:
        cfg = resolve_config(config)
    except ConfigError as exc:
        err.print(f"[red]error:[/] {exc}", highlight=False)
        return ExitCode.UNUSABLE
    where = Path(path or DEFAULT_DIR)
    roots = newest_run(where)
    if not roots:
        err.print(f"[red]error:[/] {where}: no trace here (no run.json or p<pid>.jsonl, "
                  "nor a run directory below it)", highlight=False)
        return ExitCode.UNUSABLE
    if path is None or roots[0] != where:
        err.print(f"mlatrace watch: following {roots[0]}", highlight=False)
    live = LiveRun(roots, cfg)
    log = roots[0] / LOG_NAME
    log_path = str(log) if log.exists() else None
    console = make_console()
    page = None
    if html:
        from mlatrace.html_report import LivePage

        page = LivePage(html)
    if once or as_json:
        snapshot(live, console, log_path, as_json=as_json, page=page)
        return _page_done(page, err)
    # Ctrl-C ends the view between two polls, never in the middle of feeding records
    # (the final report must hold every record read)
    interrupted: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: interrupted.append(signum))
    try:
        follow(live, console, log_path, until=lambda: bool(interrupted) or live.finished(),
               page=page)
    finally:
        signal.signal(signal.SIGINT, previous)
    print_final(live, console, interrupted=bool(interrupted) and not live.finished())
    sys.stdout.flush()
    if page is not None:
        page.update(live, final=True)
    return _page_done(page, err)


def _page_done(page: Any, err: Any) -> int:
    """0, or 2 with the reason when the --html page could not be written."""
    if page is not None and page.error:
        err.print(f"error: {page.error}", highlight=False, markup=False, soft_wrap=True)
        return ExitCode.UNUSABLE
    return 0
