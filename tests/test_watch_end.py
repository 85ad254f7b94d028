"""`mlatrace watch` ends on a run that ended without process.end or without its launcher."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

MLATRACE = [sys.executable, "-m", "mlatrace"]


def _killed_run(out: Path) -> None:
    code = subprocess.run([*MLATRACE, "run", "--out", str(out), "--", sys.executable, "-c",
                           "import os, signal, time; time.sleep(0.5); os.kill(os.getpid(), signal.SIGKILL)"],
                          capture_output=True, timeout=120).returncode
    assert code == 137


def _once(out: Path) -> dict:
    proc = subprocess.run([*MLATRACE, "watch", "--once", "--json", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_watch_finishes_a_run_whose_launcher_died(tmp_path: Path) -> None:
    out = tmp_path / "t"
    _killed_run(out)
    info = json.loads((out / "run.json").read_text())
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()   # a launcher pid that no longer runs
    info.update(end_ns=None, exit_code=None, launcher_pid=gone.pid)
    (out / "run.json").write_text(json.dumps(info))
    data = _once(out)
    assert data["finished"] is True, data
    info.update(launcher_pid=os.getpid())  # a launcher still running: not finished
    (out / "run.json").write_text(json.dumps(info))
    assert _once(out)["finished"] is False


def test_watch_finishes_a_killed_process_without_a_launcher(tmp_path: Path) -> None:
    out = tmp_path / "t"
    _killed_run(out)
    (out / "run.json").unlink()
    data = _once(out)
    assert data["finished"] is True, data
