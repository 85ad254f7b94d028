"""Field checks of the record kinds whose malformed fields would mislead a rule.

Most kinds are read leniently (a field of the wrong type reads as absent). A `device`
record gives MLT008 its SM count and a `graph.nodes` record its grids: a wrong one
would make a finding up, so the reader reports it as a problem (file:line, why) and
skips that record, keeping the rest of the trace.
"""

from __future__ import annotations

from typing import Any

from mlatrace.kinds import DEVICE, GRAPH_NODES


def _int(value: Any) -> bool:
    return type(value) is int


def _opt_str(value: Any) -> bool:
    return value is None or isinstance(value, str)


def check_device(rec: dict) -> str | None:
    """Why a `device` record is malformed, or None."""
    index, sms = rec.get("index"), rec.get("sms")
    if not _int(index) or index < 0:
        return f"device record: index must be a non-negative integer, got {index!r}"
    if not _int(sms) or sms <= 0:
        return f"device record: sms must be a positive integer, got {sms!r}"
    if not _opt_str(rec.get("name")) or not _opt_str(rec.get("arch")):
        return "device record: name and arch must be strings"
    return None


def _dims(value: Any) -> bool:
    return (isinstance(value, list) and len(value) == 3
            and all(_int(v) and v >= 0 for v in value))


def check_nodes(rec: dict) -> str | None:
    """Why a `graph.nodes` record is malformed, or None."""
    gid, kernels = rec.get("gid"), rec.get("kernels")
    if not _int(gid):
        return f"graph.nodes record: gid must be an integer, got {gid!r}"
    if not isinstance(kernels, list):
        return f"graph.nodes record: kernels must be a list, got {type(kernels).__name__}"
    for i, node in enumerate(kernels):
        if not isinstance(node, dict) or not isinstance(node.get("name"), str):
            return f"graph.nodes record: kernels[{i}] has no name"
        if not _dims(node.get("grid")):
            return f"graph.nodes record: kernels[{i}] grid must be 3 non-negative integers, " \
                   f"got {node.get('grid')!r}"
        if "block" in node and not _dims(node.get("block")):
            return f"graph.nodes record: kernels[{i}] block must be 3 non-negative integers"
    return None


CHECKS = {DEVICE: check_device, GRAPH_NODES: check_nodes}
CHECKED_KINDS = frozenset(CHECKS)


def check(rec: dict) -> str | None:
    """Why `rec` (a decoded record of one of CHECKED_KINDS) is malformed, or None."""
    fn = CHECKS.get(rec.get("k"))  # type: ignore[arg-type]
    return fn(rec) if fn is not None else None
