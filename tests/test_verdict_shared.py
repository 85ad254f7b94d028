"""One verdict: `check` computes it (output/check.judge) and the HTML page shows the same
exit code and headline, for a failing, a blind and a clean trace, at both thresholds."""

from __future__ import annotations

import html
import re
import subprocess
from pathlib import Path

import pytest
from conftest import FIXTURES, MLATRACE

from mlatrace.exitcodes import ExitCode
from mlatrace.output.check import judge


@pytest.mark.parametrize("trace, options, code", [
    ("legacy_one_split", (), ExitCode.FINDINGS),
    ("legacy_one_split", ("--expect", "ray.worker"), ExitCode.FINDINGS),  # and blind
    ("device_healthy", ("--expect", "ray.worker"), ExitCode.BLIND),
    ("device_healthy", (), ExitCode.CLEAN),
    ("device_healthy", ("--fail-on", "warning"), None),
])
def test_the_page_shows_checks_verdict(tmp_path: Path, trace: str, options: tuple,
                                       code: ExitCode | None) -> None:
    page = tmp_path / "page.html"
    proc = subprocess.run([*MLATRACE, "check", str(FIXTURES / trace), *options,
                           "--html", str(page)], capture_output=True, text=True, timeout=120)
    if code is not None:
        assert proc.returncode == code, proc.stdout + proc.stderr
    text = page.read_text()
    exit_code = int(re.search(r'id="verdict" class="verdict [^"]+" data-exit="(\d)"', text)[1])
    headline = html.unescape(re.search(r'data-exit="\d"><b>(.*?)</b>', text)[1])
    assert exit_code == proc.returncode
    assert proc.stdout.splitlines()[-1].startswith(headline + " (")


def test_findings_come_before_blindness_and_the_threshold_counts() -> None:
    assert judge(["warning", "error"], True, "error").code is ExitCode.FINDINGS
    assert judge(["warning"], True, "error").code is ExitCode.BLIND
    assert judge(["warning"], False, "warning").headline == \
        "FAILED: 1 finding at or above warning"
    assert judge(["error", "error"], True, "error").headline == \
        "FAILED: 2 findings at or above error (and the trace is blind, see coverage)"
    assert judge([], False, "error").headline == "OK: no finding at or above error"
