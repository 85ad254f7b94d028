"""Record kinds are declared once (mlatrace/kinds.py): every table of the writer, the
reader, the builder and the exports agrees with the declarations, and every declared
kind is a valid `--expect`."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import MLATRACE, REPO

from mlatrace import kinds
from mlatrace.analysis.coverage import expect_kinds
from mlatrace.analysis.model import TraceModel
from mlatrace.analysis.process_builder import ProcessBuilder
from mlatrace.trace import validate

CONSTANTS = {name: value for name, value in vars(kinds).items()
             if name.isupper() and isinstance(value, str)}   # PROCESS -> "process"


def kinds_branched_on(path: Path, variable: str = "kind") -> set[str]:
    """The kinds a module's code compares `variable` with (`kind == REPLAY`, `kind in
    (REPLAY, REPLAY_TIME)`), and the keys of its module-level `_HANDLERS` dict."""
    found: set[str] = set()
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Name) \
                and node.left.id == variable:
            for right in node.comparators:
                names = right.elts if isinstance(right, (ast.Tuple, ast.Set)) else [right]
                found.update(CONSTANTS[n.id] for n in names
                             if isinstance(n, ast.Name) and n.id in CONSTANTS)
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Dict) \
                and node.value.keys and all(isinstance(k, ast.Name) and k.id in CONSTANTS
                                            for k in node.value.keys):
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            if isinstance(target, ast.Name) and target.id == "_HANDLERS":
                found.update(CONSTANTS[k.id] for k in node.value.keys)
    return found


def test_every_kind_is_declared_once_with_its_constant() -> None:
    assert sorted(CONSTANTS.values()) == sorted(kinds.KINDS)
    assert len(set(CONSTANTS.values())) == len(CONSTANTS)


def test_the_builder_has_a_handler_for_exactly_the_built_kinds() -> None:
    builder = ProcessBuilder(TraceModel(root="t"), SimpleNamespace(name="p1.jsonl", pid=1, header=None))
    assert set(builder.handlers()) == kinds.BUILT
    # each kind in one family only
    assert sum(len(f.HANDLES) for f in ProcessBuilder.FAMILIES) == len(builder.handlers())


def test_the_reader_checks_exactly_the_checked_kinds() -> None:
    assert set(validate.CHECKS) == kinds.CHECKED


def test_the_writer_and_reader_sets_are_the_declared_ones() -> None:
    from mlatrace.probe import graphs
    from mlatrace.record import fold, recorder
    from mlatrace.trace import typed

    assert fold.STEP_KINDS == graphs.STEP_KINDS == kinds.STEP
    assert fold.FOLDABLE == kinds.FOLDS and fold.PASS == kinds.FOLD_PASSES
    assert recorder.KEEP_AT_CAP == kinds.AT_CAP
    assert typed.TYPED_KINDS == kinds.TYPED
    assert kinds.STEP <= kinds.FOLDS and not kinds.FOLDS & kinds.FOLD_PASSES
    assert not kinds.FOLDS & kinds.AT_CAP     # a folded kind is dropped at the cap


@pytest.mark.parametrize("module, declared", [
    ("mlatrace/output/export/perfetto.py", kinds.PERFETTO_OWN),
    ("mlatrace/output/export/spans.py", kinds.OTLP_OWN),
])
def test_the_exports_handle_exactly_the_kinds_declared_with_a_shape_of_their_own(
        module: str, declared: frozenset[str]) -> None:
    """Every other kind is an instant (Perfetto) or an event of its span (OTLP)."""
    assert kinds_branched_on(REPO / module) == declared


def test_the_scan_sees_a_new_branch(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("from mlatrace.kinds import MARK, SYNC\n"
                      "def f(kind):\n    return kind == MARK or kind in (SYNC,)\n")
    assert kinds_branched_on(source) == {"mark", "sync"}


@pytest.mark.parametrize("kind", sorted(kinds.KINDS))
def test_every_declared_kind_is_a_valid_expectation(kind: str) -> None:
    assert expect_kinds(kind) == (kind,)


def test_check_expect_steady_on_a_folded_trace(tmp_path: Path) -> None:
    """`check --expect steady` passes on a trace with folds and is blind without them."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]))
    serve = [sys.executable, "-m", "mlatrace.reference.serve", "--device", "cpu", "--ctx",
             "2048", "--steps", "14", "--batch", "2", "--layers", "2", "--hidden", "32",
             "--heads", "2", "--policy", "device"]
    traces = {}
    for name, fold in (("folded", "10"), ("unfolded", "0")):
        out = tmp_path / name
        run = subprocess.run([*MLATRACE, "run", "--quiet", "--out", str(out), "--fold", fold,
                              "--", *serve], env=env, capture_output=True, text=True,
                             timeout=600)
        assert run.returncode == 0, run.stderr[-2000:]
        traces[name] = out
    (path,) = traces["folded"].glob("p*.jsonl")
    assert any(json.loads(line)["k"] == "steady" for line in path.read_text().splitlines())
    for name, code in (("folded", 0), ("unfolded", 3)):
        check = subprocess.run([*MLATRACE, "check", str(traces[name]), "--expect", "steady"],
                               env=env, capture_output=True, text=True, timeout=120)
        assert check.returncode == code, check.stdout + check.stderr
    assert "expected steady" in check.stdout
