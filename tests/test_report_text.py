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
