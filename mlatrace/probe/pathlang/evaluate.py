"""Evaluator of the path language: parse trees -> closure chains, and a record's fields
assembled from them (the fallback where straight-line code does not apply, and the
unbound view mode that evaluates by parameter name through a CallView).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

from mlatrace.probe import graphs
from mlatrace.probe.pathlang.parser import Node, parse_expr
from mlatrace.probe.pathlang.values import (
    FUNC_IMPL,
    SCALAR_TYPES,
    dtype_of,
    len_of,
    plain,
    ptr_of,
    shape_of,
    shape_plain,
)


class CallView:
    """What one probed call exposes to expressions and handlers (slots: built per call).

    ``bound`` is (spec, extract) when the engine has compiled the probe's fields for
    this very target: ``ProbeSpec.fields_of`` then calls ``extract`` directly.
    """

    __slots__ = ("instance", "args", "kwargs", "positions", "defaults", "result", "bound")

    def __init__(self, instance: Any, args: tuple, kwargs: dict, positions: dict[str, int],
                 defaults: dict[str, Any], result: Any = None, bound: Any = None) -> None:
        self.instance = instance
        self.args = args
        self.kwargs = kwargs
        self.positions = positions      # parameter name -> index into args
        self.defaults = defaults        # parameter defaults of the real target
        self.result = result
        self.bound = bound

    def arg(self, name: str) -> Any:
        if name in self.kwargs:
            return self.kwargs[name]
        index = self.positions.get(name)
        if index is not None and index < len(self.args):
            return self.args[index]
        return self.defaults.get(name)


Evaluator = Callable[[CallView], Any]
# A compiled expression: (instance, args, kwargs, result) -> value. Bound to a target,
# args is the call's own tuple (self included for a method: indices are shifted); in
# view mode (compile_expr, unbound programs) args is the CallView and kwargs is None.
Compiled = Callable[[Any, Any, Any, Any], Any]


def compile_expr(text: str) -> tuple[Evaluator, bool]:
    """Parse one expression; returns (evaluator, uses_result). PathError on bad input.

    The evaluator takes a CallView and returns the raw value (no ``plain()``).
    """
    node, uses_result = parse_expr(text)
    compiled = build(node, None, _RAW)

    def evaluate(view: CallView) -> Any:
        return compiled(view.instance, view, None, view.result)

    return evaluate, uses_result


# --------------------------------------------------------------------- compiling

CAUGHT = (AttributeError, KeyError, IndexError, TypeError)
# How a compiled expression finishes its value: as is, through plain(), through a
# function (post), or through one of the functions inlined in the hottest closure.
_RAW, PLAIN, _POST, _PTR, _SHAPE, _DTYPE, _LEN = range(7)
NULLARY = {"capturing": "capturing", "gid": "current_gid", "dummy": "in_dummy_run",
            "layer": "current_layer"}
_INLINE = {"ptr": _PTR, "dtype": _DTYPE, "len": _LEN}   # results JSON-safe already


class Binding:
    """Where a target keeps each parameter: index into the call's args, and its default."""

    __slots__ = ("positions", "defaults", "offset")

    def __init__(self, positions: dict[str, int], defaults: dict[str, Any], offset: int) -> None:
        self.positions = positions
        self.defaults = defaults
        self.offset = offset

    def arg(self, name: str) -> tuple[int | None, Any]:
        index = self.positions.get(name)
        return (None if index is None else index + self.offset), self.defaults.get(name)


def _chain(steps: tuple) -> Callable[[Any], Any] | None:
    """One callable walking the steps from a value that is not None (None: no steps).

    It raises one of _CAUGHT where the walk yields None: getattr/item access on a None
    met along the way raises too, except for attributes None itself has (``__class__``),
    which get an explicit None check as the step-by-step walk did.
    """
    if not steps:
        return None
    getters = tuple(operator.attrgetter(key) if step == "attr" else operator.itemgetter(key)
                    for step, key in steps)
    if any(step == "attr" and hasattr(None, key) for step, key in steps[1:]):
        def walk_checked(value: Any) -> Any:
            for get in getters:
                if value is None:
                    return None
                value = get(value)
            return value

        return walk_checked
    if all(step == "attr" for step, _ in steps):
        return operator.attrgetter(".".join(key for _, key in steps))
    if len(getters) == 1:
        return getters[0]

    def walk(value: Any) -> Any:
        for get in getters:
            value = get(value)
        return value

    return walk


