"""One run traced on several hosts: host directories sharing a run_id read as
one run by report, check and diff; `merge` writes one directory that reads the same;
a world size with a rank that no host traced is named by the report (coverage: blind).

The hosts are real: each `mlatrace run` runs in its own UTS and pid namespaces
(`unshare -upf`, root only), as in containers: its own host name, and pids that start
at 1 on every host, so they clash across hosts as they do in pods. Without unshare the
directories still differ and share the run id, on this machine's name and pids.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import MLATRACE

SERVE = ["-m", "mlatrace.reference.serve", "--device", "cpu", "--steps", "3", "--ctx", "4096",
         "--layers", "2", "--graph", "full"]


UNSHARE_ARGV = ["unshare", "-u", "-p", "-f", "--mount-proc"]


def _unshare_works() -> bool:
    try:
        return subprocess.run([*UNSHARE_ARGV, "sh", "-c", "hostname mlt-probe-host"],
                              capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


UNSHARE = _unshare_works()


def run_on_host(host: str, out: Path, run_id: str, cmd: list[str], env: dict) -> str:
    """`mlatrace run --run-id` as host `host`; returns the host name the headers carry."""
    traced = [*MLATRACE, "run", "--run-id", run_id, "--out", str(out), "--", *cmd]
    if UNSHARE:
        traced = [*UNSHARE_ARGV, "sh", "-c", f'hostname {host} && exec "$@"', "sh", *traced]
    done = subprocess.run(traced, env=dict(os.environ, **env), capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    return host if UNSHARE else socket.gethostname()


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*MLATRACE, *map(str, args)], capture_output=True, text=True,
                          timeout=120)


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory) -> tuple[Path, list[str]]:
    """Rank 0 on host mlt-node-a, rank 1 on mlt-node-b: the legacy policy (MLT001 on each)."""
    root = tmp_path_factory.mktemp("run")
    hosts = []
    for rank, host in enumerate(("mlt-node-a", "mlt-node-b")):
        hosts.append(run_on_host(host, root / host, "run-two-hosts",
                                 [sys.executable, *SERVE, "--policy", "legacy"],
                                 {"RANK": str(rank), "WORLD_SIZE": "2"}))
    return root, hosts


def report_json(*paths: Path) -> dict:
    done = cli("report", "--json", *paths)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_host_dirs_of_one_run_read_as_one(two_hosts) -> None:
    root, hosts = two_hosts
    a, b = root / "mlt-node-a", root / "mlt-node-b"
    single = report_json(a)
    assert {p["rank"] for p in single["processes"]} == {0}
    for paths in ((root,), (a, b)):  # the parent, or the directories named one by one
        data = report_json(*paths)
        ranks = {p["rank"] for p in data["processes"]}
        assert ranks == {0, 1}
        assert {f["id"] for f in data["findings"]} == {"MLT001"}
        assert {f["rank"] for f in data["findings"]} == {0, 1}
        assert data["summary"]["graphs"] == 2 * single["summary"]["graphs"]
        files = {p["file"] for p in data["processes"]}
        assert all(f.startswith(("mlt-node-a/", "mlt-node-b/")) for f in files), files
        # lineage per host: each host's root process is its own root
        assert sum(p["root"] for p in data["processes"]) == 2
        if UNSHARE:  # pids clash across the two hosts: the second host's are aliased
            real = {p["file"].split("/")[0]: p for p in data["processes"] if p["root"]}
            assert real["mlt-node-b"]["pid"] == 10_000_000 + real["mlt-node-a"]["pid"]
            assert any("mlt-node-b has pids another host has too" in p["reason"]
                       for p in data["problems"])
    if UNSHARE:
        headers = [json.loads(f.read_text().splitlines()[0]) for f in root.glob("*/p*.jsonl")]
        assert {h["host"] for h in headers} == set(hosts) == {"mlt-node-a", "mlt-node-b"}
        assert {h["run_id"] for h in headers} == {"run-two-hosts"}
        pids = {h["host"]: h["pid"] for h in headers if h["ppid"] == 1}  # the launcher is pid 1
        assert pids["mlt-node-a"] == pids["mlt-node-b"]

    check = cli("check", root)
    assert check.returncode == 1
    assert {line.split()[0] for line in check.stdout.splitlines()
            if line.startswith("MLT")} == {"MLT001"}
    assert "rank 0:" in check.stdout and "rank 1:" in check.stdout

    listed = cli("report", "--list", "--json", root)
    [run] = json.loads(listed.stdout)["runs"]
    assert run["run_id"] == "run-two-hosts" and run["hosts"] == sorted(hosts)
    assert len(run["dirs"]) == 2


def test_diff_and_merge(two_hosts, tmp_path: Path) -> None:
    root, hosts = two_hosts
    merged = tmp_path / "merged"
    done = cli("merge", root / "mlt-node-a", root / "mlt-node-b", "-o", merged)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in merged.iterdir()) == sorted([*set(hosts), "merge.json"]) \
        or not UNSHARE
    before, after = report_json(root), report_json(merged)
    for key in ("summary", "findings", "graphs"):
        assert after[key] == before[key], key
    assert [(p["pid"], p["rank"]) for p in after["processes"]] == \
        [(p["pid"], p["rank"]) for p in before["processes"]]

    diff = cli("diff", "--json", root, merged)
    assert diff.returncode == 0, diff.stderr
    data = json.loads(diff.stdout)
    assert data["summary"]["changed"] == 0 and data["summary"]["only_a"] == 0
    assert data["summary"]["matched"] == before["summary"]["graphs"]
    assert {g["rank"] for g in data["graphs"]} == {0, 1}
    one_host = json.loads(cli("diff", "--json", root / "mlt-node-a", merged).stdout)
    assert {g["rank"] for g in one_host["graphs"] if g["status"] == "only_b"} == {1}

    again = cli("merge", root, "-o", merged)  # never over an archive
    assert again.returncode == 2 and "not an empty directory" in again.stderr


def test_parent_of_several_runs_opens_the_newest(two_hosts, tmp_path: Path) -> None:
    root, _hosts = two_hosts
    later = tmp_path / "later"
    run_on_host("mlt-node-c", later, "run-later",
                [sys.executable, "-c", "from mlatrace.reference import policies; "
                 "policies.num_kv_splits('legacy', 1, 1, 16, 1)"], {})
    parent = tmp_path / "all"
    parent.mkdir()
    (parent / "first").symlink_to(root, target_is_directory=True)
    (parent / "second").symlink_to(later, target_is_directory=True)
    done = cli("report", parent)
    assert done.returncode == 0, done.stderr
    assert "holds 2 runs: opened the newest, run run-later" in " ".join(done.stderr.split())
    chosen = cli("report", "--json", "--run", "run-two-hosts", parent)
    assert {p["rank"] for p in json.loads(chosen.stdout)["processes"]} == {0, 1}
    listed = cli("report", "--list", parent)
    assert "run-two-hosts" in listed.stdout and "run-later" in listed.stdout
    empty = tmp_path / "empty"
    empty.mkdir()
    nothing = cli("report", empty)
    assert nothing.returncode == 2 and "no trace here" in nothing.stderr


MISSING_RANK_PROG = ("from mlatrace.reference import policies; "
                     "policies.num_kv_splits('legacy', 1, 1, 16, 4096)")


@pytest.fixture(scope="module")
def three_of_four(tmp_path_factory) -> Path:
    """World size 4, ranks 0, 1 and 3 traced on three hosts: rank 2 was never traced."""
    root = tmp_path_factory.mktemp("ranks")
    for rank in (0, 1, 3):
        run_on_host(f"mlt-rank-{rank}", root / f"node{rank}", "run-three-of-four",
                    [sys.executable, "-c", MISSING_RANK_PROG],
                    {"RANK": str(rank), "WORLD_SIZE": "4"})
    return root


def test_missing_rank_is_named(three_of_four: Path) -> None:
    done = cli("report", three_of_four)
    assert done.returncode == 0, done.stderr
    line = " ".join(done.stdout.split())
    assert "ranks: world size 4, seen 0, 1, 3; missing: 2" in line  # pooled over the hosts
    assert "blind: rank(s) 2 of world size 4 missing (ranks seen: 0, 1, 3)" in line
    ranks = report_json(three_of_four)["coverage"]["ranks"]
    assert ranks["world_size"] == 4 and ranks["seen"] == [0, 1, 3] and ranks["missing"] == [2]
    one_host = report_json(three_of_four / "node0")["coverage"]["ranks"]
    assert one_host["seen"] == [0] and one_host["missing"] == [1, 2, 3]


def test_missing_rank_makes_check_blind(three_of_four: Path) -> None:
    done = cli("check", three_of_four)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "rank(s) 2 of world size 4 missing" in " ".join(done.stdout.split())


def test_perfetto_of_two_hosts_says_the_clocks_are_not_shared(two_hosts, tmp_path: Path) -> None:
    root, hosts = two_hosts
    out = tmp_path / "timeline.json"
    done = cli("export", root, "--perfetto", out)
    assert done.returncode == 0, done.stderr
    doc = json.loads(out.read_text())
    assert doc["otherData"]["hosts"] == sorted(set(hosts))
    names = [e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "process_name"]
    assert {e["args"]["name"].split(" · ")[0] for e in doc["traceEvents"]
            if e.get("name") == "process_name"} >= ({"mlt-node-a", "mlt-node-b"} if UNSHARE
                                                     else set()), names
    if UNSHARE:
        assert "not align" in doc["otherData"]["clock"]
    assert len({e["pid"] for e in doc["traceEvents"] if e.get("name") == "process_name"}) == \
        len(names)  # one track per process, even where two hosts share a pid


REMOTE_CHILD = """
import subprocess, sys
from mlatrace.reference import policies
policies.num_kv_splits('legacy', 1, 1, 16, 1)
# a process of this run starting on another host (as a Ray worker would): same environment
code = "from mlatrace.reference import policies; policies.num_kv_splits('legacy', 1, 1, 16, 9000)"
subprocess.run([*sys.argv[1:], 'sh', '-c', 'hostname mlt-remote && exec "$@"', 'sh',
                sys.executable, '-c', code], check=True)
"""


@pytest.mark.skipif(not UNSHARE, reason="needs unshare (root) for a second host name")
def test_process_on_another_host_writes_under_its_host(tmp_path: Path) -> None:
    out = tmp_path / "trace"
    done = subprocess.run([*MLATRACE, "run", "--out", str(out), "--", sys.executable, "-c",
                           REMOTE_CHILD, *UNSHARE_ARGV], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    [remote] = list((out / "mlt-remote").glob("p*.jsonl"))
    header = json.loads(remote.read_text().splitlines()[0])
    run = json.loads((out / "run.json").read_text())
    assert header["host"] == "mlt-remote" and header["run_id"] == run["run_id"]
    data = report_json(out)  # the launcher's directory and the host's below it: one run
    assert sorted(p["file"] for p in data["processes"] if "mlt-remote/" in p["file"]) == \
        [f"mlt-remote/{remote.name}"]
    assert len(data["processes"]) == 2
