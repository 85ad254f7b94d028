"""Applies probe packs to live modules: lazy, undoable, failure-isolated patches.

Each probe target ``module:Qualified.name`` is patched when its module is first
imported (a wrapt post-import hook; the engine never imports a target itself) or
at once when the module is already loaded. A plain Python function or method is
replaced by a plain function (``__wrapped__`` points at the original, whose name,
doc and signature it shows); classmethods, staticmethods and other callables get a
wrapt FunctionWrapper. Each patch is recorded so that ``uninstall()`` puts the
original back.

Cost: a probe's fields are compiled for each target when it is patched (see
paths.FieldsProgram.bind), and its record goes to the recorder as the dict built,
so a probed call with a handful of fields costs about 1-2 us.

Isolation: whatever goes wrong with one probe disables that probe only, is recorded
once as ``probe.error`` (probe, target, reason, error), and never reaches the traced
program. A handler that cannot be resolved (packs.resolve_handler) or built is not
installed (reason ``load``); a target that is missing (``missing``), whose parameters
do not start with the probe's declared ``params`` (``drift``) or that cannot be
patched (``patch``) is left alone while the probe's other targets are patched; a probe
whose extraction or handler raises during a call (``run``) is disabled for good and
the call goes on untouched. Every other probe of every pack still installs.

Coverage: ``Engine.coverage()`` says, per probe, which targets were patched, which
were skipped and why (module never imported, missing, drift, inherited), its errors
and how many calls it saw (``hits``: one attribute increment per call in the engine's
own wrappers; None for probes whose handler makes its own replacement). The recorder
writes it into ``process.end`` (``record.set_end_info``).
"""

from __future__ import annotations

import sys
import threading
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import wrapt

from mlatrace import record
from mlatrace.probe import graphs, sampling
from mlatrace.probe.packs import Pack
from mlatrace.probe.plain_probes import make_function
from mlatrace.probe.runtime import STATE, HandlerError, ProbeRuntime, load_handler
from mlatrace.probe.targets import (
    Drift,
    FieldPathError,
    InheritedError,
    Patch,
    TargetInfo,
    resolve,
    split_target,
)
from mlatrace.probe.wrapt_probes import make_wrapper

__all__ = ["MARK", "STATE", "Drift", "Engine", "HandlerError", "InheritedError", "Patch",
           "ProbeRuntime", "TargetInfo", "resolve", "split_target"]

MARK = "_self_mlatrace_probes"   # attribute on our wrappers: the probe names they carry


