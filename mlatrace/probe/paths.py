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
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Sequence
from typing import Any

from mlatrace.probe import graphs

FUNCS = ("ptr", "shape", "len", "min", "max", "sum", "dtype", "capturing", "gid", "dummy",
         "layer", "isnone", "notnone")
_NO_ARG_FUNCS = ("capturing", "gid", "dummy", "layer")


class PathError(ValueError):
    """A field expression that does not parse; the message says why."""


class CallView:
    """What one probed call exposes to expressions (built on every probed call: slots)."""

    __slots__ = ("instance", "args", "kwargs", "positions", "defaults", "result")

    def __init__(self, instance: Any, args: tuple, kwargs: dict, positions: dict[str, int],
                 defaults: dict[str, Any], result: Any = None) -> None:
        self.instance = instance
        self.args = args
        self.kwargs = kwargs
        self.positions = positions      # parameter name -> index into args
        self.defaults = defaults        # parameter defaults of the real target
        self.result = result

    def arg(self, name: str) -> Any:
        if name in self.kwargs:
            return self.kwargs[name]
        index = self.positions.get(name)
        if index is not None and index < len(self.args):
            return self.args[index]
        return self.defaults.get(name)


Evaluator = Callable[[CallView], Any]

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

    def parse(self) -> Evaluator:
        if not self.tokens:
            raise PathError("empty expression")
        node = self.alternatives()
        if self.peek() is not None:
            raise PathError(f"unexpected {self.peek()[1]!r} after the expression")
        return node

    def alternatives(self) -> Evaluator:
        """a | b | c: the first value that is not None."""
        options = [self.expr()]
        while (token := self.peek()) is not None and token[1] == "|":
            self.i += 1
            options.append(self.expr())
        if len(options) == 1:
            return options[0]
        choices = tuple(options)

        def first(view: CallView) -> Any:
            for option in choices:
                value = option(view)
                if value is not None:
                    return value
            return None

        return first

    def expr(self) -> Evaluator:
        kind, value = self.take()
        if kind == "str":
            text = value[1:-1]
            return lambda view: text
        if kind == "int":
            number = int(value)
            return lambda view: number
        if kind == "float":
            real = float(value)
            return lambda view: real
        if kind != "name":
            raise PathError(f"unexpected {value!r}")
        if value in ("true", "false", "null"):
            constant = {"true": True, "false": False, "null": None}[value]
            return lambda view: constant
        nxt = self.peek()
        if nxt is not None and nxt[1] == "(":
            return self.call(value)
        return self.path(value)

    def call(self, func: str) -> Evaluator:
        if func not in FUNCS:
            raise PathError(f"unknown function {func}() (known: {', '.join(FUNCS)})")
        self.take("op", "(")
        if func in _NO_ARG_FUNCS:
            self.take("op", ")")
            return {"capturing": _capturing, "gid": _gid, "dummy": _dummy,
                    "layer": _layer}[func]
        inner = self.alternatives()
        self.take("op", ")")
        apply = _FUNC_IMPL[func]
        return lambda view: apply(inner(view))

    def path(self, root: str) -> Evaluator:
        steps: list[tuple[str, Any]] = []
        if root == "args":
            self.take("op", ".")
            name = self.take("name")[1]
            get_root: Callable[[CallView], Any] = lambda view: view.arg(name)  # noqa: E731
        elif root == "self":
            get_root = lambda view: view.instance  # noqa: E731
        elif root == "result":
            self.uses_result = True
            get_root = lambda view: view.result  # noqa: E731
        else:
            raise PathError(f"a path starts with args.<name>, self or result, not {root!r}")
        while (token := self.peek()) is not None and token[1] in (".", "["):
            self.i += 1
            if token[1] == ".":
                steps.append(("attr", self.take("name")[1]))
            else:
                kind, value = self.take()
                if kind == "int":
                    steps.append(("item", int(value)))
                elif kind == "str":
                    steps.append(("item", value[1:-1]))
                else:
                    raise PathError(f"an index is an int or a quoted key, not {value!r}")
                self.take("op", "]")
        frozen = tuple(steps)

        def evaluate(view: CallView) -> Any:
            value = get_root(view)
            for step, key in frozen:
                if value is None:
                    return None
                try:
                    value = getattr(value, key) if step == "attr" else value[key]
                except (AttributeError, KeyError, IndexError, TypeError):
                    return None
            return value

        return evaluate


def compile_expr(text: str) -> tuple[Evaluator, bool]:
    """Parse one expression; returns (evaluator, uses_result). PathError on bad input."""
    if not isinstance(text, str):
        raise PathError(f"an expression is a string, not {type(text).__name__}")
    parser = _Parser(text)
    evaluator = parser.parse()
    return evaluator, parser.uses_result


def _capturing(view: CallView) -> bool:
    return graphs.capturing()


def _gid(view: CallView) -> int | None:
    return graphs.current_gid()


def _dummy(view: CallView) -> bool:
    return graphs.in_dummy_run()


def _layer(view: CallView) -> object:
    return graphs.current_layer()


def _is_tensor(value: Any) -> bool:
    return hasattr(value, "data_ptr") and hasattr(value, "device")


def _on_host(value: Any) -> bool:
    """True for objects whose values can be read without touching a device."""
    if isinstance(value, (list, tuple, range)):
        return True
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
        return len(value)
    except Exception:
        return None


def _reduce(name: str) -> Callable[[Any], Any]:
    builtin = {"min": min, "max": max, "sum": sum}[name]

    def apply(value: Any) -> Any:
        if value is None or not _on_host(value):
            return None
        try:
            if isinstance(value, (list, tuple, range)):
                return builtin(value) if len(value) else None
            if len(value) == 0:
                return None
            return plain(getattr(value, name)())
        except Exception:
            return None

    return apply


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


def compile_fields(fields: dict[str, Any], where: Callable[[str, str], str]
                   ) -> tuple[Callable[[CallView], dict[str, Any]], bool]:
    """Compile a (nested) mapping of name -> expression into one extractor.

    ``where(name, expr)`` returns a "file:line" prefix for error messages.
    Returns (extract, uses_result).
    """
    compiled: list[tuple[str, Any]] = []
    uses_result = False
    for name, spec in fields.items():
        if isinstance(spec, dict):
            sub, sub_uses = compile_fields(spec, where)
            compiled.append((name, ("nested", sub)))
            uses_result = uses_result or sub_uses
            continue
        try:
            evaluator, uses = compile_expr(spec)
        except PathError as exc:
            raise PathError(f"{where(name, str(spec))}: field {name!r}: {exc}") from None
        compiled.append((name, ("expr", evaluator)))
        uses_result = uses_result or uses
    items: Sequence[tuple[str, Any]] = tuple(compiled)

    def extract(view: CallView) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, (kind, fn) in items:
            out[name] = fn(view) if kind == "nested" else plain(fn(view))
        return out

    return extract, uses_result
