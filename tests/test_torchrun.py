"""`mlatrace run -- torchrun --nproc-per-node 2 prog.py`: every rank traced."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import MLATRACE, PROGS

from mlatrace.trace import open_trace

pytest.importorskip("torch.distributed")
pytestmark = pytest.mark.slow     # two gloo ranks under torchrun: ~15 s on the 2-core box



def test_torchrun_two_ranks_gloo(tmp_path: Path) -> None:
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    if torchrun is None:
        pytest.skip("torchrun is not installed next to this Python")
    out = tmp_path / "trace"
    done = subprocess.run([*MLATRACE, "run", "--out", str(out), "--", torchrun, "--standalone",
                           "--nproc-per-node", "2", str(PROGS / "torchrun_prog.py")],
                          capture_output=True, text=True, timeout=240,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stderr[-3000:]
    # found anywhere in the output: another process's partial line may precede a rank's
    printed = {int(m[1]): {"world": int(m[2]), "pid": int(m[3]), "sum": int(m[4])}
               for m in re.finditer(r"rank (\d+) of (\d+) pid (\d+) sum (\d+)", done.stdout)}
    assert sorted(printed) == [0, 1], done.stdout
    assert all(p["sum"] == 3 and p["world"] == 2 for p in printed.values())  # 1 + 2

    run = json.loads((out / "run.json").read_text())
    trace = open_trace(out)
    records = {p.pid: list(p.records()) for p in trace.processes}
    assert not [str(p) for p in trace.problems]
    headers = {pid: recs[0] for pid, recs in records.items()}
    assert {h["run_id"] for h in headers.values()} == {run["run_id"]}
    [agent] = [pid for pid, h in headers.items() if h["ppid"] == run["launcher_pid"]]
    assert "torchrun" in " ".join(headers[agent]["argv"])
    ranks = {h["rank"]: pid for pid, h in headers.items() if h["rank"] is not None}
    assert sorted(ranks) == [0, 1]
    for rank, pid in ranks.items():
        header = headers[pid]
        assert header["world_size"] == 2
        assert header["env"]["LOCAL_RANK"] == str(rank) and header["env"]["RANK"] == str(rank)
        assert printed[rank]["pid"] == pid
        assert header["ppid"] == agent  # the elastic agent started it
        [split] = [r for r in records[pid] if r["k"] == "kernel.split"]
        assert split["min_kv_seq_len"] == 1 + 4096 * rank
        assert records[pid][-1]["k"] == "process.end"

    report = subprocess.run([*MLATRACE, "report", str(out)], capture_output=True, text=True,
                            timeout=60)
    assert report.returncode == 0, report.stderr
    [ranks_line] = [line for line in report.stdout.splitlines() if "ranks:" in line]
    assert ranks_line.split() == ["ranks:", "world", "size", "2,", "seen", "0,", "1"]  # none missing
