"""The layers: nothing below the outputs imports mlatrace.output, and the probe side
does not import the launcher's package (mlatrace.inject).

Read from the source (every import, function-level ones included), so a lazy import
that breaks the layering fails here, not when a newcomer moves a file.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "mlatrace"

# The entry points may start an output: the command line, the pytest plugin, the bench
# and demo commands, and the bootstrap of a traced process, which starts the live OTLP
# export of `run --otlp` (mlatrace.output.export.live: it builds its spans with the same
# ProcessSpans as `mlatrace export --otlp`).
ENTRY_POINTS = {"cli.py": None, "pytest_plugin.py": None, "bench": None,
                "reference/demo.py": None,
                "inject/__init__.py": {"mlatrace.output.export.live"}}
PROBE_SIDE = ("record", "probe", "trace", "analysis", "kinds.py", "common.py", "settings.py",
              "decisions.py", "exitcodes.py")


def imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def modules() -> list[tuple[str, Path]]:
    return [(p.relative_to(PACKAGE).as_posix(), p) for p in sorted(PACKAGE.rglob("*.py"))]


def entry_allowance(rel: str) -> set[str] | None | bool:
    """None: may import any output; a set: only these; False: not an entry point."""
    for name, allowed in ENTRY_POINTS.items():
        if rel == name or rel.startswith(name + "/"):
            return allowed
    return False


def test_nothing_below_the_outputs_imports_them() -> None:
    wrong = []
    for rel, path in modules():
        if rel.startswith("output/"):
            continue
        allowed = entry_allowance(rel)
        if allowed is None:
            continue
        used = {n for n in imports(path) if n == "mlatrace.output" or
                n.startswith("mlatrace.output.")}
        used -= {n for n in used if allowed and any(n == a or n.startswith(a + ".")
                                                     or a.startswith(n + ".") for a in allowed)}
        wrong += [f"{rel} imports {n}" for n in sorted(used)]
    assert not wrong, "\n".join(wrong)


def test_the_probe_side_does_not_import_the_launcher() -> None:
    wrong = []
    for rel, path in modules():
        if not rel.startswith(PROBE_SIDE):
            continue
        wrong += [f"{rel} imports {n}" for n in sorted(imports(path))
                  if n == "mlatrace.inject" or n.startswith("mlatrace.inject.")]
    assert not wrong, "\n".join(wrong)


def test_the_check_sees_a_lazy_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from mlatrace.output.tables import Column\n")
    assert "mlatrace.output.tables" in imports(module)


NAME = re.compile(r"MLATRACE_[A-Z0-9_]*")


def env_literals(path: Path) -> list[str]:
    """MLATRACE_* names written in code (a string that is one, a keyword argument named
    one); prose that mentions one (a docstring, a message) is not a spelling of it."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                       ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and id(node) not in docstrings and NAME.fullmatch(node.value):
            found.append(f"{path.name}:{node.lineno}: {node.value[:60]!r}")
        elif isinstance(node, ast.keyword) and (node.arg or "").startswith("MLATRACE_"):
            found.append(f"{path.name}:{node.lineno}: {node.arg}=")
    return found


def test_no_mlatrace_variable_is_spelled_outside_settings_and_the_bootstrap() -> None:
    """Every MLATRACE_* name comes from settings.VARIABLES (name_of, to_env, from_env)."""
    allowed = {"settings.py", "inject/bootstrap/sitecustomize.py"}
    wrong = [hit for rel, path in modules() if rel not in allowed
             for hit in env_literals(path)]
    assert not wrong, "\n".join(wrong)


def test_the_literal_check_sees_a_name(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text('"""MLATRACE_OUT in a docstring is fine."""\n'
                      'import os\nos.environ["MLATRACE_OUT"] = "x"\ndict(MLATRACE_FOLD="1")\n'
                      'print("set MLATRACE_OUT to trace")\n')
    assert [h.split(": ", 1)[1] for h in env_literals(module)] == ["'MLATRACE_OUT'",
                                                                  "MLATRACE_FOLD="]
