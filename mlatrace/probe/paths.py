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

import enum
import keyword
import operator
import re
from collections.abc import Callable
from typing import Any

from mlatrace.probe import graphs

FUNCS = ("ptr", "shape", "len", "min", "max", "sum", "dtype", "capturing", "gid", "dummy",
         "layer", "isnone", "notnone")
_NO_ARG_FUNCS = ("capturing", "gid", "dummy", "layer")


class PathError(ValueError):
    """A field expression that does not parse; the message says why."""


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

_TOKEN = re.compile(r"""\s*(?:
    (?P<float>-?\d+\.\d*(?:[eE][-+]?\d+)?)
  | (?P<int>-?\d+)
  | (?P<str>'[^']*'|"[^"]*")
  | (?P<name>[A-Za-z_][A-Za-z_0-9]*)
  | (?P<op>[.\[\]()|])
)""", re.VERBOSE)


def _tokenize(text: str) -> list[tuple[str, str]]:
    tokens: list[tuple[str, str]] = []
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None or match.end() == pos:
            raise PathError(f"unexpected character {text[pos:].strip()[:1]!r} at {pos}")
        kind = match.lastgroup or ""
        tokens.append((kind, match.group(kind)))
        pos = match.end()
    return tokens


# Parse tree nodes (plain tuples):
#   ("const", value)
#   ("path", root, name, steps)   root: "arg" (name set), "self", "result";
#                                 steps: (("attr", NAME) | ("item", key), ...)
#   ("call0", func)               a function without argument
#   ("call1", func, node)
#   ("alt", (node, node, ...))    first value that is not None
Node = tuple


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens = _tokenize(text)
        self.i = 0
        self.uses_result = False

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self, kind: str | None = None, value: str | None = None) -> tuple[str, str]:
        token = self.peek()
        if token is None:
            raise PathError(f"expression ends early (expected {value or kind})")
        if (kind and token[0] != kind) or (value and token[1] != value):
            raise PathError(f"expected {value or kind}, got {token[1]!r}")
        self.i += 1
        return token

    def parse(self) -> Node:
        if not self.tokens:
            raise PathError("empty expression")
        node = self.alternatives()
        if self.peek() is not None:
            raise PathError(f"unexpected {self.peek()[1]!r} after the expression")
        return node

    def alternatives(self) -> Node:
        """a | b | c: the first value that is not None."""
        options = [self.expr()]
        while (token := self.peek()) is not None and token[1] == "|":
            self.i += 1
            options.append(self.expr())
        if len(options) == 1:
            return options[0]
        return ("alt", tuple(options))

    def expr(self) -> Node:
        kind, value = self.take()
        if kind == "str":
            return ("const", value[1:-1])
        if kind == "int":
            return ("const", int(value))
        if kind == "float":
            return ("const", float(value))
        if kind != "name":
            raise PathError(f"unexpected {value!r}")
        if value in ("true", "false", "null"):
            return ("const", {"true": True, "false": False, "null": None}[value])
        nxt = self.peek()
        if nxt is not None and nxt[1] == "(":
            return self.call(value)
        return self.path(value)

    def call(self, func: str) -> Node:
        if func not in FUNCS:
            raise PathError(f"unknown function {func}() (known: {', '.join(FUNCS)})")
        self.take("op", "(")
        if func in _NO_ARG_FUNCS:
            self.take("op", ")")
            return ("call0", func)
        inner = self.alternatives()
        self.take("op", ")")
        return ("call1", func, inner)

    def path(self, root: str) -> Node:
        steps: list[tuple[str, Any]] = []
        name = None
        if root == "args":
            self.take("op", ".")
            name = self.take("name")[1]
            kind = "arg"
        elif root == "self":
            kind = "self"
        elif root == "result":
            self.uses_result = True
            kind = "result"
        else:
            raise PathError(f"a path starts with args.<name>, self or result, not {root!r}")
        while (token := self.peek()) is not None and token[1] in (".", "["):
            self.i += 1
            if token[1] == ".":
                steps.append(("attr", self.take("name")[1]))
            else:
                kind_, value = self.take()
                if kind_ == "int":
                    steps.append(("item", int(value)))
                elif kind_ == "str":
                    steps.append(("item", value[1:-1]))
                else:
                    raise PathError(f"an index is an int or a quoted key, not {value!r}")
                self.take("op", "]")
        return ("path", kind, name, tuple(steps))


