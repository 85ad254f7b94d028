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

import signal
import sys
from pathlib import Path
from typing import Any

from mlatrace.exitcodes import MlatraceError
from mlatrace.output.watch.loop import (
    BACKLOG_REFRESH_S,
    IDLE_REFRESH_S,
    POLL_S,
    catch_up,
    follow,
    print_final,
    refresh_due,
    snapshot,
)
from mlatrace.output.watch.run_view import LOG_NAME
from mlatrace.output.watch.state import LiveRun, newest_run

DEFAULT_DIR = "mlatrace-trace"

__all__ = ["BACKLOG_REFRESH_S", "DEFAULT_DIR", "IDLE_REFRESH_S", "LOG_NAME", "POLL_S", "LiveRun",
           "catch_up", "follow", "main", "newest_run", "print_final", "refresh_due", "snapshot"]


def main(path: str | None, once: bool = False, config: str | None = None,
         as_json: bool = False, html: str | None = None) -> int:
    """`mlatrace watch`: see the module docstring for what and the exit codes."""
    from mlatrace.analysis import ConfigError
    from mlatrace.output.report import make_console, resolve_config

    err = make_console(stderr=True)
    try:
        cfg = resolve_config(config)
    except ConfigError as exc:
        raise MlatraceError(f"error: {exc}") from None
    where = Path(path or DEFAULT_DIR)
    roots = newest_run(where)
    if not roots:
        raise MlatraceError(f"error: {where}: no trace here (no run.json or p<pid>.jsonl, "
                            "nor a run directory below it)")
    if path is None or roots[0] != where:
        err.print(f"mlatrace watch: following {roots[0]}", highlight=False)
    live = LiveRun(roots, cfg)
    log = roots[0] / LOG_NAME
    log_path = str(log) if log.exists() else None
    console = make_console()
    page = None
    if html:
        from mlatrace.output.html_report import LivePage

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
    """0, or MlatraceError (exit 2) with the reason when the --html page could not be
    written (the view ran to its end first)."""
    if page is not None and page.error:
        raise MlatraceError(f"error: {page.error}")
    return 0
