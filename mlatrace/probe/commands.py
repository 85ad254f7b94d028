"""`mlatrace probes list` and `mlatrace probes doctor`.

doctor imports each target's module (this command is not a traced program; with
``--source DIR`` it parses DIR's files instead, see probe/source.py) and
says, per target: ok, inherited (the class does not override it; its base's
probe sees the calls), not installed (the library is absent), NOT FOUND (a module of a
``--probes`` pack that is not on the path: a typo, or PYTHONPATH; a pack problem), not importable
(the module fails to import here, e.g. a GPU-only backend on a CPU box), absent
(a module or attribute of another version), or DRIFT (the target exists but its
parameters differ from the pack's). A probe none of whose targets exists while
its library is installed is drift too. A probe whose handler cannot be resolved
(packs.resolve_handler: its module does not import, or has no such name) is shown as
BAD HANDLER with the pack's file:line: it would be skipped at run time (one
probe.error) while the rest of its pack installs.

doctor also checks each pack itself: a probe option its handler does not declare or of
the wrong type (the pack then does not load), a `versions` range that excludes the
installed library (`mlatrace run` leaves such a pack out), and an entry point of the
`mlatrace.packs` group that gives no pack. Exit codes: 0 none of these, 1 drift or a
pack problem, 2 a pack is malformed otherwise (bad TOML, missing fields) or a handler
does not resolve.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from mlatrace.common import installed_version
from mlatrace.exitcodes import ExitCode, MlatraceError
from mlatrace.probe.engine import Drift, InheritedError, resolve, split_target
from mlatrace.probe.packs import (
    OptionError,
    Pack,
    PackError,
    disabled_packs,
    discover,
    is_shipped,
    load_pack,
    version_problem,
)
from mlatrace.probe.targets import FieldPathError
from mlatrace.settings import Settings


@dataclass
class TargetStatus:
    """What doctor found for one target of one probe."""

    pack: str
    probe: str
    target: str
    status: str      # ok | inherited | not installed | not found | not importable | absent
                     # | drift | bad field
    detail: str = ""


def _load(extra: list[str]) -> tuple[list[Pack], list[str], list[str]]:
    """(the packs that load, their problems, what cannot load at all).

    Problems (exit 1): a mistyped or unknown option, an entry point without a pack.
    Cannot load (exit 2): a malformed pack, a handler that does not resolve; the other
    packs are still listed and checked. Handlers are resolved on the path a traced
    process has when mlatrace starts in it (`_startup_path`), whichever way doctor runs.
    """
    with _startup_path() as dropped:
        packs, problems, broken = _load_packs(extra)
    if dropped:
        hint = ("; it is in the current directory, which a traced process does not have on "
                "its path when mlatrace starts: run with PYTHONPATH=$PWD")
        for spec in (spec for pack in packs for spec in pack.probes if spec.handler_error):
            module = spec.handler.partition(":")[0] if spec.handler else ""
            if module and _in_dir(module, dropped):
                broken[broken.index(spec.handler_error)] = spec.handler_error + hint
                spec.handler_error += hint
    return packs, problems, broken


@contextlib.contextmanager
def _startup_path() -> Iterator[str | None]:
    """sys.path without the current directory ('' or the cwd, which `python -m`/`-c` put
    first only after start-up), unless PYTHONPATH names it; yields that directory (None
    when PYTHONPATH names it)."""
    cwd = os.getcwd()
    given = {os.path.realpath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    if os.path.realpath(cwd) in given:
        yield None
        return
    saved = list(sys.path)
    sys.path[:] = [p for p in sys.path if p and os.path.realpath(p) != os.path.realpath(cwd)]
    try:
        yield cwd
    finally:
        sys.path[:] = saved


def _in_dir(module: str, directory: str) -> bool:
    top = module.split(".")[0]
    return (os.path.isfile(os.path.join(directory, top + ".py"))
            or os.path.isdir(os.path.join(directory, top)))


def _load_packs(extra: list[str]) -> tuple[list[Pack], list[str], list[str]]:
    paths, entry_point_problems = discover(extra)
    packs: list[Pack] = []
    problems = [error for _, error in entry_point_problems]
    broken: list[str] = []
    for path in paths:
        try:
            pack = load_pack(path)
        except OptionError as exc:
            problems.append(str(exc))
            continue
        except PackError as exc:
            broken.append(str(exc))
            continue
        packs.append(pack)
        broken += [spec.handler_error for spec in pack.probes if spec.handler_error]
    return packs, problems, broken


def _print_problems(command: str, problems: list[str]) -> None:
    for problem in problems:
        print(f"probes {command}: {problem}", file=sys.stderr)


def list_packs(extra: list[str] | None = None) -> int:
    """Print packs, probes and targets; exit 0, or 2 when a pack or a handler does not
    load or has a problem (the rest is still listed)."""
    packs, problems, broken = _load(extra or [])
    total = sum(len(p.probes) for p in packs)
    print(f"{len(packs)} packs, {total} probes")
    for pack in packs:
        print(f"\n{pack.name}  ({pack.library})  {pack.path}")
        if pack.versions:
            print(f"  versions: {' or '.join(pack.versions)}")
        for version in pack.checked:
            print(f"  checked: {version}")
        for spec in pack.probes:
            kind = spec.kind or "(handler)"
            handler = f"  handler {spec.handler}" if spec.handler else ""
            bad = "  BAD HANDLER (not installed, see below)" if spec.handler_error else ""
            print(f"  - {spec.name}: {kind} on {spec.when}{handler}{bad}")
            for target in spec.targets:
                print(f"      {target}")
    _print_problems("list", problems + broken)
    return ExitCode.UNUSABLE if problems or broken else ExitCode.OK


def _module_status(module_name: str, cache: dict[str, tuple[object | None, str, str]],
                   skip: dict[str, str] | None = None, progress: int | None = None
                   ) -> tuple[object | None, str, str]:
    """(module, status, detail) for a target's module; imports it at most once.

    `skip`: modules not to import (module -> why); `progress`: an fd that is told each
    module before its import (the isolated check learns from it which import crashed)."""
    if module_name in cache:
        return cache[module_name]
    if skip and module_name in skip:
        cache[module_name] = (None, "not importable", skip[module_name])
        return cache[module_name]
    if progress is not None:
        os.write(progress, f"importing {module_name}\n".encode())
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


def check(packs: list[Pack], skip: dict[str, str] | None = None,
          progress: int | None = None, user: set[str] | None = None) -> list[TargetStatus]:
    """Check every target of every probe against what is installed (in this process).

    `user`: the names of the packs given with --probes. A module of theirs that cannot be
    found is "not found" (a typo, or a directory missing from the path), not "not
    installed": the user wrote the pack for this program."""
    results: list[TargetStatus] = []
    cache: dict[str, tuple[object | None, str, str]] = {}
    for pack in packs:
        for spec in pack.probes:
            if spec.handler_error:
                results.extend(TargetStatus(pack.name, spec.name, target, "bad handler",
                                            spec.handler_error) for target in spec.targets)
                continue
            probe_results = []
            for target in spec.targets:
                module_name, _ = split_target(target)
                module, status, detail = _module_status(module_name, cache, skip,
                                                        progress)
                if status == "not installed" and user and pack.name in user:
                    status = "not found"
                    detail = (f"no module {detail.removeprefix('no module ')!r} on the path "
                              "(sys.path): a typo in the target, or its directory missing "
                              "from PYTHONPATH?")
                if module is not None:
                    try:
                        resolve(target, module, spec.params, spec.arg_names, spec.inherited)
                        status, detail = "ok", ""
                    except InheritedError as exc:
                        status, detail = "inherited", str(exc).split(": ", 1)[-1]
                    except FieldPathError as exc:
                        status, detail = "bad field", str(exc).split(": ", 1)[-1]
                    except Drift as exc:
                        status, detail = "drift", str(exc).split(": ", 1)[-1]
                    except LookupError as exc:
                        status, detail = "absent", str(exc).split(": ", 1)[-1]
                probe_results.append(TargetStatus(pack.name, spec.name, target, status, detail))
            _no_target_is_drift([r for r in probe_results
                                 if r.status not in ("not installed", "not importable",
                                                     "not found")])
            results.extend(probe_results)
    return results


