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


def _host_timed(root: Path, lens: tuple[int, ...]) -> Path:
    """The reference MLT001 trace, each torch replay timed by the host clock (a CPU host
    graph), as graph.replay.time records of via "host"."""
    import json

    import synth

    synth.mla_decode(root, replay_lens=lens)
    [path] = root.glob("p*.jsonl")
    out = []
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        rec["seq"] = len(out)
        out.append(rec)
        if rec["k"] == "graph.replay" and rec["gid"] == 2:
            out.append({"k": "graph.replay.time", "t": rec["t"] + 1, "seq": len(out), "tid": 1,
                        "gid": 2, "n": rec["n"], "gpu_ns": 44 * 60 * 10**9, "via": "host"})
    path.write_text("".join(json.dumps(r) + "\n" for r in out))
    return root


def test_units_labels_and_plurals(tmp_path: Path) -> None:
    from mlatrace.common import shorten
    from mlatrace.output.report import gpu_time

    trace = _host_timed(tmp_path / "t", (100001,))
    report = subprocess.run([*MLATRACE, "report", str(trace)], capture_output=True, text=True,
                            timeout=120, env=dict(os.environ, COLUMNS="200")).stdout
    cost = next(x for x in report.splitlines() if "MLT001 gid 1:" in x)
    assert "host time (CPU host graph) per replay p50 44 min 00 s" in cost, cost
    assert "GPU" not in cost and "1 replays" not in report
    assert "replayed 1 time up to" in report and "1 times" not in report
    assert gpu_time(2.64e12) == "44 min 00 s" and gpu_time(3 * 3600e9) == "3 h 00 min"
    assert gpu_time(2.5e9) == "2.5 s"
    argv = "python -m vllm.entrypoints.openai.api_server --model deepseek-ai/DeepSeek-V2-Lite"
    cut = shorten(argv, 40)
    assert cut.endswith("…") and len(cut) <= 40 and argv.startswith(cut[:-1])
    assert cut[:-1].split()[-1] in argv.split()   # never cut inside a word


def test_a_garbage_line_is_one_problem(tmp_path: Path) -> None:
    import shutil

    from mlatrace.trace import open_trace

    dest = tmp_path / "g"
    shutil.copytree(Path(__file__).parent / "fixtures" / "legacy_one_split", dest)
    path = dest / "p1000.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    lines[9] = '{"k": "attn.call", garbage\n'   # the record of line 10, garbled
    path.write_text("".join(lines))
    trace = open_trace(dest)
    [proc] = trace.processes
    list(proc.records())
    assert [p.line for p in trace.problems] == [10]
    assert proc.dropped == 0 and proc.gaps == 0
