"""Tokenizer and parser of the probe path language: an expression's text -> its tree.

The grammar is in `mlatrace.probe.paths`. Trees are plain tuples (see ``Node``).
"""

from __future__ import annotations

import re
from typing import Any

FUNCS = ("ptr", "shape", "len", "min", "max", "sum", "dtype", "capturing", "gid", "dummy",
         "layer", "isnone", "notnone")
_NO_ARG_FUNCS = ("capturing", "gid", "dummy", "layer")


class PathError(ValueError):
    """A field expression that does not parse; the message says why."""


_TOKEN = re.compile(r"""\s*(?:
    (?P<float>-?\d+\.\d*(?:[eE][-+]?\d+)?)
  | (?P<int>-?\d+)
  | (?P<str>'[^']*'|"[^"]*")
  | (?P<name>[A-Za-z_][A-Za-z_0-9]*)
  | (?P<op>[.\[\]()|])
)""", re.VERBOSE)


def tokenize(text: str) -> list[tuple[str, str]]:
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


class Parser:
    def __init__(self, text: str) -> None:
        self.tokens = tokenize(text)
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
    parser = Parser(text)
    node = parser.parse()
    return node, parser.uses_result