@dataclass
class Engine:
    """The set of installed packs and the patches they made."""

    packs: list[Pack] = field(default_factory=list)
    runtimes: list[ProbeRuntime] = field(default_factory=list)
    patches: list[Patch] = field(default_factory=list)
    # pack files that did not load at all: path -> 'file:line: reason' (probe.__init__)
    failed_packs: dict[str, str] = field(default_factory=dict)
    user_packs: list[str] = field(default_factory=list)   # given with --probes (MLATRACE_PROBES)
    # targets whose module was imported (their hook ran): the rest were never imported
    imported: set[str] = field(default_factory=set)
    lock: threading.RLock = field(default_factory=threading.RLock)
    generation: int = 0

    def install(self, packs: list[Pack]) -> None:
        """Register every probe's targets for lazy patching."""
        with self.lock:
            STATE.generation += 1
            self.generation = STATE.generation
            STATE.active = True
            record.add_close_hook(sampling.close_all)
            self.packs = list(packs)
            by_module: dict[str, list[tuple[ProbeRuntime, str]]] = {}
            for pack in packs:
                for spec in pack.probes:
                    runtime = ProbeRuntime(spec)
                    self.runtimes.append(runtime)
                    try:
                        runtime.handler = load_handler(spec)
                    except Exception as exc:  # this probe only: the others still install
                        runtime.disabled = True
                        error = (str(exc) if isinstance(exc, HandlerError)
                                 else f"{spec.source}: handler {spec.handler!r}: "
                                      f"{type(exc).__name__}: {exc}")
                        runtime.report(spec.handler or spec.qualname, error, "load")
                        runtime.skipped.update({t: f"load: {error}" for t in spec.targets})
                        continue
                    for target in spec.targets:
                        module, _ = split_target(target)
                        by_module.setdefault(module, []).append((runtime, target))
            for module_name, entries in by_module.items():
                try:
                    hook = self._hook_for(entries, self.generation)
                    if module_name in sys.modules:
                        hook(sys.modules[module_name])
                    else:
                        wrapt.register_post_import_hook(hook, module_name)
                except Exception as exc:
                    for runtime, target in entries:
                        runtime.report(target, f"cannot hook {module_name}: "
                                       f"{type(exc).__name__}: {exc}", "patch")

    def _hook_for(self, entries: list[tuple[ProbeRuntime, str]], generation: int
                  ) -> Callable[[Any], None]:
        def on_import(module: Any) -> None:
            if generation != STATE.generation or not STATE.active:
                return  # registered by an installation since undone
            for runtime, target in entries:
                self.imported.add(target)
                try:  # a hook that raised would fail the traced program's import
                    self.patch(runtime, target, module)
                except Exception as exc:
                    runtime.report(target, f"cannot patch: {type(exc).__name__}: {exc}",
                                   "patch")

        return on_import

    def patch(self, runtime: ProbeRuntime, target: str, module: Any) -> None:
        """Patch one target of one probe in an imported module (never raises)."""
        with self.lock:
            try:
                info = resolve(target, module, runtime.spec.params, runtime.spec.arg_names,
                               runtime.spec.inherited)
            except InheritedError as exc:
                runtime.skipped[target] = f"inherited: {exc}"
                return
            except FieldPathError as exc:
                runtime.skipped[target] = f"bad field: {exc}"
                runtime.report(target, f"bad field path: {exc}", "field")
                return
            except Drift as exc:
                runtime.skipped[target] = f"drift: {exc}"
                runtime.report(target, f"signature drift: {exc}", "drift")
                return
            except LookupError as exc:
                runtime.skipped[target] = f"missing: {exc}"
                runtime.report(target, f"target missing: {exc}", "missing")
                return
            except Exception as exc:
                runtime.skipped[target] = f"patch: {exc}"
                runtime.report(target, f"cannot resolve: {type(exc).__name__}: {exc}", "patch")
                return
            carried = getattr(info.raw, MARK, None) or ()
            if runtime.spec.qualname in carried:
                return  # the same function reached through another module: already patched
            try:
                make = getattr(runtime.handler, "replacement", None)
                if make is not None:
                    replacement = make(info, runtime)
                else:
                    runtime.counted = True
                    if type(info.raw) is types.FunctionType:
                        replacement = make_function(runtime, info)
                    else:
                        replacement = wrapt.FunctionWrapper(info.raw,
                                                            make_wrapper(runtime, info))
                    setattr(replacement, MARK, tuple(carried) + (runtime.spec.qualname,))
                inherited_attr = (isinstance(info.owner, type)
                                  and info.attr not in info.owner.__dict__)
                setattr(info.owner, info.attr, replacement)
            except Exception as exc:
                runtime.skipped[target] = f"patch: {exc}"
                runtime.report(target, f"cannot patch: {type(exc).__name__}: {exc}", "patch")
                return
            self.patches.append(Patch(info.owner, info.attr, info.raw, replacement, target,
                                      inherited=inherited_attr))
            runtime.patched.append(target)

    def coverage(self) -> dict[str, Any]:
        """What this process's probes covered, for ``process.end`` (schema in
        docs/trace-format.md, "Coverage"). Takes no lock: it may run in a signal handler."""
        probes: dict[str, dict[str, Any]] = {}
        packs: dict[str, dict[str, int]] = {}
        modules: set[str] = set()
        imported = self.imported
        for runtime in list(self.runtimes):
            spec = runtime.spec
            patched = list(runtime.patched)
            skipped = dict(runtime.skipped)
            not_imported = [t for t in spec.targets
                            if t not in imported and t not in skipped and t not in patched]
            entry: dict[str, Any] = {"patched": patched}
            if not_imported:
                entry["not_imported"] = len(not_imported)
                modules.update(split_target(t)[0] for t in not_imported)
            if skipped:
                entry["skipped"] = skipped
            if runtime.errors:
                entry["errors"] = len(runtime.errors)   # each one is a probe.error record
            entry["hits"] = runtime.hits if runtime.counted or not patched else None
            if runtime.disabled:
                entry["disabled"] = True
            probes[spec.qualname] = entry
            totals = packs.setdefault(spec.pack, {"probes": 0, "attached": 0, "errors": 0})
            totals["probes"] += 1
            totals["attached"] += bool(patched)
            totals["errors"] += len(runtime.errors)
        return {"packs": packs, "failed_packs": dict(self.failed_packs), "probes": probes,
                "not_imported_modules": sorted(modules), "user_packs": list(self.user_packs)}

    def forked(self) -> None:
        """In a forked child: the patches are inherited, hits and errors start again (the
        parent's probe.error records are in the parent's file)."""
        for runtime in self.runtimes:
            runtime.hits = 0
            runtime.errors = []

    def uninstall(self) -> None:
        """Undo every patch (newest first) and turn remaining wrappers into pass-throughs."""
        with self.lock:
            STATE.active = False
            STATE.generation += 1
            graphs.forget_taken_off()       # a later step must not put a wrapper back
            try:
                sampling.close_all()
            except Exception:
                pass
            for patch in reversed(self.patches):
                try:
                    current = (patch.owner.__dict__.get(patch.attr)
                               if isinstance(patch.owner, type)
                               else getattr(patch.owner, patch.attr, None))
                    if current is patch.replacement:
                        if patch.inherited:
                            delattr(patch.owner, patch.attr)  # inherit it again
                        else:
                            setattr(patch.owner, patch.attr, patch.original)
                except Exception:
                    pass
            for runtime in self.runtimes:
                sampling.forget(runtime.samplers)
                close = getattr(runtime.handler, "close", None)
                if close is not None:
                    try:
                        close()
                    except Exception:
                        pass
            self.patches.clear()
            self.runtimes.clear()
            self.packs = []
