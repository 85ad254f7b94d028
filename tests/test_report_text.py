"""The text report's small print: long values cut, units and plurals."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

MLATRACE = [sys.executable, "-m", "mlatrace"]


def test_a_huge_mark_attribute_is_cut_in_report_v(tmp_path: Path) -> None:
    out = tmp_path / "t"
    prog = "import mlatrace; mlatrace.mark('big', blob='x' * 10_000_000, small='[red]ok[/]')"
    assert subprocess.run([*MLATRACE, "run", "--out", str(out), "--", sys.executable, "-c",
                           prog], capture_output=True, timeout=120).returncode == 0
    report = subprocess.run([*MLATRACE, "report", "-v", str(out)], capture_output=True,
                            text=True, timeout=120, env=dict(os.environ, COLUMNS="160"))
    assert report.returncode == 0, report.stderr
    assert len(report.stdout) < 20_000, len(report.stdout)
    line = next(x for x in report.stdout.splitlines() if " big " in x)
    assert "blob=" + "x" * 80 + "… (10,000,000 chars)" in line
    assert "small=[red]ok[/]" in line   # shown as written, not as markup


RANKS = """\
import os, subprocess, sys
prog = ("from mlatrace import record\\n"
        "record.emit('graph.capture.begin', gid=1, parent=None, src='torch', key=None, mode=None)\\n"
        "record.emit('graph.capture.end', gid=1, segments=1, eager_breaks=0, dur_ns=1)\\n"
        "for _ in range(4): record.emit_replay(1)\\n")
for rank in (0, 1):
    subprocess.run([sys.executable, "-c", prog], check=True,
                   env=dict(os.environ, RANK=str(rank), WORLD_SIZE="2"))
"""


def test_ranks_left_out_do_not_count_in_the_summary(tmp_path: Path) -> None:
    import json

    prog = tmp_path / "ranks.py"
    prog.write_text(RANKS)
    out = tmp_path / "t"
    assert subprocess.run([*MLATRACE, "run", "--out", str(out), "--ranks", "0", "--",
                           sys.executable, str(prog)], capture_output=True,
                          timeout=120).returncode == 0
    data = json.loads(subprocess.run([*MLATRACE, "report", "--json", str(out)],
                                     capture_output=True, text=True, timeout=120).stdout)
    assert (data["summary"]["graphs"], data["summary"]["replays"]) == (1, 4), data["summary"]


def test_a_command_without_the_execute_bit_exits_126(tmp_path: Path) -> None:
    script = tmp_path / "serve.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o644)
    run = subprocess.run([*MLATRACE, "run", "--out", str(tmp_path / "t"), "--", str(script)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 126, run.stderr
    assert "Permission denied" in run.stderr or "not executable" in run.stderr
    missing = subprocess.run([*MLATRACE, "run", "--out", str(tmp_path / "u"), "--",
                              str(tmp_path / "nothing")], capture_output=True, text=True,
                             timeout=120)
    assert missing.returncode == 127