def parse_expr(text: str) -> tuple[Node, bool]:
    """Parse one expression into its tree; returns (node, uses_result). PathError if bad."""
    if not isinstance(text, str):
        raise PathError(f"an expression is a string, not {type(text).__name__}")
    parser = _Parser(text)
    node = parser.parse()
    return node, parser.uses_result


def compile_expr(text: str) -> tuple[Evaluator, bool]:
    """Parse one expression; returns (evaluator, uses_result). PathError on bad input.

    The evaluator takes a CallView and returns the raw value (no ``plain()``).
    """
    node, uses_result = parse_expr(text)
    compiled = _build(node, None, _RAW)

    def evaluate(view: CallView) -> Any:
        return compiled(view.instance, view, None, view.result)

    return evaluate, uses_result


# --------------------------------------------------------------------- compiling

_CAUGHT = (AttributeError, KeyError, IndexError, TypeError)
# How a compiled expression finishes its value: as is, through plain(), through a
# function (post), or through one of the functions inlined in the hottest closure.
_RAW, _PLAIN, _POST, _PTR, _SHAPE, _DTYPE, _LEN = range(7)
_NULLARY = {"capturing": "capturing", "gid": "current_gid", "dummy": "in_dummy_run",
            "layer": "current_layer"}
_INLINE = {"ptr": _PTR, "dtype": _DTYPE, "len": _LEN}   # results JSON-safe already


class _Binding:
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
    if finish in (_RAW, _PLAIN) or inline:
        return finish, None
    return _POST, _MODE_FUNC[finish]


def _build(node: Node, binding: _Binding | None, finish: Any) -> Compiled:
    """Turn a parse tree into a closure chain; finish: a mode (_RAW, _PLAIN...) or callable."""
    tag = node[0]
    if tag == "const":
        return _build_const(node[1], finish)
    if tag == "path":
        return _build_path(node[1], node[2], node[3], binding, finish)
    if tag == "call0":
        return _build_call0(node[1], finish)
    if tag == "call1":
        return _build(node[2], binding, _compose(node[1], finish))
    if tag == "alt":
        return _build_alt(tuple(_build(option, binding, _RAW) for option in node[1]), finish)
    raise AssertionError(f"unknown node {tag}")


def _compose(func: str, finish: Any) -> Any:
    """What finishes the inner value of func(inner), given how func's value finishes."""
    if finish in (_RAW, _PLAIN):
        if func in _INLINE:
            return _INLINE[func]
        if func == "shape":
            return _SHAPE if finish == _PLAIN else _shape
        apply = _FUNC_IMPL[func]
        if finish == _RAW or func in ("isnone", "notnone"):
            return apply

        def apply_plain(value: Any) -> Any:
            return plain(apply(value))

        return apply_plain
    outer = finish if callable(finish) else _MODE_FUNC[finish]
    inner = _FUNC_IMPL[func]

    def apply_then(value: Any) -> Any:
        return outer(inner(value))

    return apply_then


def _build_const(value: Any, finish: Any) -> Compiled:
    mode, post = _finisher(finish)
    if mode == _PLAIN:
        value = plain(value)
    if mode == _POST:
        return lambda instance, args, kwargs, result: post(value)
    return lambda instance, args, kwargs, result: value


def _build_call0(func: str, finish: Any) -> Compiled:
    fn = getattr(graphs, _NULLARY[func])
    mode, post = _finisher(finish)
    if mode == _RAW or (mode == _PLAIN and func != "layer"):
        return lambda instance, args, kwargs, result: fn()
    if mode == _PLAIN:
        return lambda instance, args, kwargs, result: plain(fn())
    return lambda instance, args, kwargs, result: post(fn())


def _build_alt(options: tuple, finish: Any) -> Compiled:
    mode, post = _finisher(finish)
    scalars = _SCALAR_TYPES

    def first(instance: Any, args: Any, kwargs: Any, result: Any) -> Any:
        value = None
        for option in options:
            value = option(instance, args, kwargs, result)
            if value is not None:
                break
        if mode == _PLAIN:
            return value if type(value) in scalars else plain(value)
        if mode == _POST:
            return post(value)
        return value

    return first


