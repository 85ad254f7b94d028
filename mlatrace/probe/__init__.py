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

from mlatrace import settings
from mlatrace.probe import graphs, sampling
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


def install(packs: list[Pack | str | Path], failed: dict[str, str] | None = None,
            user: list[str] | None = None) -> list[str]:
    """Install these packs; returns their names ([] when packs are already installed).

    `failed`: pack files that did not load (path -> reason), kept for the coverage that
    `process.end` records. `user`: the names of the packs the user gave (`--probes`),
    which coverage judges on their own (a user pack that saw nothing makes a run blind).
    """
    global _engine
    with _lock:
        if _engine is not None:
            return []
        loaded = [p if isinstance(p, Pack) else load_pack(p) for p in packs]
        engine = Engine(failed_packs=dict(failed or {}), user_packs=list(user or []))
        engine.install(loaded)
        _engine = engine
    try:
        from mlatrace import record

        record.set_probes([p.name for p in loaded])
        record.set_end_info("coverage", engine.coverage)
        record.set_end_info("unseen", sampling.unseen_counts)
        record.set_end_info("steps_off", sampling.steps_off_counts)
    except Exception:
        pass
    _reset_counts_in_forked_children()
    return [p.name for p in loaded]


_fork_hook_registered = False


def _reset_counts_in_forked_children() -> None:
    """A forked child keeps the parent's patches but counts its own hits and errors."""
    global _fork_hook_registered
    if _fork_hook_registered or not hasattr(os, "register_at_fork"):
        return
    _fork_hook_registered = True

    def reset() -> None:
        engine = _engine
        if engine is not None:
            engine.forked()

    os.register_at_fork(after_in_child=reset)


def install_default() -> list[str]:
    """Install the shipped packs, the entry points' and the user's (MLATRACE_PROBES);
    idempotent.

    Does nothing when MLATRACE_DISABLE is set; leaves out the packs named in
    MLATRACE_DISABLE_PACKS. A pack that does not load (a mistyped option too) is reported
    once as probe.error and skipped; one whose `versions` range excludes the installed
    library is skipped as "other version" (in the coverage, not an error: a pack for
    another release of the engine); the other packs still install.
    """
    config = settings.current()
    if config.disabled:
        return []
    other: list[tuple[str, str]] = []
    packs, problems = load_applicable(other_versions=other)
    failed: dict[str, str] = {where: f"other version: {why}" for where, why in other}
    for where, error in problems:
        failed[where] = error
        _report_pack_error(where, error)
    given = {str(Path(p).resolve()) for p in config.probes}
    user = [p.name for p in packs if str(Path(p.path).resolve()) in given]
    return install(packs, failed, user)


def _report_pack_error(path: str, error: str) -> None:
    try:
        from mlatrace import record

        record.emit("probe.error", probe="pack", target=path, reason="load", error=error[:500])
        record.note_probe_error()
    except Exception:
        pass


def uninstall() -> None:
    """Undo every patch made by install(); safe to call when nothing is installed."""
    global _engine
    with _lock:
        engine, _engine = _engine, None
    if engine is not None:
        try:  # a recorder that closes later still says what these probes covered
            from mlatrace import record

            record.set_end_info("coverage", lambda snapshot=engine.coverage(): snapshot,
                                once=True)
            unseen, steps_off = sampling.forget_asides()
            record.set_end_info("unseen", lambda: unseen, once=True)
            record.set_end_info("steps_off", lambda: steps_off, once=True)
        except Exception:
            pass
        engine.uninstall()


def installed() -> Engine | None:
    """The active engine (packs, runtimes, patches), or None."""
    return _engine
