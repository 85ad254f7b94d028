"""mlatrace: see what CUDA-graph capture froze in LLM decode, and what replays needed.

`import mlatrace` is light: it never imports torch, click or rich. The public
in-program API is `mlatrace.mark(name, **attrs)` for user annotations.
"""

from __future__ import annotations

__version__ = "0.1.0"
SCHEMA = "mlatrace/1"


_record = None   # mlatrace.record, imported on the first mark (it is not light to import)


def mark(name: str, **attrs: object) -> None:
    """Record a user annotation (a `mark` record) in the current trace; no-op when untraced."""
    record = _record
    if record is None:
        record = _load_record()
    recorder = record.STATE.recorder
    if recorder is not None:
        recorder.add("mark", {"name": name, "attrs": attrs})


def _load_record():  # noqa: ANN202 - the module
    global _record
    from mlatrace import record as module

    _record = module
    return module


__all__ = ["SCHEMA", "__version__", "mark"]
