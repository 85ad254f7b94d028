"""`mlatrace run` end to end on real process trees."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import MLATRACE, PROGS

from mlatrace.trace import open_trace


def run_traced(out: Path, *cmd: str, env: dict | None = None, opts: tuple = ()) -> int:
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run([*MLATRACE, "run", "--out", str(out), *opts, "--", *cmd],
                          env=full_env, timeout=120).returncode


def all_records(trace_dir: Path) -> dict[int, list[dict]]:
    trace = open_trace(trace_dir)
    by_pid = {proc.pid: list(proc.records()) for proc in trace.processes}
    assert not trace.problems, [str(p) for p in trace.problems]
    return by_pid


def test_tree_spawn_forkserver_fork_subprocess(tmp_path: Path) -> None:
    out = tmp_path / "trace"
    assert run_traced(out, sys.executable, str(PROGS / "tree.py")) == 0
    by_pid = all_records(out)
    run = json.loads((out / "run.json").read_text())
    headers = {pid: recs[0] for pid, recs in by_pid.items()}
    assert all(h["k"] == "process" and h["schema"] == "mlatrace/1" for h in headers.values())
    assert {h["run_id"] for h in headers.values()} == {run["run_id"]}
    assert all(recs[-1]["k"] == "process.end" for recs in by_pid.values())
    tags = {}
    for pid, recs in by_pid.items():
        for rec in recs:
            if rec["k"] == "mark" and rec["name"] == "child":
                tags[rec["attrs"]["tag"]] = pid
            if rec["k"] == "mark" and rec["name"] == "parent":
                parent = pid
    assert set(tags) == {"spawn", "forkserver", "fork", "subprocess"}
    # Lineage: spawn, fork and subprocess children are the parent's; the forkserver
    # child's parent is the forkserver process, itself a child of the parent.
    for tag in ("spawn", "fork", "subprocess"):
        assert headers[tags[tag]]["ppid"] == parent, tag
    server = headers[tags["forkserver"]]["ppid"]
    assert headers[server]["ppid"] == parent
    assert "forkserver" in " ".join(headers[server]["argv"])
    for recs in by_pid.values():
        seqs = [r["seq"] for r in recs]
        assert seqs == sorted(set(seqs))


def test_exit_code_passes_through(tmp_path: Path) -> None:
    code = run_traced(tmp_path / "t", sys.executable, "-c", "import sys; sys.exit(3)")
    assert code == 3
    run = json.loads((tmp_path / "t" / "run.json").read_text())
    assert run["exit_code"] == 3 and run["end_ns"] >= run["start_ns"]


def test_bootstrap_loads_no_analysis_stage(tmp_path: Path) -> None:
    """Every traced process pays for what the bootstrap imports: the probes and the
    recorder, not the trace reader, the model or the rules (the decision handler needs
    only mlatrace.decisions)."""
    listing = tmp_path / "modules.txt"
    code = run_traced(tmp_path / "t", sys.executable, "-c",
                      "import sys; open(sys.argv[1], 'w').write(' '.join(sys.modules))",
                      str(listing))
    assert code == 0
    loaded = set(listing.read_text().split())
    assert "mlatrace.probe.engine" in loaded and "mlatrace.record" in loaded
    heavy = {"mlatrace.analysis.builder", "mlatrace.analysis.model", "mlatrace.analysis.rules",
             "mlatrace.trace", "mlatrace.output.report"}
    assert not heavy & loaded, sorted(heavy & loaded)


def test_command_not_found(tmp_path: Path) -> None:
    assert run_traced(tmp_path / "t", "/no/such/program") == 127


def _start_sleeper(out: Path, *args: str, sigterm: str = "") -> tuple[subprocess.Popen, int]:
    launcher = subprocess.Popen([*MLATRACE, "run", "--out", str(out), "--", sys.executable,
                                 str(PROGS / "sleeper.py"), *args], stdout=subprocess.PIPE,
                                text=True, env=dict(os.environ, SLEEPER_SIGTERM=sigterm))
    child_pid = int(launcher.stdout.readline())
    time.sleep(0.6)  # a few flushes happen
    return launcher, child_pid


def test_sigkilled_child_leaves_readable_trace(tmp_path: Path) -> None:
    out = tmp_path / "t"
    launcher, child_pid = _start_sleeper(out)
    os.kill(child_pid, signal.SIGKILL)
    assert launcher.wait(timeout=30) == 128 + signal.SIGKILL
    trace = open_trace(out)
    (proc,) = trace.processes
    ticks = [r for r in proc.records() if r["k"] == "mark"]
    assert len(ticks) >= 10  # flushed while alive
    assert proc.end is None  # it never got to write one
    assert [t["attrs"]["i"] for t in ticks] == list(range(len(ticks)))


def test_sigterm_to_launcher_reaches_child(tmp_path: Path) -> None:
    out = tmp_path / "t"
    launcher, child_pid = _start_sleeper(out)
    launcher.send_signal(signal.SIGTERM)
    assert launcher.wait(timeout=30) == 128 + signal.SIGTERM
    (proc,) = open_trace(out).processes
    list(proc.records())
    assert proc.end is not None and proc.end["reason"] == "SIGTERM"
    run = json.loads((out / "run.json").read_text())
    assert run["forwarded_signals"] == ["SIGTERM"] and run["exit_code"] == 143


@pytest.mark.parametrize("mode", ["handler", "reset"])
def test_sigterm_flushes_when_the_program_handles_it(tmp_path: Path, mode: str) -> None:
    """The program's own SIGTERM handler runs after a flush; a reset to the default too."""
    out = tmp_path / "t"
    launcher, child_pid = _start_sleeper(out, sigterm=mode)
    os.kill(child_pid, signal.SIGTERM)
    code = launcher.wait(timeout=30)
    (proc,) = open_trace(out).processes
    records = list(proc.records())
    ticks = [r for r in records if r["k"] == "mark" and r["name"] == "tick"]
    assert len(ticks) >= 10 and proc.end is not None
    if mode == "handler":
        assert code == 0 and any(r.get("name") == "own_handler_ran" for r in records)
        assert proc.end["reason"] == "exit"
    else:
        assert code == 128 + signal.SIGTERM and proc.end["reason"] == "SIGTERM"


