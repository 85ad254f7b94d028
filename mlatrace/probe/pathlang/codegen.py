"""Code generator of the path language: a bound probe's extraction (and its sampling key)
written as one straight-line Python function per target.
"""

from __future__ import annotations

import keyword
import re
from collections.abc import Callable
from typing import Any

from mlatrace.probe import graphs
from mlatrace.probe.pathlang.evaluate import CAUGHT, NULLARY, PLAIN, Binding, build
from mlatrace.probe.pathlang.parser import Node
from mlatrace.probe.pathlang.values import (
    FUNC_IMPL,
    SCALAR_TYPES,
    dtype_of,
    host_values_key,
    len_of,
    plain,
    ptr_of,
    raw_dtype,
    raw_key,
    raw_shape,
    shape_plain,
)

NO_LAYER = object()     # a key's layer when the probe records none
_MOVED = ("moved",)     # in a key's const part: this field's number is in the moving part


class NotGenerated(Exception):
    """An entry shape the generator does not cover: the closure chain takes it."""


class Generator:
    """Writes one bound extraction as a Python function: each argument read once by index,
    each path one attribute/item expression, each field one line, the record one dict
    display. The source holds only validated identifiers, ints and repr() of strings
    (the parser's tokens); constants, defaults and helpers live in its namespace. Paths
    the generator does not cover (alternatives, nested functions, steps on attributes
    that None itself has) call their closure from build(), so results are identical."""

    def __init__(self, binding: Binding) -> None:
        self.binding = binding
        self.ns: dict[str, Any] = {"_CAUGHT": CAUGHT, "_S": SCALAR_TYPES, "_plain": plain,
                                   "_ptr": ptr_of, "_dtype": dtype_of, "_len": len_of,
                                   "_shape": shape_plain, "_rshape": raw_shape,
                                   "_rdtype": raw_dtype, "_rkey": raw_key, "_NL": NO_LAYER,
                                   "_hkey": host_values_key, "_T": graphs._local}
        self.inlined: dict[tuple[str, str], str] = {}   # (helper, var) -> its local
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
            raise NotGenerated
        text = base
        for step, key in steps:
            if step == "attr":
                if not _IDENT.match(key) or keyword.iskeyword(key):
                    raise NotGenerated
                text += "." + key
            elif type(key) is int or type(key) is str:
                text += f"[{key!r}]"
            else:
                raise NotGenerated
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

    def inline(self, helper: str, var: str) -> str:
        """A local holding helper(var), computed by lines in the function itself (no
        call per field): the helpers of values.py, inlined. Each is computed once."""
        done = self.inlined.get((helper, var))
        if done is not None:
            return done
        out = self.inlined[(helper, var)] = self.name("h")
        self.lines += [line.format(o=out, v=var) for line in _INLINE[helper]]
        return out

    def leaf(self, node: Node) -> str:
        """An expression (or local) for one computed field, finished as plain() would."""
        tag = node[0]
        if tag == "path":
            return self.inline("plain", self.path(node))
        if tag == "call1" and node[2][0] == "path":
            var = self.path(node[2])
            func = node[1]
            if func in ("ptr", "dtype", "shape"):
                return self.inline(func, var)
            if func == "len":
                return self.inline("len", var)
            if func in ("min", "max", "sum"):
                items = self.inline("hostints", var)
                apply = self.name("_f", FUNC_IMPL[func], bind=True)
                return (f"(({func}({items}) if {items} else None) if {items} is not None "
                        f"else _plain({apply}({var})))")
            if func == "isnone":
                return f"({var} is None)"
            if func == "notnone":
                return f"({var} is not None)"
            apply = self.name("_f", FUNC_IMPL[func], bind=True)
            return f"_plain({apply}({var}))"
        if tag == "call0" and node[1] in ("capturing", "gid"):
            return self.inline(node[1], "")
        if tag == "call0":
            fn = self.name("_g", getattr(graphs, NULLARY[node[1]]), bind=True)
            return f"_plain({fn}())" if node[1] == "layer" else f"{fn}()"
        if tag == "const":
            return self.name("_k", plain(node[1]), bind=True)
        compiled = self.name("_c", build(node, self.binding, PLAIN), bind=True)
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
                return self.inline("rshape", self.path(node[2]))
            if node[1] == "dtype":
                return self.inline("rdtype", self.path(node[2]))
            if node[1] in ("min", "max", "sum", "len"):
                # min, max, sum and len of one path (a request's lengths): its values,
                # read once, are the key of all four.
                var = self.path(node[2])
                if var in self.reduced:
                    return None
                self.reduced.add(var)
                items = self.inline("hostints", var)
                return (f"({var} if type({var}) is tuple else tuple({items}) "
                        f"if {items} is not None else _hkey({var}))")
        if tag == "path":
            return self.inline("rkey", self.path(node))
        return self.leaf(node)

    def key_items(self, entries: tuple, out: list[str]) -> None:
        for _, item in entries:
            if not isinstance(item, tuple) or not item or isinstance(item[0], tuple):
                self.key_items(item, out)
                continue
            value = self.key_leaf(item)
            if value is not None:
                out.append(value)

    def moving_items(self, entries: tuple, exact: frozenset, nested: frozenset,
                     const: list[str], table: str | None = None) -> None:
        """For key_function's `moving`: the lines that put each field a fold may hold in
        a range (a number at a top-level name not in `exact`, or in a table named in
        `nested`) into `_mv` under the fold's name, and the const items (the others'
        key values; a marker where a number moved out) into `const`."""
        for name, item in entries:
            if not isinstance(item, tuple) or not item or isinstance(item[0], tuple):
                self.moving_items(item, exact, nested, const,
                                  name if table is None and name in nested else "")
                continue
            if table is None and name in nested:
                self.hold_ok = False    # a value split may break into numbers: no moving
            if item[0] == "const" and not (type(item[1]) is int or type(item[1]) is float):
                continue                        # a literal that is no number: the same
            never_number = item[0] == "call1" and item[1] in ("dtype", "shape", "isnone",
                                                              "notnone")
            if not never_number and ((table is None and name not in exact)
                                     or (table and table in nested)):
                value = self.name("m")
                self.lines += [f"{value} = {self.leaf(item)}",
                               f"if type({value}) is int or type({value}) is float:",
                               f"    _mv[{(name if table is None else table + '.' + name)!r}]"
                               f" = {value}",
                               f"    {value} = _MV"]
                const.append(value)
            elif item[0] == "call1" and item[1] in ("min", "max", "sum", "len"):
                const.append(self.leaf(item))
            elif item[0] != "const":
                const.append(self.key_leaf(item) or self.leaf(item))

    def key_function(self, entries: tuple, layer: Node | None,
                     moving: tuple[frozenset, frozenset] | None = None) -> Callable[..., tuple]:
        items: list[str] = []
        self.key_items(entries, items)
        layer_text = "_NL" if layer is None else self.leaf(layer)
        values = "(" + "".join(f"{item}, " for item in items) + ")"
        head = ["nargs = len(args)"] if self.uses_nargs else []
        tail = f"    return ({layer_text}, {values})\n"
        parts: tuple[str, ...] = (layer_text, values)
        if moving is not None:
            const: list[str] = []
            lines = self.lines
            self.lines = []
            self.hold_ok = True
            self.moving_items(entries, *moving, const)
            if not self.hold_ok:
                raise NotGenerated
            head.append("_mv = {}")
            lines += [f"_ly = {layer_text}", *self.lines]
            self.lines = lines
            self.ns["_MV"] = _MOVED
            parts = ("_ly", values, "(_ly, " + "".join(f"{item}, " for item in const) + ")",
                     "_mv")
            tail = f"    return ({', '.join(parts)})\n"
        source = "def key(instance, args, kwargs, result):\n" + "".join(
            f"    {line}\n" for line in head + self.lines) + tail
        exec(compile(source, "<mlatrace probe key>", "exec"), self.ns)  # noqa: S102
        key = self.ns["key"]
        key.source = source  # type: ignore[attr-defined]
        key.moving = moving is not None  # type: ignore[attr-defined]
        # The same key as lines for a caller that computes it in its own frame
        # (recording.keyed_recording): they read instance, args, kwargs and result, set
        # locals named by a prefix letter and a number (a1, v2, h3, m4) or starting with
        # "_", and need `namespace`; `parts` are the expressions of the returned items.
        key.lines = head + self.lines  # type: ignore[attr-defined]
        key.namespace = self.ns  # type: ignore[attr-defined]
        key.parts = parts  # type: ignore[attr-defined]
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
# values.py's helpers as lines ({o}: the local set, {v}: the value read), for the hot
# fields: ptr_of, dtype_of, shape_plain, raw_shape, raw_dtype, graphs.capturing and
# current_gid, and the host ints that min/max/sum and the key read (values._small_host_ints
# for a host tensor, the list itself for a list or tuple; None: the helper decides).
_INLINE = {
    "ptr": ["{o} = getattr({v}, 'data_ptr', None)",
            "if {o} is not None:",
            "    try:",
            "        {o} = int({o}())",
            "    except Exception:",
            "        {o} = None"],
    "dtype": ["{o} = getattr({v}, 'dtype', None)",
              "if {o} is not None:",
              "    {o} = str({o})"],
    "shape": ["{o} = getattr({v}, 'shape', None)",
              "if isinstance({o}, tuple):",
              "    {o} = list({o})",
              "    for _i in {o}:",
              "        if type(_i) is not int:",
              "            {o} = _plain({o})",
              "            break",
              "else:",
              "    {o} = None"],
    "rshape": ["{o} = getattr({v}, 'shape', None)",
               "if not isinstance({o}, tuple):",
               "    {o} = None"],
    "rdtype": ["{o} = getattr({v}, 'dtype', None)"],
    "len": ["{o} = None",
            "if {v} is not None:",
            "    try:",
            "        _s = getattr({v}, 'shape', None)",
            "        {o} = int(_s[0]) if isinstance(_s, tuple) and _s else len({v})",
            "    except Exception:",
            "        {o} = None"],
    "plain": ["{o} = {v}",
              "if type({v}) not in _S:",
              "    if type({v}) is tuple or type({v}) is list:",
              "        {o} = list({v}) if type({v}) is tuple else {v}",
              "        for _i in {o}:",
              "            if type(_i) not in _S:",
              "                {o} = _plain({v})",
              "                break",
              "    else:",
              "        {o} = _plain({v})"],
    "rkey": ["{o} = {v}",
             "if type({v}) not in _S:",
             "    if type({v}) is tuple:",
             "        for _i in {v}:",
             "            if type(_i) not in _S:",
             "                {o} = _rkey({v})",
             "                break",
             "    else:",
             "        {o} = _rkey({v})"],
    "capturing": ["{o} = _T.stack",
                  "{o} = bool({o}) and {o}[-1] is not None"],
    "gid": ["{o} = _T.stack",
            "{o} = {o}[-1] if {o} else None"],
    "hostints": ["{o} = None",
                 "if type({v}) is list or type({v}) is tuple:",
                 "    {o} = {v}",
                 "elif getattr({v}, 'is_cpu', None) is True:",
                 "    try:",
                 "        _s = {v}.shape",
                 "        if isinstance(_s, tuple) and len(_s) == 1 and _s[0] <= 256:",
                 "            _m = type({v}).tolist",
                 "            {o} = getattr(_m, '__wrapped__', _m)({v})",
                 "    except Exception:",
                 "        {o} = None",
                 "if {o} is not None:",
                 "    for _i in {o}:",
                 "        if type(_i) is not int:",
                 "            {o} = None",
                 "            break"],
}


def generate(entries: tuple, binding: Binding) -> Callable[..., dict[str, Any]]:
    """Straight-line extraction of a bound program (raises NotGenerated to fall back)."""
    return Generator(binding).function(entries)
