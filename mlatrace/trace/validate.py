"""Field checks of the record kinds whose malformed fields would mislead a rule.

Most kinds are read leniently (a field of the wrong type reads as absent). A `device`
record gives MLT008 its SM count, a `graph.nodes` record its grids and a `steady` record
the counts and ranges of the steps it folded: a wrong one would make a finding up, so the reader reports it as a problem (file:line, why) and
skips that record, keeping the rest of the trace.
"""

from __future__ import annotations

from typing import Any

from mlatrace.kinds import CHECKED, DEVICE, GRAPH_NODES, STEADY


def _int(value: Any) -> bool:
    return type(value) is int


def _opt_str(value: Any) -> bool:
    return value is None or isinstance(value, str)


def check_device(rec: dict) -> str | None:
    """`index` a non-negative integer, `sms` a positive integer, `name` and `arch`
    strings or null: why a `device` record is not, or None."""
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
    """`gid` an integer, `kernels` a list of objects each with a `name` (string), a `grid`
    of 3 non-negative integers and, when present, a `block` of 3: why a `graph.nodes`
    record is not, or None."""
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


def _number(value: Any) -> bool:
    return type(value) in (int, float)


def steady_problem(rec: dict[str, Any]) -> str | None:
    """What is wrong with a `steady` record (mlatrace.record.fold), or None."""
    steps, replays, gid = rec.get("steps"), rec.get("replays"), rec.get("gid")
    if type(steps) is not int or steps < 1:
        return f"steps {steps!r} is not a count >= 1"
    if type(replays) is not int or replays < 0:
        return f"replays {replays!r} is not a count"
    if gid is not None and type(gid) is not int:
        return f"gid {gid!r} is neither an int nor null"
    if replays:
        first, last = rec.get("n_first"), rec.get("n_last")
        if type(first) is not int or type(last) is not int or first > last:
            return f"n_first {first!r} .. n_last {last!r} is not a range of replay numbers"
    for name in ("fields", "same"):
        if not isinstance(rec.get(name, {}), dict):
            return f"{name} is not an object"
    times = rec.get("times")
    if times is not None:
        if not isinstance(times, dict) or type(rec.get("t_first")) is not int \
                or type(rec.get("times_via")) is not str:
            return "times is not an object with t_first and times_via"
        for gid, entries in times.items():
            if type(gid) is not str or not gid.isdigit() or not isinstance(entries, list):
                return f"times of gid {gid!r:.20} is not a list"
            for entry in entries:
                if not (isinstance(entry, list) and len(entry) == 3
                        and all(type(v) is int for v in entry) and entry[1] >= 0):
                    return f"times entry {entry!r:.60} is not [n, gpu_ns, dt]"
    pattern = rec.get("pattern")
    if pattern is not None:
        if not isinstance(pattern, list):
            return "pattern is not a list"
        for entry in pattern:
            if not isinstance(entry, dict) or type(entry.get("k")) is not str:
                return f"pattern entry {entry!r:.60} has no kind"
            ranges = entry.get("range", {})
            if not isinstance(ranges, dict) or not isinstance(entry.get("same", {}), dict):
                return f"pattern entry of {entry['k']} has a range or same that is not an object"
            for field_name, span in ranges.items():
                if not (isinstance(span, list) and len(span) == 2 and _number(span[0])
                        and _number(span[1]) and span[0] <= span[1]):
                    return f"range of {entry['k']}.{field_name} is not [lo, hi]: {span!r:.60}"
    return None


def check_steady(rec: dict) -> str | None:
    """`steps` a count >= 1, `replays` a count, `gid` an integer or null, `n_first` <=
    `n_last` integers when it has replays, `fields` and `same` objects, `times` {gid:
    [[n, gpu_ns, dt], ...]} of integers (with `t_first` and `times_via`), each `pattern`
    entry a kind with `range` ({field: [lo, hi]}) and `same` objects: why a `steady`
    record is not, or None."""
    problem = steady_problem(rec)
    return None if problem is None else f"malformed steady record (seq {rec.get('seq')}): {problem}"


CHECKS = {DEVICE: check_device, GRAPH_NODES: check_nodes, STEADY: check_steady}
CHECKED_KINDS = CHECKED   # CHECKS has one check each (tests/test_kinds.py)


def check(rec: dict) -> str | None:
    """Why `rec` (a decoded record of one of CHECKED_KINDS) is malformed, or None."""
    fn = CHECKS.get(rec.get("k"))  # type: ignore[arg-type]
    return fn(rec) if fn is not None else None