def _no_target_is_drift(checked: list[TargetStatus]) -> None:
    """A probe none of whose checked targets exists has drifted (its library is there)."""
    if checked and not any(r.status in ("ok", "inherited") for r in checked):
        for result in checked:
            if result.status == "absent":
                result.status = "drift"
                result.detail += " (no target of this probe exists here)"


def check_static(packs: list[Pack], found: dict[str, dict],
                 versions: dict[str, str] | None = None) -> list[TargetStatus]:
    """Check targets against static signatures (probe.source: a source tree or a snapshot).

    Only targets whose top-level package the signatures cover are checked; the others are
    "not in source". A probe none of whose covered targets exists is drift, as in `check`.
    `versions` ({library: version} of that source): a pack whose `versions` range excludes
    its library's version there is "other version", as `run` would leave it out.
    """
    from mlatrace.probe.source import compare

    results: list[TargetStatus] = []
    for pack in packs:
        there = (versions or {}).get(pack.library)
        if there and version_problem(pack, there):
            detail = f"pack is for {pack.library} {' or '.join(pack.versions)}; source has {there}"
            results.extend(TargetStatus(pack.name, spec.name, target, "other version", detail)
                           for spec in pack.probes for target in spec.targets)
            continue
        for spec in pack.probes:
            probe_results = []
            for target in spec.targets:
                entry = found.get(target, {"status": "not in source", "detail": ""})
                status, detail = compare(spec.params, spec.arg_names, entry)
                probe_results.append(TargetStatus(pack.name, spec.name, target, status, detail))
            _no_target_is_drift([r for r in probe_results if r.status != "not in source"])
            results.extend(probe_results)
    return results


