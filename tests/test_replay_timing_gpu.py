"""Replay GPU time with CUDA events on a real CUDA graph (GPU only).

The serve program runs under torch's sync debug mode "error" while it steps, so a timer
that synchronised would fail the run; `--bench` does not synchronise between steps, so
its events are resolved by query() at later replays or at exit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _records(trace: Path) -> list[dict]:
    out = []
    for path in trace.glob("p*.jsonl"):
        out += [json.loads(line) for line in path.read_text().splitlines()]
    return out


@pytest.mark.gpu
@pytest.mark.skipif(not _has_cuda(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("bench", [False, True])
def test_cuda_replay_timing(tmp_path, bench):
    out = tmp_path / "trace"
    serve = [sys.executable, "-m", "mlatrace.reference.serve", "--device", "cuda", "--policy",
             "legacy", "--ctx", "8192", "--layers", "2", "--sync-debug"]
    serve += ["--bench", "--steps", "60", "--warmup", "4"] if bench else ["--steps", "40"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = subprocess.run([sys.executable, "-m", "mlatrace", "run", "--out", str(out),
                          "--replay-timing", "4:8", "--", *serve], env=env, cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    records = _records(out)
    assert not [r for r in records if r["k"] == "probe.error"]
    torch_gids = {r["gid"] for r in records if r["k"] == "graph.capture.begin"
                  and r["src"] == "torch"}
    # the replay-time records, and those a fold held (steady `times`, read as records)
    timed = [r for r in records if r["k"] == "graph.replay.time"] + [
        {"gid": int(gid), "n": n, "gpu_ns": gpu, "via": r["times_via"]}
        for r in records if r["k"] == "steady" for gid, times in r.get("times", {}).items()
        for n, gpu, _dt in times]
    assert timed and {r["gid"] for r in timed} <= torch_gids
    assert all(r["via"] == "cuda-event" and r["gpu_ns"] > 0 for r in timed)
    ns = sorted(r["n"] for r in timed)
    assert ns[:4] == [1, 2, 3, 4] and all(n <= 4 or n % 8 == 0 for n in ns)
    report = subprocess.run([sys.executable, "-m", "mlatrace", "report", "--json", str(out)],
                            env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    data = json.loads(report.stdout)
    gpu = data["graphs"][0]["replays"]["gpu_ns"]
    assert gpu["samples"] >= 4 and 0 < gpu["p50"] <= gpu["p90"] <= gpu["max"]
    cost = data["findings"][0]["cost"]
    assert data["findings"][0]["id"] == "MLT001" and cost["replay_gpu_ns_p50"] == gpu["p50"]
