"""Field readers and small aggregates the process builder's record handlers share."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from mlatrace.analysis.model import MAX_SYNC_SITES, Ref, ReplayStats, SyncSite
from mlatrace.common import hashable


def as_text(value: Any) -> str | None:
    """A name-like field: strings pass, None stays None, anything else becomes its str()."""
    if value is None or isinstance(value, str):
        return value
    return str(value)


def key_text(key: Any) -> str | int | None:
    """A batch descriptor as one short string: {"num_tokens": 2} -> "num_tokens=2"."""
    if key is None or isinstance(key, (str, int)):
        return key
    if isinstance(key, dict):
        return ", ".join(f"{k}={json.dumps(v) if not isinstance(v, str) else v}"
                         for k, v in key.items())
    return json.dumps(key) if isinstance(key, list) else str(key)


def as_dict(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def as_grid(value: Any) -> tuple | None:
    if isinstance(value, (list, tuple)):
        return tuple(value)
    return None


def in_capture_setup(where: Any) -> bool:
    """A sync whose stack is torch.cuda.graph's own capture set-up (torch/cuda/graphs.py)."""
    frames = where if isinstance(where, list) else [where]
    return any(isinstance(f, str) and "torch/cuda/graphs.py" in f.replace("\\", "/")
               for f in frames[:1])


def flush_ptr_run(stats: ReplayStats) -> None:
    """Add the replays that repeated the last pointer set to its per-name counts."""
    if stats.ptr_run_count and stats.ptr_run is not None:
        for name, ptr in stats.ptr_run.items():
            entry = stats.ptrs.get(name, {}).get(ptr)
            if entry is not None:
                entry[0] += stats.ptr_run_count
    stats.ptr_run_count = 0


def add_step_syncs(sites: dict, pid: int | None, file: str,
                    records: Iterable[tuple[dict, str]]) -> None:
    """Count (sync record, side) pairs into per-(pid, op, where) sites (at most
    MAX_SYNC_SITES * 4); a site keeps the side of its first sync."""
    for rec, side in records:
        op, where = as_text(rec.get("op")), rec.get("where")
        key = (pid, op, hashable(where))
        site = sites.get(key)
        if site is not None:
            site.count += 1
        elif len(sites) < MAX_SYNC_SITES * 4:
            seq = rec.get("seq")
            sites[key] = SyncSite(Ref(file, seq if isinstance(seq, int) else -1, "sync"),
                                  op, where, False, None, side=side)


def fold_record(rec: dict, kind: str, same: dict, ranges: dict, end: int) -> dict:
    """One record of a fold's pattern at the low (end 0) or high (1) end of its ranges,
    located at the `steady` record (its seq: evidence in a fold points there)."""
    out = dict(same)
    for name, span in ranges.items():
        if not (isinstance(span, list) and len(span) == 2):
            continue
        outer, dot, inner = name.partition(".")
        if dot:
            nested = out[outer] = dict(as_dict(out.get(outer)))
            nested[inner] = span[end]
        else:
            out[name] = span[end]
    out.update(k=kind, seq=rec.get("seq"), tid=rec.get("tid"), t=rec.get("t"), capturing=False)
    return out