def _finisher(finish: Any, inline: bool = False) -> tuple[int, Any]:
    """(mode, post) for a closure; without inline support, inlined modes become posts."""
    if callable(finish):
        return _POST, finish
    if finish in (_RAW, PLAIN) or inline:
        return finish, None
    return _POST, _MODE_FUNC[finish]


def build(node: Node, binding: Binding | None, finish: Any) -> Compiled:
    """Turn a parse tree into a closure chain; finish: a mode (_RAW, _PLAIN...) or callable."""
    tag = node[0]
    if tag == "const":
        return _build_const(node[1], finish)
    if tag == "path":
        return _build_path(node[1], node[2], node[3], binding, finish)
    if tag == "call0":
        return _build_call0(node[1], finish)
    if tag == "call1":
        return build(node[2], binding, _compose(node[1], finish))
    if tag == "alt":
        return _build_alt(tuple(build(option, binding, _RAW) for option in node[1]), finish)
    raise AssertionError(f"unknown node {tag}")


def _compose(func: str, finish: Any) -> Any:
    """What finishes the inner value of func(inner), given how func's value finishes."""
    if finish in (_RAW, PLAIN):
        if func in _INLINE:
            return _INLINE[func]
        if func == "shape":
            return _SHAPE if finish == PLAIN else shape_of
        apply = FUNC_IMPL[func]
        if finish == _RAW or func in ("isnone", "notnone"):
            return apply

        def apply_plain(value: Any) -> Any:
            return plain(apply(value))

        return apply_plain
    outer = finish if callable(finish) else _MODE_FUNC[finish]
    inner = FUNC_IMPL[func]

    def apply_then(value: Any) -> Any:
        return outer(inner(value))

    return apply_then


def _build_const(value: Any, finish: Any) -> Compiled:
    mode, post = _finisher(finish)
    if mode == PLAIN:
        value = plain(value)
    if mode == _POST:
        return lambda instance, args, kwargs, result: post(value)
    return lambda instance, args, kwargs, result: value


def _build_call0(func: str, finish: Any) -> Compiled:
    fn = getattr(graphs, NULLARY[func])
    mode, post = _finisher(finish)
    if mode == _RAW or (mode == PLAIN and func != "layer"):
        return lambda instance, args, kwargs, result: fn()
    if mode == PLAIN:
        return lambda instance, args, kwargs, result: plain(fn())
    return lambda instance, args, kwargs, result: post(fn())


def _build_alt(options: tuple, finish: Any) -> Compiled:
    mode, post = _finisher(finish)
    scalars = SCALAR_TYPES

    def first(instance: Any, args: Any, kwargs: Any, result: Any) -> Any:
        value = None
        for option in options:
            value = option(instance, args, kwargs, result)
            if value is not None:
                break
        if mode == PLAIN:
            return value if type(value) in scalars else plain(value)
        if mode == _POST:
            return post(value)
        return value

    return first


def _build_path(root: str, name: str | None, steps: tuple, binding: Binding | None,
                finish: Any) -> Compiled:
    chain = _chain(steps)
    if root == "arg" and binding is not None:
        index, default = binding.arg(name)
        if index is not None:
            return _from_args(name, index, default, chain, finish)
    settle = _settler(chain, finish)

    if root == "arg" and binding is not None:
        def from_kwargs(instance: Any, args: tuple, kwargs: dict, result: Any) -> Any:
            return settle(kwargs.get(name, default))

        return from_kwargs

    if root == "arg":
        def from_view(instance: Any, view: CallView, kwargs: Any, result: Any) -> Any:
            return settle(view.arg(name))

        return from_view

    from_result = root == "result"

    def from_instance_or_result(instance: Any, args: Any, kwargs: Any, result: Any) -> Any:
        return settle(result if from_result else instance)

    return from_instance_or_result


