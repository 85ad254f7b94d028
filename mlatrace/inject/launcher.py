"""`mlatrace run -- CMD...`: start CMD with the bootstrap on PYTHONPATH and wait for it.

The launcher itself records nothing but `run.json`; every Python process below
it records itself. CMD runs without a shell in its own process group, so
SIGINT/SIGTERM sent to the launcher reach the whole tree, and the launcher
exits with CMD's exit code (128+N when CMD died of signal N).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import mlatrace
from mlatrace.inject import BOOTSTRAP_DIR
from mlatrace.record.redact import allowed_env, redact_argv

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
STRAGGLER_WAIT_S = 5.0


RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def default_out_dir(run_id: str | None = None) -> Path:
    """./mlatrace-trace/<timestamp>, unique within the second; for a run joined on several
    hosts (--run-id), ./mlatrace-trace/<run-id>/<host>, so that copying every host's
    ./mlatrace-trace/<run-id> to one place gathers the run."""
    if run_id:
        return Path("mlatrace-trace") / run_id / socket.gethostname()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path("mlatrace-trace") / stamp
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{stamp}-{n}")
    return path


def child_env(out_dir: Path, run_id: str, *, ranks: str | None, probes: list[str],
              replay_sample: int | None, graph_nodes: bool, otlp: str | None,
              launch_sample: int | None = None,
              base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment CMD runs in: bootstrap first on PYTHONPATH plus MLATRACE_* settings."""
    env = dict(os.environ if base is None else base)
    old = env.get("PYTHONPATH", "")
    parts = [BOOTSTRAP_DIR] + [p for p in old.split(os.pathsep) if p and p != BOOTSTRAP_DIR]
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env["MLATRACE_OUT"] = str(out_dir)
    env["MLATRACE_RUN_ID"] = run_id
    env["MLATRACE_HOME"] = str(Path(mlatrace.__file__).resolve().parent.parent)
    env["MLATRACE_LAUNCHER_PID"] = str(os.getpid())
    # Processes that start on another host (a Ray worker) write under <out>/<their host>.
    env["MLATRACE_HOST"] = socket.gethostname()
    env["MLATRACE_GRAPH_NODES"] = "1" if graph_nodes else "0"
    for name, value in (("MLATRACE_RANKS", ranks),
                        ("MLATRACE_PROBES", os.pathsep.join(str(Path(p).resolve()) for p in probes)),
                        ("MLATRACE_REPLAY_SAMPLE", str(replay_sample) if replay_sample else ""),
                        ("MLATRACE_LAUNCH_SAMPLE",
                         "" if launch_sample is None else str(launch_sample)),
                        ("MLATRACE_OTLP", otlp or "")):
        if value:
            env[name] = value
        else:
            env.pop(name, None)
    return env


def _parse_ranks(ranks: str | None) -> str | None:
    if not ranks:
        return None
    values = [r.strip() for r in ranks.split(",") if r.strip()]
    if not all(v.isdigit() for v in values):
        raise ValueError(f"--ranks wants comma-separated integers, got {ranks!r}")
    return ",".join(values)


def _write_run_json(path: Path, info: dict) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(info, indent=2) + "\n")
    tmp.replace(path)


def _wait_for_stragglers(pgid: int, timeout_s: float = STRAGGLER_WAIT_S) -> None:
    """Give processes CMD left in its group (a forkserver, a resource tracker) time to flush."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.02)


def run(cmd: list[str], *, out: str | None = None, ranks: str | None = None,
        probes: list[str] | None = None, replay_sample: int | None = None,
        launch_sample: int | None = None, graph_nodes: bool = True,
        otlp: str | None = None, run_id: str | None = None) -> int:
    """Run `cmd` traced; return its exit code (2 for a usage error, 127 if not found).

    `run_id`: join a run traced on several hosts (each host's launcher given the same id).
    """
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        print("mlatrace run: no command given (usage: mlatrace run [opts] -- CMD...)",
              file=sys.stderr)
        return 2
    try:
        ranks = _parse_ranks(ranks)
    except ValueError as exc:
        print(f"mlatrace run: {exc}", file=sys.stderr)
        return 2
    if run_id is not None and not RUN_ID.fullmatch(run_id):
        print(f"mlatrace run: --run-id wants 1-64 letters, digits, '.', '_' or '-', "
              f"got {run_id!r}", file=sys.stderr)
        return 2
    out_dir = (Path(out) if out else default_out_dir(run_id)).resolve()
    if out_dir.exists() and any(out_dir.glob("p*.jsonl")):
        print(f"mlatrace run: {out_dir} already holds a trace; choose another --out",
              file=sys.stderr)
        return 2
    out_dir.mkdir(parents=True, exist_ok=True)
    run_id = run_id or uuid.uuid4().hex[:12]
    info = {
        "schema": mlatrace.SCHEMA,
        "run_id": run_id,
        "argv": redact_argv(cmd),
        "cwd": os.getcwd(),
        "start_ns": time.time_ns(),
        "end_ns": None,
        "exit_code": None,
        "signal": None,
        "launcher_pid": os.getpid(),
        "host": socket.gethostname(),
        "mlatrace": mlatrace.__version__,
        "env": allowed_env(os.environ),
        "options": {"ranks": ranks, "probes": list(probes or []), "replay_sample": replay_sample,
                    "launch_sample": launch_sample, "graph_nodes": graph_nodes, "otlp": otlp},
    }
    run_json = out_dir / "run.json"
    _write_run_json(run_json, info)
    env = child_env(out_dir, run_id, ranks=ranks, probes=list(probes or []),
                    replay_sample=replay_sample, graph_nodes=graph_nodes, otlp=otlp,
                    launch_sample=launch_sample)
    try:
        child = subprocess.Popen(cmd, env=env, start_new_session=True)
    except OSError as exc:
        print(f"mlatrace run: cannot start {cmd[0]!r}: {exc.strerror or exc}", file=sys.stderr)
        info.update(end_ns=time.time_ns(), exit_code=127, error=str(exc))
        _write_run_json(run_json, info)
        return 127

    received: list[int] = []

    def forward(signum: int, frame: object) -> None:
        received.append(signum)
        try:
            os.killpg(child.pid, signum)
        except ProcessLookupError:
            pass

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED_SIGNALS}
    try:
        returncode = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    _wait_for_stragglers(child.pid)
    exit_code = returncode if returncode >= 0 else 128 - returncode
    files = sorted(out_dir.glob("p*.jsonl"))
    info.update(end_ns=time.time_ns(), exit_code=exit_code,
                signal=-returncode if returncode < 0 else None,
                forwarded_signals=[signal.Signals(s).name for s in received],
                process_files=len(files))
    _write_run_json(run_json, info)
    if files:
        print(f"mlatrace: trace of {len(files)} process(es) in {out_dir}\n"
              f"mlatrace: look at it with: mlatrace report {out_dir}", file=sys.stderr)
    else:
        print(f"mlatrace: no Python process ran under {cmd[0]}: nothing was traced "
              f"(run.json in {out_dir})", file=sys.stderr)
    return exit_code
