"""`mlatrace demo` end to end on CPU: legacy capture at length 1 is caught, device is clean."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

pytest.importorskip("torch")


def run_demo(tmp_path: Path, policy: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = tmp_path / f"trace-{policy}"
    return subprocess.run([sys.executable, "-m", "mlatrace", "demo", "--policy", policy,
                           "--device", "cpu", "--out", str(out)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=170)


def test_demo_legacy_finds_the_frozen_one_split(tmp_path):
    result = run_demo(tmp_path, "legacy")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "NUM_KV_SPLITS frozen per layer: {0: 1, 1: 1}" in output
    assert "check: all steps match the float64 reference" in output
    assert "MLT001" in output
    assert "as expected" in output and "NOT as expected" not in output
    assert (tmp_path / "trace-legacy" / "run.json").is_file()


def test_demo_device_policy_is_clean(tmp_path):
    result = run_demo(tmp_path, "device")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "MLT001" not in output
    assert "no errors" in output and "as expected" in output
