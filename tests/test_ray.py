"""Ray workers traced through Ray's runtime environment, on a real local cluster.

The cluster is started by the test with `ray start --head --block` (not by the traced
program), on 127.0.0.1 only, one CPU, no dashboard; the finalizer ends exactly the
processes of that cluster (its process group, then any process naming its private
temp dir) so nothing is left behind.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import MLATRACE, PROGS

from mlatrace.trace import open_trace

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow     # a real local Ray cluster: ~30 s on the 2-core box

# Loopback only: Ray otherwise replaces 127.0.0.1 by the machine's address and listens there.
RAY_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pids_naming(text: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            pids.append(int(entry.name))
    return pids


def _end_cluster(head: subprocess.Popen, temp_dir: str) -> None:
    for sig, wait_s in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(head.pid, sig)
        except ProcessLookupError:
            pass
        try:
            head.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
        break
    _end_leftovers(temp_dir)


def _end_leftovers(temp_dir: str) -> None:
    deadline = time.monotonic() + 10
    while (left := _pids_naming(temp_dir)) and time.monotonic() < deadline:
        for pid in left:  # raylet-started processes outside the group: ours by the temp dir
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.2)
    shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def ray_head():
    """A separately started single-node cluster: yields (address, raylet pid)."""
    port = _free_port()
    temp_dir = tempfile.mkdtemp(prefix="mlray", dir="/tmp")  # short: Ray's unix sockets
    # Ray keeps its sessions under RAY_TMPDIR and may write ~/.ray/auth_token: both in the
    # cluster's own temp dir, which the drivers are given too.
    env = dict(os.environ, **RAY_ENV, RAY_TMPDIR=temp_dir, HOME=temp_dir)
    log = open(Path(temp_dir) / "head.log", "w")
    head = subprocess.Popen(
        [shutil.which("ray", path=os.path.dirname(sys.executable)) or "ray", "start", "--head",
         "--block", "--port", str(port), "--node-ip-address", "127.0.0.1", "--num-cpus", "1",
         "--include-dashboard=false", "--disable-usage-stats"],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        raylet = []
        while time.monotonic() < deadline and head.poll() is None:
            raylet = [p for p in _pids_naming(temp_dir)
                      if "raylet/raylet" in Path(f"/proc/{p}/cmdline").read_bytes().decode(
                          errors="replace")]
            if raylet and "Ray runtime started" in (Path(temp_dir) / "head.log").read_text():
                break
            time.sleep(0.5)
        else:
            pytest.fail("ray start --head did not come up: "
                        + (Path(temp_dir) / "head.log").read_text()[-2000:])
        yield f"127.0.0.1:{port}", raylet[0], temp_dir
    finally:
        _end_cluster(head, temp_dir)
        log.close()


def _traced_driver(out: Path, *args: str, ray_tmp: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, **RAY_ENV, RAY_TMPDIR=ray_tmp, HOME=ray_tmp)
    return subprocess.run([*MLATRACE, "run", "--out", str(out), "--", sys.executable,
                           str(PROGS / "ray_driver.py"), *args],
                          env=env, capture_output=True, text=True, timeout=180)


def _actors(stdout: str) -> dict[int, dict]:
    out = {}
    for line in stdout.splitlines():
        if line.startswith("actor "):
            _, pid, ppid, _, splits, _, user = line.split()
            out[int(pid)] = {"ppid": int(ppid), "splits": int(splits), "user": user}
    return out


def _check_trace(out: Path, actors: dict[int, dict]) -> dict[int, list[dict]]:
    """Same run id everywhere; one file per actor with its kernel.split; the driver's
    ray.init carried the settings. Returns the records by pid."""
    run = json.loads((out / "run.json").read_text())
    trace = open_trace(out)
    records = {p.pid: list(p.records()) for p in trace.processes}
    assert not [str(p) for p in trace.problems if "truncated" not in p.reason]
    headers = {pid: recs[0] for pid, recs in records.items()}
    assert {h["run_id"] for h in headers.values()} == {run["run_id"]}
    [driver] = [pid for pid, h in headers.items() if h["ppid"] == run["launcher_pid"]]
    init = [r for r in records[driver] if r["k"] == "ray.init"]
    assert init and {"MLATRACE_OUT", "MLATRACE_RUN_ID", "PYTHONPATH"} <= set(init[0]["env_vars"])
    assert set(actors) <= set(records), "an actor process wrote no trace file"
    for pid, actor in actors.items():
        recs = records[pid]
        assert "default_worker.py" in " ".join(headers[pid]["argv"])
        assert headers[pid]["ppid"] == actor["ppid"] != driver  # the raylet's child
        splits = [r for r in recs if r["k"] == "kernel.split"]
        assert [s["num_kv_splits"] for s in splits] == [actor["splits"]]
        worker = [r for r in recs if r["k"] == "ray.worker"]
        assert worker and worker[0]["node_id"] and worker[0]["job_id"]
        assert actor["user"] == "kept"  # the user's own runtime_env still applies
    return records


def test_ray_actors_of_an_existing_cluster(ray_head, tmp_path: Path) -> None:
    address, raylet, ray_tmp = ray_head
    out = tmp_path / "trace"
    done = _traced_driver(out, address, ray_tmp=ray_tmp)
    assert done.returncode == 0, done.stderr[-3000:]
    actors = _actors(done.stdout)
    assert len(actors) == 2 and sorted(a["splits"] for a in actors.values()) == [1, 65]
    assert {a["ppid"] for a in actors.values()} == {raylet}
    _check_trace(out, actors)
    report = subprocess.run([*MLATRACE, "report", str(out)], capture_output=True, text=True,
                            timeout=60)
    assert report.returncode == 0, report.stderr
    assert "3 processes" in report.stdout
    # The driver calls ray.shutdown() right after ray.get: each actor's records reached its
    # file at the end of its call (above). Ray may end the worker by SIGTERM (process.end
    # written) or by its quick exit (none): a missing process.end is explained.
    for pid in actors:
        lines = [ln for ln in report.stdout.splitlines()
                 if ln.startswith("warning: ") and f" p{pid}." in ln]
        assert all("a Ray worker" in ln for ln in lines), lines


def test_ray_init_starting_its_own_cluster(tmp_path: Path) -> None:
    """ray.init() with no address: the cluster is the driver's child; same outcome."""
    out = tmp_path / "trace"
    ray_tmp = tempfile.mkdtemp(prefix="mlray", dir="/tmp")
    try:
        done = _traced_driver(out, ray_tmp=ray_tmp)
    finally:  # ray.shutdown() ended the cluster; anything left names this temp dir
        _end_leftovers(ray_tmp)
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-3000:]
    actors = _actors(done.stdout)
    assert len(actors) == 2
    _check_trace(out, actors)
