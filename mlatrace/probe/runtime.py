"""A probe at run time (ProbeRuntime: enabled or not, hits, errors, samplers), the
engine-wide switch wrappers read (STATE), and the handler a probe is built with."""

from __future__ import annotations

import threading
from typing import Any

from mlatrace import record
from mlatrace.probe import graphs, sampling
from mlatrace.probe.packs import ProbeSpec, resolve_handler

__all__ = ["STATE", "HandlerError", "Inside", "ProbeRuntime", "load_handler"]


class _State:
    """Engine-wide switch: wrappers left behind after uninstall() pass straight through."""

    active = False
    generation = 0


STATE = _State()


class Inside(threading.local):
    """Per thread: is a call of this probe under way? (class default: no AttributeError)"""

    inside = False


class ProbeRuntime:
    """A probe at run time: its spec, its handler, and whether it is still enabled."""

    def __init__(self, spec: ProbeSpec, handler: Any = None) -> None:
        self.spec = spec
        self.handler = handler
        self.disabled = False
        self.hits = 0                  # calls seen by the engine's wrappers (not custom ones)
        self.counted = False           # whether a wrapper of the engine counts hits for it
        self.reported: set[str] = set()
        self.errors: list[dict[str, str]] = []
        self.patched: list[str] = []
        self.skipped: dict[str, str] = {}
        self.samplers: list[sampling.Sampler] = []
        # An override that calls super() (AMXMLAMetadataBuilder.build ->
        # MLACommonMetadataBuilder.build) is one call: only the outermost is recorded.
        self.local = Inside()

    def fail(self, target: str, exc: BaseException) -> None:
        """Disable this probe after its first failure (during a call) and say so once.
        A probe that marks steps takes step-aside down with it (sampling)."""
        if self.disabled:
            return
        self.disabled = True
        if self.spec.kind in graphs.STEP_KINDS or getattr(self.handler, "MARKS_STEPS", False):
            sampling.stop_stepping_aside()
        self.report(target, f"{type(exc).__name__}: {exc}", "run")

    def report(self, target: str, error: str, reason: str = "run") -> None:
        """Record one probe.error per (probe, target); reason: load, missing, drift, patch, run."""
        if target in self.reported:
            return
        self.reported.add(target)
        try:
            self.errors.append({"target": target, "reason": reason, "error": error[:500]})
            record.emit("probe.error", probe=self.spec.qualname, target=target, reason=reason,
                        error=error[:500])
            record.note_probe_error()
        except Exception:
            pass


class HandlerError(Exception):
    """A probe's handler that cannot be resolved; str() is 'file:line: handler ...: why'."""


def load_handler(spec: ProbeSpec) -> Any:
    """Instantiate a probe's handler ``module:Name`` with (spec).

    The pack loader has resolved it already (spec.handler_factory / handler_error); a
    spec built by hand is resolved here. Raises HandlerError or whatever the factory raises.
    """
    if not spec.handler:
        return None
    factory, error = spec.handler_factory, spec.handler_error
    if factory is None and error is None:
        factory, error = resolve_handler(spec.handler, spec.source)
    if error is not None:
        raise HandlerError(error)
    return factory(spec)