def _settler(chain: Any, finish: Any) -> Callable[[Any], Any]:
    """What a path does with its root value: walk the chain, then finish (plain, post)."""
    mode, post = _finisher(finish)
    scalars = SCALAR_TYPES
    caught = CAUGHT

    def settle(value: Any) -> Any:
        if value is not None and chain is not None:
            try:
                value = chain(value)
            except caught:
                value = None
        if mode == PLAIN:
            return value if type(value) in scalars else plain(value)
        if mode == _POST:
            return post(value)
        return value

    return settle


def _from_args(name: str, index: int, default: Any, chain: Any, finish: Any) -> Compiled:
    """The hot case: args.<name>... of a bound target, read by index without a CallView.

    The settle step of `_settler` is written out here on purpose: one call fewer per
    field on every probed call.
    """
    mode, post = _finisher(finish)
    scalars = SCALAR_TYPES
    caught = CAUGHT

    def from_args(instance: Any, args: tuple, kwargs: dict, result: Any) -> Any:
        if kwargs and name in kwargs:
            value = kwargs[name]
        elif len(args) > index:
            value = args[index]
        else:
            value = default
        if value is not None and chain is not None:
            try:
                value = chain(value)
            except caught:
                value = None
        if mode == PLAIN:
            return value if type(value) in scalars else plain(value)
        if mode == _POST:
            return post(value)
        return value

    return from_args


_MODE_FUNC: dict[int, Callable[[Any], Any]] = {_PTR: ptr_of, _SHAPE: shape_plain,
                                               _DTYPE: dtype_of, _LEN: len_of}


def assemble(entries: tuple, binding: Binding | None) -> Callable[..., dict[str, Any]]:
    """One closure building the record's fields: a template copy, then the computed ones.

    The template holds the literals and fixes the key order. A nested table of one
    computed field is built in place (``{name: value}``); other nested tables get an
    extractor of their own, called like any field.
    """
    template: dict[str, Any] = {}
    nullary: list[tuple[str, Callable[[], Any]]] = []
    computed: list[tuple[str, Compiled]] = []
    singles: list[tuple[str, str, Compiled]] = []
    for name, item in entries:
        template[name] = None                   # fixes the key order of the output
        if not isinstance(item, tuple) or not item or isinstance(item[0], tuple):
            if len(item) == 1 and _is_computed(item[0][1]):
                singles.append((name, item[0][0], build(item[0][1], binding, PLAIN)))
            else:
                computed.append((name, assemble(item, binding)))
        elif item[0] == "const":
            template[name] = plain(item[1])
        elif item[0] == "call0" and item[1] != "layer":
            nullary.append((name, getattr(graphs, NULLARY[item[1]])))
        else:
            computed.append((name, build(item, binding, PLAIN)))
    copy = template.copy
    calls0, calls, wrapped = tuple(nullary), tuple(computed), tuple(singles)

    if not calls0 and not wrapped:
        def extract(instance: Any, args: Any, kwargs: Any, result: Any) -> dict[str, Any]:
            out = copy()
            for key, compiled in calls:
                out[key] = compiled(instance, args, kwargs, result)
            return out

        return extract

    def extract_all(instance: Any, args: Any, kwargs: Any, result: Any) -> dict[str, Any]:
        out = copy()
        for key, call in calls0:
            out[key] = call()
        for key, compiled in calls:
            out[key] = compiled(instance, args, kwargs, result)
        for key, inner, compiled in wrapped:
            out[key] = {inner: compiled(instance, args, kwargs, result)}
        return out

    return extract_all


def _is_computed(item: Any) -> bool:
    """A leaf evaluated per call through build() (not a literal, table or state function)."""
    if not isinstance(item, tuple) or not item or isinstance(item[0], tuple):
        return False
    return item[0] != "const" and not (item[0] == "call0" and item[1] != "layer")