def _build_path(root: str, name: str | None, steps: tuple, binding: _Binding | None,
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
    scalars = _SCALAR_TYPES
    caught = _CAUGHT

    def settle(value: Any) -> Any:
        if value is not None and chain is not None:
            try:
                value = chain(value)
            except caught:
                value = None
        if mode == _PLAIN:
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
    scalars = _SCALAR_TYPES
    caught = _CAUGHT

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
        if mode == _PLAIN:
            return value if type(value) in scalars else plain(value)
        if mode == _POST:
            return post(value)
        return value

    return from_args


def _is_tensor(value: Any) -> bool:
    return hasattr(value, "data_ptr") and hasattr(value, "device")


def _on_host(value: Any) -> bool:
    """True for objects whose values can be read without touching a device."""
    if isinstance(value, (list, tuple, range)):
        return True
    is_cpu = getattr(value, "is_cpu", None)     # a tensor's own flag: no device object
    if type(is_cpu) is bool:
        return is_cpu
    device = getattr(value, "device", None)
    if device is None:
        return hasattr(value, "__array_interface__")
    return getattr(device, "type", device) == "cpu"


def _ptr(value: Any) -> int | None:
    data_ptr = getattr(value, "data_ptr", None)
    if data_ptr is None:
        return None
    try:
        return int(data_ptr())
    except Exception:
        return None


def _shape(value: Any) -> list[int] | None:
    shape = getattr(value, "shape", None)
    if shape is None:
        return None
    # torch.Size and numpy shapes are tuples of Python ints.
    return list(shape) if isinstance(shape, tuple) else None


def _len(value: Any) -> int | None:
    if value is None:
        return None
    try:
        shape = getattr(value, "shape", None)
        if isinstance(shape, tuple) and shape:
            return int(shape[0])        # an array's length (Tensor.__len__ is Python)
        return len(value)
    except Exception:
        return None


_SMALL = 256


def _small_host_ints(value: Any) -> list | None:
    """A 1-D host tensor of at most _SMALL ints as a list (one copy), else None."""
    shape = getattr(value, "shape", None)
    if not isinstance(shape, tuple) or len(shape) != 1 or shape[0] > _SMALL:
        return None
    items = value.tolist()
    return items if all(type(item) is int for item in items) else None


def _reduce(name: str) -> Callable[[Any], Any]:
    builtin = {"min": min, "max": max, "sum": sum}[name]

    def apply(value: Any) -> Any:
        if value is None or not _on_host(value):
            return None
        try:
            if isinstance(value, (list, tuple, range)):
                return builtin(value) if len(value) else None
            # A few host values (sequence lengths per request): one copy to a list
            # costs a fraction of a tensor reduction and its .item().
            items = _small_host_ints(value)
            if items is not None:
                return builtin(items) if items else None
            if _len(value) == 0:
                return None
            return plain(getattr(value, name)())
        except Exception:
            return None

    return apply


def _host_values_key(value: Any) -> Any:
    """What min/max/sum/len of a host sequence depend on, read once for a probe's key:
    its values (a tuple), else (the value's type, min, max, sum, len) as the fields read
    them. Equal keys give equal reductions."""
    if type(value) is tuple or type(value) is range:
        return value
    if type(value) is list:
        return tuple(value)
    try:
        if value is not None and _on_host(value):
            items = _small_host_ints(value)
            if items is not None:
                return tuple(items)
    except Exception:
        pass
    return (type(value), _FUNC_IMPL["min"](value), _FUNC_IMPL["max"](value),
            _FUNC_IMPL["sum"](value), _len(value))


def _dtype(value: Any) -> str | None:
    dtype = getattr(value, "dtype", None)
    return None if dtype is None else str(dtype)


_FUNC_IMPL: dict[str, Callable[[Any], Any]] = {
    "ptr": _ptr,
    "shape": _shape,
    "len": _len,
    "min": _reduce("min"),
    "max": _reduce("max"),
    "sum": _reduce("sum"),
    "dtype": _dtype,
    "isnone": lambda value: value is None,
    "notnone": lambda value: value is not None,
}


_SCALAR_TYPES = frozenset((type(None), bool, int, float, str))


def plain(value: Any) -> Any:
    """A JSON-safe copy of value; tensors and unknown objects become None (never read)."""
    if type(value) in _SCALAR_TYPES:
        return value
    if type(value) is list:
        for item in value:
            if type(item) not in _SCALAR_TYPES:
                break
        else:
            return value
    if isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, enum.Enum):
        return value.name
    if _is_tensor(value):
        # A 0-d host tensor is a number we may read; anything else stays unread.
        if _on_host(value) and getattr(value, "ndim", 1) == 0:
            try:
                return value.item()
            except Exception:
                return None
        return None
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    as_dict = getattr(value, "_asdict", None)
    if as_dict is not None and isinstance(value, tuple):
        return plain(as_dict())     # NamedTuple keys such as vLLM's BatchDescriptor
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    fields = getattr(value, "__dataclass_fields__", None)
    if fields is not None and not isinstance(value, type):
        return {name: plain(getattr(value, name, None)) for name in fields}
    item = getattr(value, "item", None)
    if item is not None and hasattr(value, "dtype") and getattr(value, "ndim", 1) == 0:
        try:
            return item()  # numpy scalar
        except Exception:
            return None
    return None