MAX_CRASHES = 16


def check_isolated(extra: list[str]) -> list[TargetStatus]:
    """check() in a child interpreter, started again past any target module whose import
    kills it: two native builds of one extension that register the same torch library
    abort the process (vLLM's ROCm platform module importing `vllm._C` after the CPU
    platform loaded `vllm._C_AVX512`). Such a module is reported not importable and every
    other target is still checked; doctor itself never dies of a target."""
    crashed: dict[str, str] = {}
    while True:
        with tempfile.NamedTemporaryFile("r", suffix=".mlatrace-doctor") as log:
            env = dict(os.environ, **Settings(doctor_log=log.name,
                                              doctor_skip=json.dumps(crashed)).to_env(
                ("doctor_log", "doctor_skip")))
            with tempfile.TemporaryFile("w+") as err:
                child = subprocess.Popen([sys.executable, "-c", "from mlatrace.probe.commands "
                                          "import _check_child; _check_child()", *extra],
                                         env=env, stdout=subprocess.DEVNULL, stderr=err,
                                         text=True)
                lines = _follow_progress(child, log)
                err.seek(0)
                proc = subprocess.CompletedProcess(child.args, child.returncode, None, err.read())
        if proc.returncode == 0 and lines and lines[-1].startswith("results "):
            found = [TargetStatus(**r) for r in json.loads(lines[-1][len("results "):])]
            return found
        importing = [line[len("importing "):] for line in lines if line.startswith("importing ")]
        if not importing or importing[-1] in crashed or len(crashed) >= MAX_CRASHES:
            tail = (proc.stderr or "").strip().splitlines()[-1:] or ["no output"]
            raise RuntimeError(f"the checking interpreter exited with {proc.returncode}: "
                               f"{tail[0][:200]}")
        code = proc.returncode
        how = (f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit {code}")
        crashed[importing[-1]] = f"importing it ended the interpreter ({how}; native clash?)"


def _user_packs(packs: list[Pack], extra: list[str]) -> set[str]:
    """The names of the packs loaded from the --probes files."""
    given = {os.path.realpath(p) for p in extra}
    return {p.name for p in packs if os.path.realpath(p.path) in given}


PROGRESS_S = 0.2


def _follow_progress(child: subprocess.Popen, log: Any) -> list[str]:
    """Wait for the checking child, saying on a terminal's stderr which module it imports
    (vLLM's take seconds each); its log's lines once it ended."""
    tty = sys.stderr.isatty()
    text, shown = "", ""
    while child.poll() is None:
        time.sleep(PROGRESS_S)
        text += log.read()
        done = text[:text.rfind("\n") + 1]  # whole lines only: a write may be under way
        importing = [x for x in done.splitlines() if x.startswith("importing ")]
        if tty and importing and importing[-1] != shown:
            shown = importing[-1]
            sys.stderr.write(f"\r\x1b[K  {shown[:100]}")
            sys.stderr.flush()
    if tty:
        sys.stderr.write("\r\x1b[K")
        sys.stderr.flush()
    return (text + log.read()).splitlines()


def _check_child() -> None:
    """The child side of check_isolated: packs as the parent loads them, results as JSON."""
    packs, _problems, _broken = _load(sys.argv[1:])
    config = Settings.from_env()
    skip = json.loads(config.doctor_skip or "{}")
    fd = os.open(str(config.doctor_log), os.O_WRONLY | os.O_APPEND)
    results = check(packs, skip, progress=fd, user=_user_packs(packs, sys.argv[1:]))
    os.write(fd, ("results " + json.dumps([asdict(r) for r in results]) + "\n").encode())
    os.close(fd)


def doctor(extra: list[str] | None = None, source: str | None = None) -> int:
    """Print which targets exist and match and what is wrong with a pack; exit 1 on drift
    or a pack problem, 2 when a pack or a handler does not load (the other packs are
    still checked).

    With `source` (a directory holding packages, e.g. unpacked wheels), targets are read
    statically from that tree instead of imported (probe.source).
    """
    packs, problems, broken = _load(extra or [])
    mismatched = {pack.name: problem for pack in packs if (problem := version_problem(pack))}
    # a shipped pack for another release of its engine is "other version", not a problem
    problems += [problem for pack in packs if (problem := mismatched.get(pack.name))
                 and not is_shipped(pack.path)]
    disabled = disabled_packs()
    if source is not None:
        from mlatrace.probe.source import signatures, source_versions

        targets = [t for pack in packs for spec in pack.probes for t in spec.targets]
        there = source_versions(source)
        results = check_static(packs, signatures(source, targets), there)
        mismatched = {pack.name: problem for pack in packs
                      if (problem := version_problem(pack, there.get(pack.library)))}
    else:
        targets = sum(len(spec.targets) for pack in packs for spec in pack.probes)
        print(f"probes doctor: importing the modules of {targets} targets of {len(packs)} "
              "packs (a few seconds each where vLLM or SGLang is installed)...",
              file=sys.stderr, flush=True)
        try:
            results = check_isolated(list(extra or []))
        except RuntimeError as exc:
            raise MlatraceError(f"probes doctor: {exc}") from exc
    counts: dict[str, int] = {}
    for result in results:
        counts[result.status] = counts.get(result.status, 0) + 1
    drift = counts.get("drift", 0)
    problems += [f"{r.pack}.{r.probe}: target {r.target}: {r.detail}"
                 for r in results if r.status in ("not found", "bad field")]
    summary = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    verdicts = ([f"DRIFT in {drift} target{'' if drift == 1 else 's'}"] if drift else []) \
        + ([f"{len(problems)} pack problem{'' if len(problems) == 1 else 's'}"]
           if problems else [])
    verdict = ", ".join(verdicts) or "no drift"
    if broken:
        verdict += f"; {len(broken)} that cannot load, listed at the end"
    print(f"probes doctor: {len(packs)} packs, {len(results)} targets: {summary} -> {verdict}")
    for problem in problems:
        print(f"  PROBLEM {problem}")
    for pack in packs:
        version = installed_version(pack.library)
        installed = (f"{pack.library} {version}" if version else
                     f"{pack.library} not installed" if pack.library else
                     "no library named (its targets' modules decide)")
        if source is not None:
            installed = f"static read of {source}"
        applies = ""
        if pack.versions:
            verdict = "ok" if version else "not checked"   # (nothing installed to check)
            if pack.name in mismatched:
                verdict = ("other version: run leaves it out" if is_shipped(pack.path)
                           else "MISMATCH: run leaves it out")
            if source is not None:
                verdict = ("other version: not checked" if pack.name in mismatched else "ok") + \
                    (f" (source has {there[pack.library]})" if pack.library in there else "")
            applies = f"; versions {' or '.join(pack.versions)}: {verdict}"
        off = "; DISABLED (MLATRACE_DISABLE_PACKS)" if pack.name in disabled else ""
        checked = f"; checked against: {'; '.join(pack.checked)}" if pack.checked else ""
        print(f"\n{pack.name}: {installed}{applies}{off}{checked}")
        for result in (r for r in results if r.pack == pack.name):
            mark = result.status.upper() if result.status in ("drift", "bad handler",
                                                              "not found", "bad field") \
                else result.status
            detail = f"  ({result.detail})" if result.detail else ""
            print(f"  {mark:<15} {result.probe:<22} {result.target}{detail}")
    _print_problems("doctor", broken)
    if broken:
        return ExitCode.UNUSABLE
    return ExitCode.FAILED if drift or problems else ExitCode.OK
