"""`mlatrace demo` speaks at once, never stays silent for long, and cleans up after itself.

Real subprocesses: the demo on CPU with its temporary directory under a private TMPDIR,
and the relay that passes a traced program's output on, around a program that pauses.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest
from conftest import REPO

from mlatrace.reference.demo import relay

pytest.importorskip("torch")


def test_the_demo_speaks_before_torch_loads_and_removes_its_temporary_trace(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(tmp),
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    # -X importtime writes a line to stderr as each import of this process completes
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "mlatrace", "demo",
                           "--device", "cpu"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=300)
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stdout[-3000:]
    first = next(i for i, s in enumerate(lines) if s.startswith("mlatrace demo: tracing"))
    torch_loaded = [i for i, s in enumerate(lines)
                    if s.startswith("import time:") and s.rstrip().endswith("| torch")]
    assert all(i > first for i in torch_loaded), lines[:first + 1]
    assert "as expected" in done.stdout and "MLT001" in done.stdout
    assert lines[-1].startswith("demo: trace removed (it was in a temporary directory")
    assert not list(tmp.glob("mlatrace-demo-*")), list(tmp.iterdir())


PAUSING = "import time; print('before', flush=True); time.sleep(2.0); print('after')"


def test_a_silent_traced_program_is_said_to_be_still_working():
    out = io.StringIO()
    code = relay([sys.executable, "-c", PAUSING], quiet_s=0.5, out=out)
    lines = out.getvalue().splitlines()
    assert code == 0
    assert lines[0] == "before" and lines[-1] == "after"
    between = lines[1:-1]
    assert between and all(s.startswith("demo: still working (") for s in between), lines