def _shape_plain(value: Any) -> list | None:
    """plain(_shape(value)) without a second walk when the items are ints (the usual)."""
    shape = getattr(value, "shape", None)
    if shape is None or not isinstance(shape, tuple):
        return None
    items = list(shape)
    for item in items:
        if type(item) is not int:
            return plain(items)
    return items


def _raw_shape(value: Any) -> tuple | None:
    """The shape as the object holds it (torch.Size, a tuple): compared, never copied."""
    shape = getattr(value, "shape", None)
    return shape if isinstance(shape, tuple) else None


def _raw_dtype(value: Any) -> Any:
    """The dtype object itself (str() of it is what a record holds)."""
    return getattr(value, "dtype", None)


def _raw_key(value: Any) -> Any:
    """A tuple of scalars as it is (a grid, say; plain() would copy it to a list), else
    plain(value)."""
    if type(value) is tuple:
        for item in value:
            if type(item) not in _SCALAR_TYPES:
                return plain(value)
        return value
    return plain(value)


NO_LAYER = object()     # a key's layer when the probe records none


_MODE_FUNC: dict[int, Callable[[Any], Any]] = {_PTR: _ptr, _SHAPE: _shape_plain,
                                              _DTYPE: _dtype, _LEN: _len}


class FieldsProgram:
    """A probe's compiled fields: a (nested) mapping of name -> expression.

    Called with a CallView it evaluates by parameter name (any target). ``bind()``
    returns the same extraction specialized to one target,
    ``extract(instance, args, kwargs, result) -> dict``.
    """

    def __init__(self, entries: tuple, uses_result: bool) -> None:
        self.entries = entries            # ((name, node | entries), ...)
        self.uses_result = uses_result
        self._by_view = _assemble(entries, None)

    def __call__(self, view: CallView) -> dict[str, Any]:
        return self._by_view(view.instance, view, None, view.result)

    def bind(self, positions: dict[str, int], defaults: dict[str, Any],
             offset: int = 0, last: str | None = None, skip: tuple[str, ...] = ()
             ) -> Callable[[Any, tuple, dict, Any], dict[str, Any]]:
        """The extraction for a target whose parameters sit at positions (+offset in args).

        Straight-line code generated for this target (``_generate``); the closure chain
        of ``_assemble`` where generation does not apply. ``last`` names a top-level
        field put last in the output (the engine's sampling pops and re-adds it);
        ``skip`` names top-level fields left out (the caller sets them).
        """
        binding = _Binding(positions, defaults, offset)
        entries = tuple(e for e in self.entries if e[0] not in skip)
        if last is not None and any(name == last for name, _ in entries):
            entries = tuple(e for e in entries if e[0] != last) + tuple(
                e for e in entries if e[0] == last)
        try:
            return _generate(entries, binding)
        except _NotGenerated:
            return _assemble(entries, binding)

    def bind_key(self, positions: dict[str, int], defaults: dict[str, Any], offset: int = 0,
                 skip: tuple[str, ...] = ()) -> Callable[[Any, tuple, dict, Any], tuple] | None:
        """What the eager sampling compares, for a target: ``key(instance, args, kwargs,
        result) -> (layer, values)``, or None where straight-line code does not apply.

        ``values`` is a tuple with one item per computed field (nested tables flattened in
        a fixed order), leaving out the literals, the top-level ``layer`` (returned apart,
        NO_LAYER when the probe has none) and the top-level fields in ``skip``. Items are
        raw where that is cheaper and says the same: a shape is the tensor's own
        ``torch.Size`` (a tuple), a dtype the dtype object, so no list, str() or dict is
        built. Two calls with equal keys have equal fields (all but ``layer`` and
        ``skip``); a different key may still give equal fields (a new run, recorded).
        """
        binding = _Binding(positions, defaults, offset)
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
        try:
            return _Generator(binding).key_function(tuple(kept), layer)
        except _NotGenerated:
            return None

    def names(self) -> list[str]:
        """The top-level field names, in order."""
        return [name for name, _ in self.entries]


