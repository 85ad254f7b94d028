"""Handlers for host reads of device memory (MLT004)."""

from __future__ import annotations

import os
import sys
from typing import Any

from mlatrace import record
from mlatrace.probe import graphs
from mlatrace.probe.handlers import Handler

_CWD = os.path.join(os.getcwd(), "")
"""The working directory the process started in: files below it are named relative to it."""


def _caller_site(skip: str = os.sep.join(("", "mlatrace", "probe", ""))) -> str | None:
    """'file:line' of the first frame outside the probe engine: where the program synced
    (a file below the working directory as a path relative to it)."""
    frame = sys._getframe(2)
    for _ in range(8):
        if frame is None:
            return None
        code = frame.f_code
        name = code.co_filename
        if skip not in name:
            if name.startswith(_CWD):
                name = name[len(_CWD):]
            return f"{name}:{frame.f_lineno}"
        frame = frame.f_back
    return None


def _stream_capturing() -> bool:
    """Is the current CUDA stream capturing? A host query (no device read), asked only
    inside a probe-seen capture, when CUDA is in use already; without CUDA the probes'
    capture stack (the reference host graph) is trusted."""
    try:
        import torch

        return bool(torch.cuda.is_current_stream_capturing())
    except Exception:
        return True


class DeviceSync(Handler):
    """A host read that waits for the GPU: Tensor.item/.tolist/.numpy on a CUDA tensor,
    torch.cuda.synchronize. Recorded as `sync` (op, capturing, gid, where) for MLT004.

    The replacement is a plain function with one cheap test in front of the original: a
    CPU tensor's .item() (vLLM calls many) costs a `.is_cuda` read, tested first; while torch.compile
    traces, nothing is recorded, so the traced graph sees only the original call.
    """

    def replacement(self, info: Any, runtime: Any) -> Any:
        from mlatrace.probe.engine import STATE

        original = info.raw
        op = info.attr
        target = info.target
        emit = record.emit
        capturing, current_gid = graphs.capturing, graphs.current_gid
        try:
            from torch.compiler import is_compiling
        except ImportError:  # pragma: no cover - torch < 2.3
            def is_compiling() -> bool:
                return False

        def note() -> None:
            try:
                # Inside a wrapper's capture but before torch starts the stream capture
                # (torch.cuda.graph synchronizes on entry) is not a sync in the graph.
                now = capturing() and _stream_capturing()
                emit("sync", op=op, capturing=now, gid=current_gid() if now else None,
                     where=_caller_site())
            except Exception as exc:
                runtime.fail(target, exc)

        if isinstance(info.owner, type):
            def tensor_method(self: Any, *args: Any, **kwargs: Any) -> Any:
                if self.is_cuda and STATE.active and not runtime.disabled \
                        and not is_compiling():
                    note()
                return original(self, *args, **kwargs)

            replacement = tensor_method
        else:
            def function(*args: Any, **kwargs: Any) -> Any:
                if STATE.active and not runtime.disabled and not is_compiling():
                    note()
                return original(*args, **kwargs)

            replacement = function
        replacement.__name__ = getattr(original, "__name__", op)
        replacement.__qualname__ = getattr(original, "__qualname__", op)
        replacement.__doc__ = getattr(original, "__doc__", None)
        replacement.__wrapped__ = original  # type: ignore[attr-defined]
        return replacement
