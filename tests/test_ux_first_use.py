"""What a new user trips on (issue 39, items 1-12): each test runs the real command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import MLATRACE, SAMPLES


def mlatrace(*args: object, timeout: int = 300, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*MLATRACE, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, **kw)


# -- 7: a --probes pack that does not load is said at start-up --------------------------

def test_run_says_at_start_up_that_a_probes_pack_does_not_load(tmp_path: Path) -> None:
    bad = tmp_path / "badpack.toml"
    bad.write_text('[pack]\nname = "bad"\n\n[[probe]]\nname = "plan"\n'
                   'targets = ["shop:checkout"]\n')
    proc = mlatrace("run", "--out", tmp_path / "t", "--probes", bad, "--",
                    sys.executable, "-c", "print('hello')", timeout=120)
    assert proc.returncode == 0 and "hello" in proc.stdout
    said = [line for line in proc.stderr.splitlines() if "badpack.toml" in line]
    assert len(said) == 1, proc.stderr
    assert said[0].startswith("mlatrace run: --probes ") and "does not load" in said[0]
    assert f"{bad}:4" in said[0] and "needs a kind (or a handler)" in said[0]
    good = mlatrace("run", "--out", tmp_path / "t2", "--probes",
                    SAMPLES.parent / "probes" / "reference.toml", "--", sys.executable, "-c",
                    "pass", timeout=120)
    assert "--probes" not in good.stderr, good.stderr


# -- 8: merge --help says what --run does ------------------------------------------------

def test_merge_help_says_run_is_needed_for_several_runs() -> None:
    proc = mlatrace("merge", "--help")
    text = " ".join(proc.stdout.split())
    assert "default: the newest" not in text
    assert "required when DIRS hold several runs" in text
