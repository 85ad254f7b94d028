"""Probe targets: `module:Qualified.name` resolved in an imported module, its parameters
checked against the probe's declared ones (drift), and the patch that undoes it."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import wrapt

__all__ = ["Drift", "FieldPathError", "InheritedError", "Patch", "TargetInfo", "is_method", "param_names",
           "resolve", "split_target"]


class Drift(Exception):
    """The installed target does not have the declared parameters."""


class FieldPathError(Drift):
    """A field path that cannot resolve on this target, whatever the call: `args.self`
    of a method (the instance is `self`, not an argument)."""


@dataclass
class Patch:
    """One applied patch, enough to undo it."""

    owner: Any
    attr: str
    original: Any
    replacement: Any
    target: str
    inherited: bool = False        # the class only inherited it: undo by deleting


@dataclass
class TargetInfo:
    """A resolved target: where it lives and how to read its arguments."""

    target: str
    owner: Any
    attr: str
    raw: Any                       # the attribute as stored (descriptor included)
    func: Any                      # the plain function behind it
    names: list[str]               # its parameter names ('*args', '**kw' for var kinds)
    positions: dict[str, int]      # name -> index into the wrapper's args
    defaults: dict[str, Any]


def split_target(target: str) -> tuple[str, list[str]]:
    module, _, qual = target.partition(":")
    return module, qual.split(".")


def param_names(func: Any) -> list[str]:
    names = []
    for param in inspect.signature(func).parameters.values():
        if param.kind is inspect.Parameter.VAR_POSITIONAL:
            names.append("*" + param.name)
        elif param.kind is inspect.Parameter.VAR_KEYWORD:
            names.append("**" + param.name)
        else:
            names.append(param.name)
    return names


def resolve(target: str, module: Any, declared: list[str],
            reads: list[str] | None = None, inherited: bool = False) -> TargetInfo:
    """Find target in an imported module and check its parameters.

    Raises LookupError when the attribute is missing, ``Drift`` when the parameters
    differ, and ``InheritedError`` when a class does not override the method itself
    (the base class's own probe sees those calls).
    """
    _, parts = split_target(target)
    owner = module
    for part in parts[:-1]:
        owner = getattr(owner, part, None)
        if owner is None:
            raise LookupError(f"{target}: {part} not found")
    attr = parts[-1]
    if isinstance(owner, type):
        if attr not in owner.__dict__:
            if not hasattr(owner, attr):
                raise LookupError(f"{target}: {attr} not found")
            if not inherited:
                raise InheritedError(f"{target}: not overridden in {owner.__name__}")
            raw = getattr(owner, attr)
        else:
            raw = owner.__dict__[attr]
    else:
        raw = getattr(owner, attr, None)
        if raw is None:
            raise LookupError(f"{target}: {attr} not found")
    func = raw.__func__ if isinstance(raw, (classmethod, staticmethod)) else raw
    func = getattr(func, "__wrapped__", func) if isinstance(func, wrapt.ObjectProxy) else func
    try:
        names = param_names(func)
    except (TypeError, ValueError) as exc:
        if declared or reads:
            raise Drift(f"{target}: no signature ({exc})") from None
        names = []  # a C function; the probe declared it reads no parameters
    if declared and names[: len(declared)] != declared:
        raise Drift(f"{target}: parameters ({', '.join(names)}) do not start with "
                    f"the declared ({', '.join(declared)})")
    missing = [name for name in (reads or []) if name not in names]
    if missing and not any(name.startswith("**") for name in names):
        raise Drift(f"{target}: no parameter {', '.join(missing)} "
                    f"(has {', '.join(names)})")
    bound = isinstance(owner, type) and not isinstance(raw, staticmethod)
    if attr == "__new__":
        bound = False   # __new__ is a staticmethod called with cls explicitly
    offset = 1 if bound else 0
    if bound and names and not names[0].startswith("*") and names[0] in (reads or []):
        raise FieldPathError(f"{target}: a field reads args.{names[0]}, the instance the "
                             f"method is called on, which is no argument: it resolves to "
                             f"nothing on every call; write self.<attr> "
                             f"(args.{names[0]}.x -> self.x)")
    positions = {}
    for index, name in enumerate(names):
        if name.startswith("*"):
            break
        if index >= offset:
            positions[name] = index - offset
    try:
        defaults = {name: p.default for name, p in inspect.signature(func).parameters.items()
                    if p.default is not inspect.Parameter.empty}
    except (TypeError, ValueError):
        defaults = {}
    return TargetInfo(target, owner, attr, raw, func, names, positions, defaults)


class InheritedError(LookupError):
    """A class that inherits the method: nothing to patch at this level."""


def is_method(info: TargetInfo) -> bool:
    """A plain function stored on a class (not __new__): called with self/cls first."""
    return isinstance(info.owner, type) and info.attr != "__new__"
