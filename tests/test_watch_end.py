"""`mlatrace watch` ends on a run that ended without process.end or without its launcher."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

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


FIXTURES = Path(__file__).parent / "fixtures"


def _screen(width: int) -> list[str]:
    from rich.console import Console

    from mlatrace.output.watch import catch_up
    from mlatrace.output.watch.state import LiveRun
    from mlatrace.output.watch.view import render

    live = LiveRun([FIXTURES / "legacy_one_split"])
    catch_up(live)
    live.refresh()
    console = Console(width=width, record=True, force_terminal=False, file=open(os.devnull, "w"))
    console.print(render(live, None, width))
    return console.export_text().splitlines()


def test_watch_view_at_80_columns_drops_columns_and_never_splits_a_word() -> None:
    lines = _screen(80)
    assert all(len(line.rstrip()) <= 80 for line in lines)
    coverage = [line for line in lines if line.startswith("coverage:")]
    assert coverage == ["coverage: 1 pack installed, attached known once a process ends; 0 "
                        "probe errors"] or len(coverage) == 1, lines
    text = "\n".join(lines)
    assert "not shown at 80 columns:" in text
    for word in ("stage-1", "FULL(num_tokens=1)", "rocm_aiter_mla", "forward_mqa"):
        # each either whole on one line, or left out with its column
        assert not any(line.rstrip().endswith(word[:4]) and word not in line for line in lines)
    assert "stag\n" not in text and "e-1" not in text.replace("stage-1", "")
    header = next(i for i, line in enumerate(lines) if line.startswith("findings"))
    assert any("MLT001" in line for line in lines[header:header + 4])
    assert header < 12   # the findings come on the first screen of a 24-line terminal
    wide = "\n".join(_screen(200))
    assert "not shown at" not in wide and "first seen" in wide


@pytest.mark.slow
def test_run_watch_in_an_80x24_terminal(tmp_path: Path) -> None:
    """`mlatrace run --watch` of the reference server in tmux at 80x24: the finding is on
    the screen, whole words only, and coverage is one line."""
    import shutil
    import time

    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed: the terminal test needs it")
    root = Path(__file__).resolve().parent.parent
    out = tmp_path / "trace"
    script = tmp_path / "watch.sh"
    script.write_text(f"export PYTHONPATH={root}\n{sys.executable} -m mlatrace run --watch "
                      f"--out {out} -- {sys.executable} -m mlatrace.reference.serve --policy "
                      "legacy --graph full --device cpu --ctx 2048 --batch 1 --layers 1 "
                      "--steps 300 --step-delay 0.1\nsleep 120\n")
    session = f"mlatrace-watch80-{os.getpid()}"

    def tmux(*args: str) -> str:
        return subprocess.run(["tmux", *args], capture_output=True, text=True, timeout=30,
                              check=True).stdout

    tmux("new-session", "-d", "-s", session, "-x", "80", "-y", "24", f"bash {script}")
    try:
        tmux("set-option", "-t", session, "window-size", "manual")
        tmux("resize-window", "-t", session, "-x", "80", "-y", "24")
        deadline = time.monotonic() + 180
        while True:
            screen = tmux("capture-pane", "-p", "-t", session)
            if "MLT001" in screen and "processes" in screen:
                break
            assert time.monotonic() < deadline, screen
            time.sleep(1)
        lines = screen.splitlines()
        assert len([line for line in lines if line.startswith("coverage:")]) == 1
        assert "stag\n" not in screen and "vllm_mla" not in screen, screen  # attached only
        assert "process killed" not in screen, screen  # running is not killed
        finding = next(i for i, line in enumerate(lines) if "MLT001" in line)
        assert "froze" in "\n".join(lines[finding:finding + 3]), screen
    finally:
        subprocess.run(["tmux", "send-keys", "-t", session, "C-c"], capture_output=True)
        time.sleep(1)
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True, timeout=30)
