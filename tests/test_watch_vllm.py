"""`mlatrace watch --once` on a real vLLM CPU server while it serves.

Needs the vLLM venv of tests/e2e_vllm (skipped without it, like test_vllm_e2e.py). The
server runs under `mlatrace run` in that venv; the snapshots are taken with this
environment's mlatrace between requests, while the server is still up.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import REPO

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "e2e_vllm"))
import run_e2e  # noqa: E402  (the e2e helpers: ports, env, readiness, requests)

VENV = Path(os.environ.get("MLATRACE_VLLM_VENV", "/work/vllm-venv"))
MODEL = Path(os.environ.get("MLATRACE_TINY_MODEL",
                            Path.home() / ".cache" / "mlatrace" / "tiny-deepseek-v2-mla"))

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@pytest.fixture(scope="module")
def tiny_model() -> Path:
    if not (VENV / "bin" / "vllm").exists():
        pytest.skip(f"no vLLM venv at {VENV} (build it: bash tests/e2e_vllm/setup_env.sh {VENV})")
    subprocess.run([str(VENV / "bin" / "python"), str(HERE / "e2e_vllm" / "make_tiny_model.py"),
                    str(MODEL)], check=True, timeout=600)
    return MODEL


def _snapshot(out: Path) -> dict:
    proc = subprocess.run([sys.executable, "-m", "mlatrace", "watch", "--once", "--json", str(out)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _worker_facts(snap: dict) -> tuple[int, int | None]:
    """forward_mqa calls and the latest metadata seq_len_max, over the run's processes."""
    calls = sum(a["count"] for a in snap["report"]["attention"]
                if a["kind"] == "attn.call" and a["name"] == "forward_mqa")
    latest = [m["latest"] for m in snap["metadata"] if m["latest"]["seq_len_max"] is not None]
    newest = max(latest, key=lambda m: m["seq"]) if latest else None
    return calls, newest["seq_len_max"] if newest else None


def test_watch_once_while_vllm_serves(tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "trace"
    with tempfile.TemporaryDirectory(prefix="mlatrace-watch-vllm-") as tmp_s:
        tmp = Path(tmp_s)
        port = run_e2e.free_port()
        env = {**run_e2e.server_env(tmp), "PYTHONPATH": str(REPO)}  # this checkout's mlatrace
        # --fold 0: this test reads the live trace between two requests, record by record; a
        # fold reaches the file only when it closes (docs/folding.md, "Live views")
        cmd = [str(VENV / "bin" / "python"), "-m", "mlatrace", "run", "--fold", "0",
               "--out", str(out), "--",
               *run_e2e.serve_cmd(VENV, tiny_model, port, [])]
        with (tmp / "server.log").open("wb") as log:
            server = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, start_new_session=True)
            try:
                assert run_e2e.wait_ready(server, port, 900), \
                    (tmp / "server.log").read_text(errors="replace")[-5000:]
                snaps, requests = [], []
                for prompt in run_e2e.PROMPTS[1:]:  # two prompts, the second longer
                    requests.append(run_e2e.complete(port, tiny_model, prompt, 8))
                    time.sleep(1.0)  # the recorders flush every 200 ms
                    snaps.append(_snapshot(out))
                assert server.poll() is None  # still serving while both snapshots were taken
                text = subprocess.run([sys.executable, "-m", "mlatrace", "watch", "--once",
                                       str(out)], capture_output=True, text=True, timeout=120,
                                      env={**os.environ, "PYTHONPATH": str(REPO)}).stdout
            finally:
                run_e2e.stop(server)
    first, second = snaps
    # the three processes of vllm serve: API server -> EngineCore -> Worker, all running
    launcher = second["run"]["launcher_pid"]
    procs = {p["pid"]: p for p in second["report"]["processes"]}
    states = {p["pid"]: p["state"] for p in second["processes"]}
    api = [pid for pid, p in procs.items() if p["ppid"] == launcher]
    assert len(api) == 1
    engine = [pid for pid, p in procs.items() if p["ppid"] == api[0]
              and "--multiprocessing-fork" in " ".join(p["argv"])]
    assert len(engine) == 1
    worker = [pid for pid, p in procs.items() if p["ppid"] == engine[0]
              and "--multiprocessing-fork" in " ".join(p["argv"])]
    assert len(worker) == 1
    assert [states[pid] for pid in api + engine + worker] == ["running"] * 3
    assert not second["finished"] and second["run"]["end_ns"] is None
    # the MLA calls and the metadata lengths grow between the two snapshots
    calls1, len1 = _worker_facts(first)
    calls2, len2 = _worker_facts(second)
    assert 0 < calls1 < calls2
    p1, p2 = (r.prompt_tokens for r in requests)
    assert len1 == p1 + 7 and len2 == p2 + 7 and len2 > len1  # prompt + 8 generated - 1
    assert second["coverage"]["probe_errors"] == []
    assert "forward_mqa" in text and "running" in text and "attn.metadata" in text
