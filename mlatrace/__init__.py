"""mlatrace: see what CUDA-graph capture froze in LLM decode, and what replays needed.

`import mlatrace` is light: it never imports torch, click or rich. The public
in-program API is `mlatrace.mark(name, **attrs)` for user annotations.
"""

from __future__ import annotations

__version__ = "0.1.0"
SCHEMA = "mlatrace/1"


def mark(name: str, **attrs: object) -> None:
    """Record a user annotation (a `mark` record) in the current trace; no-op when untraced."""
    from mlatrace import record

    record.emit("mark", name=name, attrs=attrs)


__all__ = ["SCHEMA", "__version__", "mark"]
