"""The probe stage: applies probe packs (probes/*.toml) to the traced program.

    install_default()   shipped, entry-point and MLATRACE_PROBES packs (the bootstrap calls this)
    install(packs)      these packs (Pack objects or paths): tests, the pytest plugin
    uninstall()         undo every patch; wrappers left in place pass straight through
    installed()         the active Engine (packs, per-probe runtimes, patches) or None

Both installs return the names of the packs they installed ([] when already installed).

Installing is lazy (targets are patched when their module is imported; the
engine imports no target itself) and idempotent: a second install while one is
active does nothing.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from mlatrace.probe import graphs
from mlatrace.probe.engine import Engine
from mlatrace.probe.packs import Pack, PackError, discover, load_applicable, load_pack

__all__ = ["install", "install_default", "uninstall", "installed", "graphs", "PackError",
           "default_pack_paths"]

_lock = threading.Lock()
_engine: Engine | None = None


def default_pack_paths(extra: list[str] | None = None) -> list[Path]:
    """The shipped packs, those of the `mlatrace.packs` entry points, MLATRACE_PROBES files
    and `extra`, in that order (`packs.discover`)."""
    return discover(extra)[0]


def install(packs: list[Pack | str | Path]) -> list[str]:
    """Install these packs; returns their names ([] when packs are already installed)."""
    global _engine
    with _lock:
        if _engine is not None:
            return []
        loaded = [p if isinstance(p, Pack) else load_pack(p) for p in packs]
        engine = Engine()
        engine.install(loaded)
        _engine = engine
    try:
        from mlatrace import record

        record.set_probes([p.name for p in loaded])
    except Exception:
        pass
    return [p.name for p in loaded]


def install_default() -> list[str]:
    """Install the shipped packs, the entry points' and the user's (MLATRACE_PROBES);
    idempotent.

    Does nothing when MLATRACE_DISABLE is set; leaves out the packs named in
    MLATRACE_DISABLE_PACKS. A pack that does not load (a mistyped option too), or whose
    `versions` range excludes the installed library, is reported once as probe.error
    and skipped; the other packs still install.
    """
    if os.environ.get("MLATRACE_DISABLE", "0") not in ("", "0"):
        return []
    packs, problems = load_applicable()
    for where, error in problems:
        _report_pack_error(where, error)
    return install(packs)


def _report_pack_error(path: str, error: str) -> None:
    try:
        from mlatrace import record

        record.emit("probe.error", probe="pack", target=path, error=error[:500])
        record.note_probe_error()
    except Exception:
        pass


def uninstall() -> None:
    """Undo every patch made by install(); safe to call when nothing is installed."""
    global _engine
    with _lock:
        engine, _engine = _engine, None
    if engine is not None:
        engine.uninstall()


def installed() -> Engine | None:
    """The active engine (packs, runtimes, patches), or None."""
    return _engine
