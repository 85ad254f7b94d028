"""The launcher's hold on its run: one run per --out, and a tree that dies with it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import MLATRACE

from mlatrace.trace import open_trace


def test_two_runs_into_one_out_the_second_exits_2(tmp_path: Path) -> None:
    out = tmp_path / "trace"
    cmd = [*MLATRACE, "run", "--out", str(out), "--", sys.executable, "-c",
           "import time; time.sleep(1)"]
    procs = [subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(p.wait(timeout=120), p.stderr.read()) for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    loser = next(err for code, err in results if code == 2)
    # the loser meets either the winner's claim (run.json) or, later, its trace files
    assert "already holds a run" in loser or "already holds a trace" in loser, loser
    run = json.loads((out / "run.json").read_text())
    headers = {p.header["run_id"] for p in open_trace(out).processes}
    assert headers == {run["run_id"]} and run["exit_code"] == 0
    # a later run into the same directory is refused too
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and "already holds a" in again.stderr


TREE = """\
import os, subprocess, sys, time
depth = int(sys.argv[1])
with open(sys.argv[2], "a") as f:
    f.write(f"{os.getpid()}\\n")
if depth < 2:
    subprocess.Popen([sys.executable, __file__, str(depth + 1), sys.argv[2]])
while True:
    time.sleep(0.1)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie child of nobody we wait for counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_sigkill_of_the_launcher_ends_the_tree_and_says_so(tmp_path: Path) -> None:
    prog, pids = tmp_path / "tree.py", tmp_path / "pids"
    prog.write_text(TREE)
    out = tmp_path / "trace"
    launcher = subprocess.Popen([*MLATRACE, "run", "--out", str(out), "--", sys.executable,
                                 str(prog), "0", str(pids)], stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (pids.exists() and len(pids.read_text().split()) == 3):
        assert time.monotonic() < deadline and launcher.poll() is None
        time.sleep(0.1)
    tree = [int(p) for p in pids.read_text().split()]
    time.sleep(0.5)  # the probes of the last one installed
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    deadline = time.monotonic() + 60
    while any(_alive(p) for p in tree) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [p for p in tree if _alive(p)]
    for pid in left:  # never leave the tree running, whatever the outcome
        os.kill(pid, signal.SIGKILL)
    assert not left, "the traced tree outlived its launcher"
    run = json.loads((out / "run.json").read_text())
    assert "the launcher" in run["abnormal_end"] and run["end_ns"]
    trace = open_trace(out)
    assert any("the run ended abnormally" in str(p) for p in trace.problems)
    ends = {}
    for proc in trace.processes:
        list(proc.records())
        ends[proc.pid] = proc.end and proc.end.get("reason")
    assert ends == {pid: "SIGTERM" for pid in tree}


def test_run_watch_of_a_failing_command_prints_its_output_tail(tmp_path: Path) -> None:
    out = tmp_path / "trace"
    prog = "import sys; print('line one'); print('ValueError: the real reason'); sys.exit(3)"
    run = subprocess.run([*MLATRACE, "run", "--watch", "--out", str(out), "--", sys.executable,
                          "-c", prog], capture_output=True, text=True, timeout=120)
    assert run.returncode == 3
    assert "exited with code 3" in run.stderr
    assert "  | ValueError: the real reason" in run.stderr, run.stderr
    assert str(out / "cmd.log") in run.stderr


def test_slow_commands_say_what_they_do(tmp_path: Path) -> None:
    """probes doctor says what it does before the imports; bench record's inner runs are
    quiet; bench splits says it needs a GPU before importing torch."""
    doctor = subprocess.run([*MLATRACE, "probes", "doctor"], capture_output=True, text=True,
                            timeout=300)
    assert doctor.stderr.startswith("probes doctor: importing the modules of"), doctor.stderr
    record = subprocess.run([*MLATRACE, "bench", "record", "--events", "2000", "--repeats", "1"],
                            capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert record.returncode == 0, record.stderr[-2000:]
    assert "look at it with" not in record.stdout + record.stderr
    quiet = subprocess.run([*MLATRACE, "run", "-q", "--out", str(tmp_path / "q"), "--",
                            sys.executable, "-c", "pass"], capture_output=True, text=True,
                           timeout=120)
    assert quiet.returncode == 0 and quiet.stderr == ""
    from mlatrace.bench import gpu_device_present

    if not gpu_device_present():
        code = ("import sys, runpy; sys.argv = ['mlatrace', 'bench', 'splits', '--quick']\n"
                "try:\n    runpy.run_module('mlatrace', run_name='__main__')\n"
                "except SystemExit as e:\n"
                "    print('torch imported' if 'torch' in sys.modules else 'torch not imported')\n"
                "    raise")
        splits = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                timeout=120, cwd=tmp_path)
        assert splits.returncode == 2 and "needs a CUDA GPU" in splits.stderr
        assert "torch not imported" in splits.stdout


def test_a_process_that_outlives_the_command_is_named_and_ends_its_file(tmp_path: Path) -> None:
    """A child the command leaves running (a resource tracker still cleaning up) is waited
    for STRAGGLER_WAIT_S, then named in run.json's `outlived`; its process.end comes when it
    ends, after the launcher returned."""
    out = tmp_path / "trace"
    child = "import time; time.sleep(8)"
    parent = (f"import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', {child!r}]);"
              " print(p.pid, flush=True)")
    proc = subprocess.run([*MLATRACE, "run", "--out", str(out), "--", sys.executable, "-c",
                           parent], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    pid = int(proc.stdout.split()[0])
    run = json.loads((out / "run.json").read_text())
    assert run["outlived"] == [pid], run
    deadline = time.monotonic() + 30
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    ends = {p.pid: list(p.records())[-1]["k"] for p in open_trace(out).processes}
    assert ends[pid] == "process.end", ends
