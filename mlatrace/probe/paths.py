"""The probe path language: small, safe field extractors parsed once at pack load.

Grammar (no eval, no arbitrary calls):

    expr    := term ( '|' term )*          first value that is not None
    term    := literal | func '(' [expr] ')' | path
    path    := root ( '.' NAME | '[' INT ']' | '[' STRING ']' )*
    root    := 'args' '.' NAME | 'self' | 'result'
    func    := ptr | shape | len | min | max | sum | dtype | isnone | notnone
             | capturing | gid | dummy | layer   (no argument: this thread's capture
                 state, whether a probed dummy run is under way, the attention layer
                 whose forward is under way)
    literal := 'text' | "text" | INT | FLOAT | true | false | null

Evaluation never raises for missing data: a missing attribute, key or index, or a
None along the way, yields None. It never reads device memory: ``min``/``max``/``sum``
reduce only lists, tuples, numpy arrays and torch tensors on the CPU; on any other
device they yield None. ``ptr`` is ``data_ptr()`` (an int, no read), ``shape`` is
the tensor's shape as a list. Values that are not plain JSON (tensors, arbitrary
objects) become None, enums become their name.

How it runs: an expression is parsed into a small tree. Unbound (a CallView), the
tree is turned into a chain of closures. A probe's fields compile into a
``FieldsProgram``; ``bind()`` specializes it to one target once it is patched: it
writes one straight-line Python function for that target (every ``args.<name>`` read
once by its index, each path one attribute/item expression under one try, the record
one dict display), made only of the parser's validated identifiers, ints and quoted
strings, with constants and helpers in its namespace (never text from elsewhere).
Expressions it does not cover (alternatives, nested functions) call their closure.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mlatrace.probe.pathlang.codegen import NO_LAYER, Generator, NotGenerated, generate
from mlatrace.probe.pathlang.evaluate import (
    Binding,
    CallView,
    Compiled,
    Evaluator,
    assemble,
    compile_expr,
)
from mlatrace.probe.pathlang.parser import FUNCS, Node, PathError, parse_expr
from mlatrace.probe.pathlang.values import plain

__all__ = ["FUNCS", "NO_LAYER", "CallView", "Compiled", "Evaluator", "FieldsProgram", "Node",
           "PathError", "compile_expr", "compile_fields", "parse_expr", "plain"]


class FieldsProgram:
    """A probe's compiled fields: a (nested) mapping of name -> expression.

    Called with a CallView it evaluates by parameter name (any target). ``bind()``
    returns the same extraction specialized to one target,
    ``extract(instance, args, kwargs, result) -> dict``.
    """

    def __init__(self, entries: tuple, uses_result: bool) -> None:
        self.entries = entries            # ((name, node | entries), ...)
        self.uses_result = uses_result
        self._by_view = assemble(entries, None)

    def __call__(self, view: CallView) -> dict[str, Any]:
        return self._by_view(view.instance, view, None, view.result)

    def bind(self, positions: dict[str, int], defaults: dict[str, Any],
             offset: int = 0, last: str | None = None, skip: tuple[str, ...] = ()
             ) -> Callable[[Any, tuple, dict, Any], dict[str, Any]]:
        """The extraction for a target whose parameters sit at positions (+offset in args).

        Straight-line code generated for this target (``codegen.generate``); the closure
        chain of ``evaluate.assemble`` where generation does not apply. ``last`` names a top-level
        field put last in the output (the engine's sampling pops and re-adds it);
        ``skip`` names top-level fields left out (the caller sets them).
        """
        binding = Binding(positions, defaults, offset)
        entries = tuple(e for e in self.entries if e[0] not in skip)
        if last is not None and any(name == last for name, _ in entries):
            entries = tuple(e for e in entries if e[0] != last) + tuple(
                e for e in entries if e[0] == last)
        try:
            return generate(entries, binding)
        except NotGenerated:
            return assemble(entries, binding)

    def bind_key(self, positions: dict[str, int], defaults: dict[str, Any], offset: int = 0,
                 skip: tuple[str, ...] = (), moving: tuple[frozenset, frozenset] | None = None
                 ) -> Callable[[Any, tuple, dict, Any], tuple] | None:
        """What the eager sampling compares, for a target: ``key(instance, args, kwargs,
        result) -> (layer, values)``, or None where straight-line code does not apply.

        ``values`` is a tuple with one item per computed field (nested tables flattened in
        a fixed order), leaving out the literals, the top-level ``layer`` (returned apart,
        NO_LAYER when the probe has none) and the top-level fields in ``skip``. Items are
        raw where that is cheaper and says the same: a shape is the tensor's own
        ``torch.Size`` (a tuple), a dtype the dtype object, so no list, str() or dict is
        built. Two calls with equal keys have equal fields (all but ``layer`` and
        ``skip``); a different key may still give equal fields (a new run, recorded).

        ``moving`` ((exact names, nested table names), those of record.fold): the key
        function returns ``(layer, values, const, moving)`` instead, where ``moving`` is
        {fold name: number} of the fields a fold holds in ranges and ``const`` the rest
        (with the layer): equal consts give equal fields but for those numbers. Where a
        field's value may be a table the fold breaks into numbers, the plain key is
        returned (its ``moving`` attribute is False).
        """
        binding = Binding(positions, defaults, offset)
        layer = None
        kept = []
        for name, item in self.entries:
            if name in skip:
                continue
            if name == "layer" and isinstance(item, tuple) and item and \
                    not isinstance(item[0], tuple):
                layer = item
                continue
            kept.append((name, item))
        if moving is not None:
            try:
                return Generator(binding).key_function(tuple(kept), layer, moving)
            except NotGenerated:
                pass
        try:
            return Generator(binding).key_function(tuple(kept), layer)
        except NotGenerated:
            return None

    def names(self) -> list[str]:
        """The top-level field names, in order."""
        return [name for name, _ in self.entries]


def _parse_fields(fields: dict[str, Any], where: Callable[[str, str], str]
                  ) -> tuple[tuple, bool]:
    entries: list[tuple[str, Any]] = []
    uses_result = False
    for name, spec in fields.items():
        if isinstance(spec, dict):
            sub, sub_uses = _parse_fields(spec, where)
            entries.append((name, sub))
            uses_result = uses_result or sub_uses
            continue
        try:
            node, uses = parse_expr(spec)
        except PathError as exc:
            raise PathError(f"{where(name, str(spec))}: field {name!r}: {exc}") from None
        entries.append((name, node))
        uses_result = uses_result or uses
    return tuple(entries), uses_result


def compile_fields(fields: dict[str, Any], where: Callable[[str, str], str]
                   ) -> tuple[FieldsProgram, bool]:
    """Compile a (nested) mapping of name -> expression into one extractor.

    ``where(name, expr)`` returns a "file:line" prefix for error messages.
    Returns (extract, uses_result): ``extract(view)`` gives the fields of one call,
    ``extract.bind(positions, defaults, offset)`` the same for one patched target.
    """
    entries, uses_result = _parse_fields(fields, where)
    return FieldsProgram(entries, uses_result), uses_result
