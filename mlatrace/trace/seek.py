"""One record of a process file found by its `seq`, without reading the file through.

A process file's `seq` increases line by line, so a record is found by bisecting the file's
bytes: about log2(size / SCAN_BYTES) reads of one line each, then a short scan. `watch`
uses it to date a finding by the record its evidence points at (the file may be large and
still growing; only complete lines are read).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SCAN_BYTES = 64 * 1024   # below this span, read the lines one by one


def _parse(line: bytes) -> dict[str, Any] | None:
    if not line.endswith(b"\n"):
        return None   # a line still being written
    try:
        rec = json.loads(line)
    except ValueError:
        return None
    return rec if isinstance(rec, dict) and type(rec.get("seq")) is int else None


def record_at(path: str | Path, seq: int) -> dict[str, Any] | None:
    """The record of `path` whose `seq` is `seq` (None: not there, or the file unreadable)."""
    try:
        f = open(path, "rb")
    except OSError:
        return None
    with f:
        lo, hi = 0, f.seek(0, 2)        # the record's line starts in [lo, hi]
        while hi - lo > SCAN_BYTES:
            mid = (lo + hi) // 2
            f.seek(mid)
            f.readline()                # the rest of the line mid fell in
            start = f.tell()
            line = f.readline()
            rec = _parse(line)
            if rec is None or start > hi:
                break                   # a malformed or partial line: scan from lo
            if rec["seq"] < seq:
                lo = start + len(line)
            elif rec["seq"] == seq:
                return rec
            else:
                hi = start
        f.seek(lo)
        for line in f:
            rec = _parse(line)
            if rec is None:
                continue
            if rec["seq"] >= seq:
                return rec if rec["seq"] == seq else None
    return None
