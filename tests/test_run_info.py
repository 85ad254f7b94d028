"""run.json is read through one msgspec Struct (trace/run_info.RunInfo): a field of the
wrong type is one `run.json:1` problem, the run and its processes are still read."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import FIXTURES, MLATRACE

from mlatrace.trace import open_trace

pytest.importorskip("msgspec")   # the readers run without it (the H200 image)
from mlatrace.trace.run_info import run_problem


def copy_with_run(tmp_path: Path, run: object) -> Path:
    root = tmp_path / "t"
    root.mkdir()
    for path in (FIXTURES / "legacy_one_split").glob("p*.jsonl"):
        (root / path.name).write_bytes(path.read_bytes())
    (root / "run.json").write_text(json.dumps(run))
    return root


def test_a_wrong_field_is_one_problem_and_the_rest_is_read(tmp_path: Path) -> None:
    root = copy_with_run(tmp_path, {"schema": "mlatrace/1", "run_id": "r1",
                                    "argv": "python serve.py", "start_ns": 5})
    trace = open_trace(root)
    [problem] = [p for p in trace.problems if p.file == "run.json"]
    assert (problem.line, problem.reason) == (1, "field argv: expected `array`, got `str`")
    assert trace.run["run_id"] == "r1" and trace.processes
    report = subprocess.run([*MLATRACE, "report", "--json", str(root)], capture_output=True,
                            text=True, timeout=120)
    assert report.returncode == 0, report.stderr
    assert "run.json:1: field argv" in report.stderr
    assert json.loads(report.stdout)["summary"]["findings"]["error"] == 1  # still analysed


def test_a_run_json_that_is_not_an_object_reads_as_none(tmp_path: Path) -> None:
    trace = open_trace(copy_with_run(tmp_path, ["not", "an", "object"]))
    assert trace.run is None
    assert any(p.reason == "not a JSON object (list)" for p in trace.problems)


def test_what_the_launcher_writes_is_valid() -> None:
    for path in FIXTURES.parent.parent.glob("samples/**/run.json"):
        assert run_problem(json.loads(path.read_text())) is None, path


def test_a_fresh_run_json_is_valid(tmp_path: Path) -> None:
    import sys

    out = tmp_path / "run"
    done = subprocess.run([*MLATRACE, "run", "--quiet", "--out", str(out), "--fold", "0",
                           "--ranks", "0", "--", sys.executable, "-c", "pass"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    info = json.loads((out / "run.json").read_text())
    assert run_problem(info) is None
    assert info["options"]["fold"] == "0.0" and info["options"]["ranks"] == "0"
    assert info["options"]["sample"] is None       # not given: the default
