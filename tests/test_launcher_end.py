"""The launcher's hold on its run: one run per --out, and a tree that dies with it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from mlatrace.trace import open_trace

MLATRACE = [sys.executable, "-m", "mlatrace"]


def test_two_runs_into_one_out_the_second_exits_2(tmp_path: Path) -> None:
    out = tmp_path / "trace"
    cmd = [*MLATRACE, "run", "--out", str(out), "--", sys.executable, "-c",
           "import time; time.sleep(1)"]
    procs = [subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(p.wait(timeout=120), p.stderr.read()) for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    loser = next(err for code, err in results if code == 2)
    assert "already holds a run" in loser
    run = json.loads((out / "run.json").read_text())
    headers = {p.header["run_id"] for p in open_trace(out).processes}
    assert headers == {run["run_id"]} and run["exit_code"] == 0
    # a later run into the same directory is refused too
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and "already holds a" in again.stderr
