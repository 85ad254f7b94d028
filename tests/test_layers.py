"""The layers: nothing below the outputs imports mlatrace.output, and the probe side
does not import the launcher's package (mlatrace.inject).

Read from the source (every import, function-level ones included), so a lazy import
that breaks the layering fails here, not when a newcomer moves a file.
"""

from __future__ import annotations

import ast
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
