"""Static target checks: probe targets and their parameters read from a source tree (ast).

`mlatrace probes doctor --source DIR` checks packs against an unpacked wheel or a checkout
without importing anything, since CUDA-only backends fail to import on a CPU box. The same
signatures, saved as JSON (tests/probe_signatures.json, made by tests/make_probe_signatures.py),
let tests check the shipped packs against vLLM and SGLang releases that are not installed.

What a static read can tell: the module file exists; the function or class attribute is
defined there (a class that only inherits it is reported as inherited, bases are not
followed); its parameter names in inspect's order (positional-only, positional, *args,
keyword-only, **kwargs). Decorators are not applied: a decorator that changes the
signature is invisible here. A pack whose `versions` exclude the version of its library
found in the tree (its *.dist-info) is not checked there: "other version".
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

SIGNATURES_SCHEMA = "mlatrace-signatures/1"


def module_file(root: Path, module: str) -> Path | None:
    base = root.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _params(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    a = node.args
    names = [p.arg for p in a.posonlyargs] + [p.arg for p in a.args]
    if a.vararg is not None:
        names.append("*" + a.vararg.arg)
    names += [p.arg for p in a.kwonlyargs]
    if a.kwarg is not None:
        names.append("**" + a.kwarg.arg)
    return names


def _defined(body: list[ast.stmt], name: str) -> ast.AST | None:
    """The last top-level definition of `name` in a body (if/try branches included)."""
    found = None
    stack = list(body)
    while stack:
        node = stack.pop(0)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name == name:
                found = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                found = node
        elif isinstance(node, (ast.ImportFrom, ast.Import)):
            if any((alias.asname or alias.name.split(".")[0]) == name for alias in node.names):
                found = node
        elif isinstance(node, (ast.If, ast.Try)):
            stack = list(node.body) + list(node.orelse) + [
                s for h in getattr(node, "handlers", []) for s in h.body] + stack
    return found


def signature_of(root: Path, target: str, cache: dict[Path, ast.Module] | None = None
                 ) -> dict[str, Any]:
    """{"params": [...]} for a function/method target, else {"status": ..., "detail": ...}."""
    module, _, qual = target.partition(":")
    path = module_file(root, module)
    if path is None:
        top = root / module.split(".")[0]
        status = "absent" if top.exists() else "not in source"
        return {"status": status, "detail": f"no module {module}"}
    cache = cache if cache is not None else {}
    tree = cache.get(path)
    if tree is None:
        tree = cache[path] = ast.parse(path.read_text(encoding="utf-8"), str(path))
    body: list[ast.stmt] = tree.body
    parts = qual.split(".")
    parent: ast.ClassDef | None = None
    for index, part in enumerate(parts):
        node = _defined(body, part)
        if node is None:
            owner = parts[index - 1] if index else module
            if parent is not None and parent.bases:
                return {"status": "inherited", "detail": f"not defined in {owner}'s body"}
            return {"status": "absent", "detail": f"{part} not found in {owner}"}
        if index == len(parts) - 1:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return {"params": _params(node), "line": node.lineno,
                        "file": str(path.relative_to(root))}
            return {"status": "not a function", "detail": f"{part} is a {type(node).__name__}"}
        if not isinstance(node, ast.ClassDef):
            return {"status": "absent", "detail": f"{part} is not a class"}
        parent = node
        body = node.body
    return {"status": "absent", "detail": "empty target"}


def signatures(root: str | Path, targets: list[str]) -> dict[str, dict[str, Any]]:
    """The static signature of each target under `root` (see signature_of)."""
    cache: dict[Path, ast.Module] = {}
    return {target: signature_of(Path(root), target, cache) for target in targets}


def source_versions(root: str | Path) -> dict[str, str]:
    """{library: version} of the distributions unpacked under `root` (their *.dist-info),
    named as packs name their library (mlatrace.common.DISTRIBUTIONS)."""
    from mlatrace.common import DISTRIBUTIONS

    library_of = {dist.lower().replace("-", "_"): lib
                  for lib, dists in DISTRIBUTIONS.items() for dist in dists}
    found: dict[str, str] = {}
    for info in sorted(Path(root).glob("*.dist-info")):
        name, _, version = info.name[: -len(".dist-info")].partition("-")
        library = library_of.get(name.lower().replace("-", "_"), name)
        if version:
            found.setdefault(library, version)
    return found


def compare(declared: list[str], reads: list[str], found: dict[str, Any]) -> tuple[str, str]:
    """(status, detail) of one probe target against its static signature."""
    if "params" not in found:
        return found.get("status", "absent"), found.get("detail", "")
    names = found["params"]
    if declared and names[: len(declared)] != declared:
        return "drift", (f"parameters ({', '.join(names)}) do not start with the declared "
                         f"({', '.join(declared)})")
    missing = [n for n in reads if n not in names]
    if missing and not any(n.startswith("**") for n in names):
        return "drift", f"no parameter {', '.join(missing)} (has {', '.join(names)})"
    return "ok", f"{found.get('file', '')}:{found.get('line', '')}"