def test_existing_sitecustomize_still_runs(tmp_path: Path) -> None:
    user_site = tmp_path / "usersite"
    user_site.mkdir()
    marker = tmp_path / "marker"
    (user_site / "sitecustomize.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\n")
    code = run_traced(tmp_path / "t", sys.executable, "-c", "import mlatrace; mlatrace.mark('x')",
                      env={"PYTHONPATH": str(user_site)})
    assert code == 0
    assert marker.read_text() == "ran"
    (recs,) = all_records(tmp_path / "t").values()
    assert any(r["k"] == "mark" for r in recs)


def test_no_secret_in_trace(tmp_path: Path) -> None:
    out = tmp_path / "t"
    secret = "sk-live1234567890abcdef"
    code = run_traced(out, sys.executable, "-c", "import mlatrace; mlatrace.mark('x')",
                      "--api-key", secret, "--hf-token=hf_abcdefghijkl", "--max-num-batched-tokens",
                      "8192", env={"HF_TOKEN": "hf_envsecret123", "VLLM_API_KEY": "envkey-secret",
                                   "MY_PASSWORD": "pw-secret", "VLLM_HOST_IP": "127.0.0.1"})
    assert code == 0
    blob = "".join(p.read_text() for p in out.iterdir())
    for needle in (secret, "hf_abcdefghijkl", "hf_envsecret123", "envkey-secret", "pw-secret"):
        assert needle not in blob
    (recs,) = all_records(out).values()
    header = recs[0]
    assert "--max-num-batched-tokens" in header["argv"] and "8192" in header["argv"]
    assert header["env"]["VLLM_API_KEY"] == "***"
    assert header["env"]["VLLM_HOST_IP"] == "127.0.0.1"
    assert "HF_TOKEN" not in header["env"] and "HOME" not in header["env"]


def test_ranks_filter_keeps_only_chosen_ranks(tmp_path: Path) -> None:
    prog = "import mlatrace; mlatrace.mark('x')"
    for rank in ("0", "1"):
        assert run_traced(tmp_path / rank, sys.executable, "-c", prog, env={"RANK": rank},
                          opts=("--ranks", "0")) == 0
    (kept,) = all_records(tmp_path / "0").values()
    (filtered,) = all_records(tmp_path / "1").values()
    assert [r["k"] for r in kept] == ["process", "probe.error", "mark", "process.end"] or \
        [r["k"] for r in kept if r["k"] != "probe.error"] == ["process", "mark", "process.end"]
    assert [r["k"] for r in filtered] == ["process", "process.end"]
    assert filtered[0]["rank"] == 1


def test_refuses_to_mix_two_runs(tmp_path: Path) -> None:
    prog = ("-c", "pass")
    assert run_traced(tmp_path / "t", sys.executable, *prog) == 0
    assert run_traced(tmp_path / "t", sys.executable, *prog) == 2


def test_reexec_gets_its_own_file(tmp_path: Path) -> None:
    prog = ("import os, sys, mlatrace; mlatrace.mark('before');"
            "os.execv(sys.executable, [sys.executable, '-c', 'import mlatrace; mlatrace.mark(\"after\")'])")
    assert run_traced(tmp_path / "t", sys.executable, "-c", prog) == 0
    files = sorted(p.name for p in (tmp_path / "t").glob("p*.jsonl"))
    assert len(files) == 2 and any(name.endswith(".1.jsonl") for name in files)
    trace = open_trace(tmp_path / "t")
    marks = [r["name"] for proc in trace.processes for r in proc.records() if r["k"] == "mark"]
    assert sorted(marks) == ["after", "before"]