def _assemble(entries: tuple, binding: _Binding | None) -> Callable[..., dict[str, Any]]:
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
                singles.append((name, item[0][0], _build(item[0][1], binding, _PLAIN)))
            else:
                computed.append((name, _assemble(item, binding)))
        elif item[0] == "const":
            template[name] = plain(item[1])
        elif item[0] == "call0" and item[1] != "layer":
            nullary.append((name, getattr(graphs, _NULLARY[item[1]])))
        else:
            computed.append((name, _build(item, binding, _PLAIN)))
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
    """A leaf evaluated per call through _build (not a literal, table or state function)."""
    if not isinstance(item, tuple) or not item or isinstance(item[0], tuple):
        return False
    return item[0] != "const" and not (item[0] == "call0" and item[1] != "layer")


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


# ------------------------------------------------------------- straight-line code

class _NotGenerated(Exception):
    """An entry shape the generator does not cover: the closure chain takes it."""


class _Generator:
    """Writes one bound extraction as a Python function: each argument read once by index,
    each path one attribute/item expression, each field one line, the record one dict
    display. The source holds only validated identifiers, ints and repr() of strings
    (the parser's tokens); constants, defaults and helpers live in its namespace. Paths
    the generator does not cover (alternatives, nested functions, steps on attributes
    that None itself has) call their closure from _build, so results are identical."""

    def __init__(self, binding: _Binding) -> None:
        self.binding = binding
        self.ns: dict[str, Any] = {"_CAUGHT": _CAUGHT, "_S": _SCALAR_TYPES, "_plain": plain,
                                   "_ptr": _ptr, "_dtype": _dtype, "_len": _len,
                                   "_shape": _shape_plain, "_rshape": _raw_shape,
                                   "_rdtype": _raw_dtype, "_rkey": _raw_key, "_NL": NO_LAYER,
                                   "_hkey": _host_values_key}
        self.lines: list[str] = []
        self.reduced: set[str] = set()      # paths whose values a key holds (key_leaf)
        self.roots: dict[str, str] = {}
        self.paths: dict[str, str] = {}
        self.uses_nargs = False
        self.count = 0

    def name(self, prefix: str, value: Any = None, bind: bool = False) -> str:
        self.count += 1
        name = f"{prefix}{self.count}"
        if bind:
            self.ns[name] = value
        return name

    def root(self, kind: str, arg: str | None) -> str:
        if kind == "self":
            return "instance"
        if kind == "result":
            return "result"
        if arg in self.roots:
            return self.roots[arg]
        index, default = self.binding.arg(arg)
        var = self.name("a")
        dflt = self.name("_d", default, bind=True)
        if index is None:
            self.lines.append(f"{var} = kwargs.get({arg!r}, {dflt})")
        else:
            self.uses_nargs = True
            self.lines.append(f"{var} = kwargs[{arg!r}] if kwargs and {arg!r} in kwargs "
                              f"else (args[{index}] if nargs > {index} else {dflt})")
        self.roots[arg] = var
        return var

    def path(self, node: Node) -> str:
        """A local holding the raw value of a path node (chain applied, None on a miss)."""
        _, kind, arg, steps = node
        base = self.root(kind, arg)
        if not steps:
            return base
        if any(step == "attr" and hasattr(None, key) for step, key in steps[1:]):
            raise _NotGenerated
        text = base
        for step, key in steps:
            if step == "attr":
                if not _IDENT.match(key) or keyword.iskeyword(key):
                    raise _NotGenerated
                text += "." + key
            elif type(key) is int or type(key) is str:
                text += f"[{key!r}]"
            else:
                raise _NotGenerated
        if text in self.paths:
            return self.paths[text]
        var = self.paths[text] = self.name("v")
        self.lines += [f"{var} = None",
                       f"if {base} is not None:",
                       "    try:",
                       f"        {var} = {text}",
                       "    except _CAUGHT:",
                       "        pass"]
        return var

    def leaf(self, node: Node) -> str:
        """An expression (or local) for one computed field, finished as plain() would."""
        tag = node[0]
        if tag == "path":
            var = self.path(node)
            return f"({var} if type({var}) in _S else _plain({var}))"
        if tag == "call1" and node[2][0] == "path":
            var = self.path(node[2])
            func = node[1]
            if func in ("ptr", "dtype", "len"):
                return f"_{func}({var})"
            if func == "shape":
                return f"_shape({var})"
            if func == "isnone":
                return f"({var} is None)"
            if func == "notnone":
                return f"({var} is not None)"
            apply = self.name("_f", _FUNC_IMPL[func], bind=True)
            return f"_plain({apply}({var}))"
        if tag == "call0":
            fn = self.name("_g", getattr(graphs, _NULLARY[node[1]]), bind=True)
            return f"_plain({fn}())" if node[1] == "layer" else f"{fn}()"
        if tag == "const":
            return self.name("_k", plain(node[1]), bind=True)
        compiled = self.name("_c", _build(node, self.binding, _PLAIN), bind=True)
        return f"{compiled}(instance, args, kwargs, result)"

    def table(self, entries: tuple) -> str:
        items = []
        for name, item in entries:
            if not isinstance(item, tuple) or not item or isinstance(item[0], tuple):
                value = self.table(item)
            else:
                value = self.leaf(item)
            items.append(f"{name!r}: {value}")
        return "{" + ", ".join(items) + "}"

    def key_leaf(self, node: Node) -> str | None:
        """The comparison value of one field (None: a literal, nothing to compare, or
        a reduction of a path whose values the key already holds)."""
        tag = node[0]
        if tag == "const":
            return None
        if tag == "call1" and node[2][0] == "path":
            if node[1] == "shape":
                return f"_rshape({self.path(node[2])})"
            if node[1] == "dtype":
                return f"_rdtype({self.path(node[2])})"
            if node[1] in ("min", "max", "sum", "len"):
                # min, max, sum and len of one path (a request's lengths): its values,
                # read once, are the key of all four.
                var = self.path(node[2])
                if var in self.reduced:
                    return None
                self.reduced.add(var)
                return f"_hkey({var})"
        if tag == "path":
            var = self.path(node)
            return f"({var} if type({var}) in _S else _rkey({var}))"
        return self.leaf(node)

    def key_items(self, entries: tuple, out: list[str]) -> None:
        for _, item in entries:
            if not isinstance(item, tuple) or not item or isinstance(item[0], tuple):
                self.key_items(item, out)
                continue
            value = self.key_leaf(item)
            if value is not None:
                out.append(value)

    def key_function(self, entries: tuple, layer: Node | None) -> Callable[..., tuple]:
        items: list[str] = []
        self.key_items(entries, items)
        layer_text = "_NL" if layer is None else self.leaf(layer)
        values = "(" + "".join(f"{item}, " for item in items) + ")"
        head = ["nargs = len(args)"] if self.uses_nargs else []
        source = "def key(instance, args, kwargs, result):\n" + "".join(
            f"    {line}\n" for line in head + self.lines) + \
            f"    return ({layer_text}, {values})\n"
        exec(compile(source, "<mlatrace probe key>", "exec"), self.ns)  # noqa: S102
        key = self.ns["key"]
        key.source = source  # type: ignore[attr-defined]
        return key

    def function(self, entries: tuple) -> Callable[..., dict[str, Any]]:
        body = self.table(entries)
        head = ["nargs = len(args)"] if self.uses_nargs else []
        source = "def extract(instance, args, kwargs, result):\n" + "".join(
            f"    {line}\n" for line in head + self.lines) + f"    return {body}\n"
        exec(compile(source, "<mlatrace probe fields>", "exec"), self.ns)  # noqa: S102
        extract = self.ns["extract"]
        extract.source = source  # type: ignore[attr-defined]
        return extract


_IDENT = re.compile(r"[A-Za-z_][A-Za-z_0-9]*\Z")


def _generate(entries: tuple, binding: _Binding) -> Callable[..., dict[str, Any]]:
    """Straight-line extraction of a bound program (raises _NotGenerated to fall back)."""
    return _Generator(binding).function(entries)
