"""The `device` record: which GPU a process captures on and how many SMs it has.

Written once per process and device, just before that device's first
`graph.capture.begin`, from torch's device properties. CUDA is never initialised
here: a process whose torch has not initialised CUDA (the CPU reference engine, a
capture probe that fires before any device work) gets no record, and rules that need
the SM count (MLT008) say so in coverage instead of guessing one.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from mlatrace import record

_written: set[tuple[int, int]] = set()   # (pid, device index): a forked child writes its own


def current_device() -> int | None:
    """The index of torch's current CUDA device, or None where CUDA is not initialised."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None) if torch is not None else None
    if cuda is None:
        return None
    try:
        if not cuda.is_initialized():
            return None
        return int(cuda.current_device())
    except Exception:
        return None


def properties(index: int) -> dict[str, Any] | None:
    """{index, name, arch, sms} of CUDA/ROCm device `index` (torch must have initialised it)."""
    torch = sys.modules.get("torch")
    try:
        props = torch.cuda.get_device_properties(index)  # type: ignore[union-attr]
    except Exception:
        return None
    arch = getattr(props, "gcnArchName", None) if getattr(torch.version, "hip", None) else None
    if not arch:
        major, minor = getattr(props, "major", None), getattr(props, "minor", None)
        arch = f"sm_{major}{minor}" if isinstance(major, int) and isinstance(minor, int) else None
    sms = getattr(props, "multi_processor_count", None)
    return {"index": index, "name": str(getattr(props, "name", "")) or None, "arch": arch,
            "sms": sms if isinstance(sms, int) and sms > 0 else None}


def note_device() -> int | None:
    """The current device's index, after writing its `device` record if this process has
    not yet; None (and no record) where CUDA is not initialised."""
    index = current_device()
    if index is None:
        return None
    key = (os.getpid(), index)
    if key not in _written:
        _written.add(key)
        fields = properties(index)
        if fields is not None:
            record.emit("device", **fields)
    return index


def reserved_bytes() -> tuple[int, int] | None:
    """(current device index, bytes torch's caching allocator holds reserved there), or
    None where CUDA is not initialised or torch cannot say.

    `torch.cuda.memory_reserved` reads the allocator's counters (`memory_stats`: a copy of
    its stats under its lock, on the host: no device work, no sync); it is only called once
    `torch.cuda.is_initialized()` holds, so it never initialises CUDA."""
    index = current_device()
    if index is None:
        return None
    try:
        return index, int(sys.modules["torch"].cuda.memory_reserved(index))
    except Exception:
        return None


def reserved_growth(before: tuple[int, int] | None) -> int | None:
    """Bytes reserved now beyond `before` (a `reserved_bytes()` reading) on the same device,
    0 where nothing grew; None where either reading is missing or the device changed."""
    if before is None:
        return None
    now = reserved_bytes()
    if now is None or now[0] != before[0]:
        return None
    return max(0, now[1] - before[1])
