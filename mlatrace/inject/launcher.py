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
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Protocol

import mlatrace
from mlatrace.exitcodes import SIGNALLED, ExitCode, MlatraceError, require_extra
from mlatrace.record import parse_replay_timing, parse_step_aside
from mlatrace.record.redact import allowed_env, redact_argv
from mlatrace.settings import RUN_OPTIONS, Settings, run_env


class RunView(Protocol):
    """What `run --watch` shows while CMD runs (`mlatrace.output.watch.run_view.RunView`): the
    launcher sends CMD's output to `log_name` in the trace dir and calls `follow` until
    CMD exited, then `finish` with its exit code."""

    log_name: str

    def follow(self, out_dir: Path, done: Callable[[], bool]) -> None: ...

    def finish(self, out_dir: Path, exit_code: int) -> None: ...


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


def check_ranks(ranks: str) -> frozenset[int] | None:
    """`run --ranks` as Settings.ranks ("0, 1" -> {0, 1}; "" -> None, all); MlatraceError
    when bad. This and the other `check_*` are the types of `run`'s options (cli.py)."""
    values = [r.strip() for r in ranks.split(",") if r.strip()]
    if not all(v.isdigit() for v in values):
        raise MlatraceError(f"mlatrace run: --ranks wants comma-separated integers, got "
                            f"{ranks!r}")
    return frozenset(int(v) for v in values) or None


def check_replay_timing(replay_timing: str) -> tuple[int, int] | None:
    """`run --replay-timing N:M` as Settings.replay_timing ("off": None)."""
    parsed = parse_replay_timing(replay_timing)
    if replay_timing != "off" and parsed is None:
        raise MlatraceError("mlatrace run: --replay-timing wants N:M (first N replays per "
                            "graph, then 1 in M; M >= 1) or off, got "
                            f"{replay_timing!r}")
    return parsed


def check_step_aside(step_aside: str) -> tuple[int, int] | None:
    """`run --step-aside SETTLE,VERIFY` as Settings.step_aside ("0" or "off": None)."""
    parsed = parse_step_aside(step_aside)
    if step_aside not in ("0", "off") and parsed is None:
        raise MlatraceError("mlatrace run: --step-aside wants SETTLE,VERIFY (steady steps "
                            "before a probe steps aside, SETTLE >= 1; a whole step looked at "
                            f"every VERIFY-th, VERIFY >= 2) or 0, got {step_aside!r}")
    return parsed


def check_run_id(run_id: str) -> str:
    if not RUN_ID.fullmatch(run_id):
        raise MlatraceError("mlatrace run: --run-id wants 1-64 letters, digits, '.', '_' or "
                            f"'-', got {run_id!r}")
    return run_id


def _unknown_packs(names: list[str], probes: list[str]) -> str | None:
    """Why a --no-pack name names no pack that would be installed (None: all known)."""
    if not names:
        return None
    import difflib

    from mlatrace.probe.packs import discover, pack_name

    known = sorted({n for path in discover(probes)[0] if (n := pack_name(path))})
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            return (f"--no-pack {name}: no such pack ({hint}packs: {', '.join(known)}; "
                    "`mlatrace probes list` shows them)")
    return None


def pack_problems(probes: list[str]) -> list[str]:
    """One line per --probes pack that will not install in the traced processes (it does
    not load, a handler does not import, or its `versions` exclude the installed library):
    said at start-up, not only by `report` and `check` once the run is over."""
    from mlatrace.probe.packs import load_pack, version_problem

    lines = []
    for path in probes:
        try:
            pack = load_pack(path)
        except Exception as exc:  # PackError ('file:line: reason') or anything unforeseen
            why = str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
            lines.append(f"--probes {path} does not load: {why}")
            continue
        why = version_problem(pack) or next(
            (p.handler_error for p in pack.probes if getattr(p, "handler_error", None)), None)
        if why:
            lines.append(f"--probes {path} ({pack.name}) will not install: {why}")
    return lines


def _unusable_out_dir(out_dir: Path) -> str | None:
    """Create OUT and prove it takes files; None when usable, else why not (one line)."""
    if out_dir.exists() and not out_dir.is_dir():
        return "it is a file, not a directory"
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / f".mlatrace-write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def _claim(path: Path, info: dict) -> bool:
    """Create run.json, the claim of its directory for one run: atomically (O_EXCL), so of
    two launchers started into one --out at the same moment exactly one gets it."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(info, indent=2) + "\n")
    return True


def _write_run_json(path: Path, info: dict) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(info, indent=2) + "\n")
    tmp.replace(path)


def _wait_for_stragglers(pgid: int, timeout_s: float = STRAGGLER_WAIT_S) -> list[int]:
    """Give processes CMD left in its group (a forkserver, a resource tracker) time to flush;
    return the pids still in the group after `timeout_s` (they outlive the run: their files
    may still grow and get their process.end later)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return []
        time.sleep(0.02)
    return _group_members(pgid)


def _group_members(pgid: int) -> list[int]:
    """The live (not zombie) pids of process group `pgid`, from /proc; [] where there is none."""
    members = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses.
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 2 and fields[0] != "Z" and fields[2] == str(pgid):
            members.append(int(name))
    return sorted(members)


def run(cmd: list[str], settings: Settings | None = None, *, out: str | None = None,
        view: RunView | None = None, quiet: bool = False) -> int:
    """Run `cmd` traced; return its exit code (127 if not found, 126 if not executable);
    a usage error raises MlatraceError (exit 2). `settings`: `run`'s options (RUN_OPTIONS,
    checked by `check_*`, the types of the CLI's options) and `run_id`, or nothing.

    With a `view` (`run --watch`: the CLI passes `output.watch.run_view.RunView`), CMD's
    output goes to `view.log_name` in the trace dir, `view.follow` shows the trace until CMD
    exits, and `view.finish` closes it once run.json is written.
    `settings.run_id`: join a run traced on several hosts (each host's launcher given the
    same id).
    `quiet`: no closing lines (where the trace is), for scripts that run many commands.
    """
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise MlatraceError("mlatrace run: no command given (usage: mlatrace run [opts] -- "
                            "CMD...)")
    if out is not None and not out.strip():
        raise MlatraceError("mlatrace run: --out is empty; give a directory")
    settings = settings or Settings()
    if settings.otlp:   # checked here, not once per traced process
        require_extra("otlp", "mlatrace run --otlp")
    run_id = settings.run_id
    unknown = _unknown_packs(list(settings.disable_packs), list(settings.probes))
    if unknown:
        raise MlatraceError(f"mlatrace run: {unknown}")
    out_dir = (Path(out) if out else default_out_dir(run_id)).resolve()
    if out_dir.exists() and any(out_dir.glob("p*.jsonl")):
        raise MlatraceError(f"mlatrace run: {out_dir} already holds a trace; choose another "
                            "--out")
    problem = _unusable_out_dir(out_dir)
    if problem:
        raise MlatraceError(f"mlatrace run: cannot write the trace to {out_dir}: {problem}")
    fixed_dir = bool(out) or run_id is not None  # else a default name, free to move on
    run_id = run_id or uuid.uuid4().hex[:12]
    settings = replace(settings, run_id=run_id, host=socket.gethostname(),
                       launcher_pid=str(os.getpid()),
                       home=str(Path(mlatrace.__file__).resolve().parent.parent))
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
        "options": settings.options(RUN_OPTIONS),
    }
    for line in pack_problems(list(settings.probes)):
        print(f"mlatrace run: {line}; the command runs without it (report and check "
              "will say BLIND)", file=sys.stderr)
    if settings.max_mb == 0:
        kept = ("captures, syncs, eager breaks, marks, errors and process.end (no folding: "
                "no replay, metadata or call record)" if settings.fold == 0 else
                "captures, syncs, eager breaks, marks, errors, folds, the steps folding "
                "writes in full and process.end")
        print(f"mlatrace run: --max-mb 0: every process file keeps only {kept} from the start",
              file=sys.stderr)
    run_json = out_dir / "run.json"
    while not fixed_dir and not _claim(run_json, info):
        out_dir = default_out_dir().resolve()  # the same second as another run: the next name
        if _unusable_out_dir(out_dir) is None:
            run_json = out_dir / "run.json"
    if fixed_dir and not _claim(run_json, info):
        raise MlatraceError(f"mlatrace run: {out_dir} already holds a run (its run.json: "
                            "another `mlatrace run` writes there, or wrote there before); "
                            "choose another --out")
    env = run_env(replace(settings, out=str(out_dir)), os.environ)
    output = None if view is None else (out_dir / view.log_name).open("ab")
    try:
        if output is None:
            child = subprocess.Popen(cmd, env=env, start_new_session=True)
        else:
            with output:
                child = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=output,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    except OSError as exc:
        # as a shell says it: 127 not found, 126 found but not executable
        code = ExitCode.NOT_EXECUTABLE if isinstance(exc, PermissionError) \
            else ExitCode.NOT_FOUND
        why = (f"{exc.strerror or exc} (not executable: chmod +x, or run it through its "
               "interpreter)" if code is ExitCode.NOT_EXECUTABLE else exc.strerror or str(exc))
        print(f"mlatrace run: cannot start {cmd[0]!r}: {why}", file=sys.stderr)
        info.update(end_ns=time.time_ns(), exit_code=code, error=str(exc))
        _write_run_json(run_json, info)
        return code

    received: list[int] = []

    def forward(signum: int, frame: object) -> None:
        received.append(signum)
        try:
            os.killpg(child.pid, signum)
        except ProcessLookupError:
            pass

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED_SIGNALS}
    try:
        if view is not None:
            view.follow(out_dir, lambda: child.poll() is not None)
        returncode = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    outlived = _wait_for_stragglers(child.pid)
    exit_code = returncode if returncode >= 0 else SIGNALLED - returncode
    files = sorted(out_dir.glob("p*.jsonl"))
    info.update(end_ns=time.time_ns(), exit_code=exit_code,
                signal=-returncode if returncode < 0 else None,
                forwarded_signals=[signal.Signals(s).name for s in received],
                process_files=len(files))
    if outlived:
        info["outlived"] = outlived
    _write_run_json(run_json, info)
    if view is not None:
        view.finish(out_dir, exit_code)
    if returncode < 0:
        ended = f"{cmd[0]} died of {signal.Signals(-returncode).name} (exit code {exit_code})"
    else:
        ended = f"{cmd[0]} exited with code {exit_code}"
    if quiet:
        return exit_code
    if files:
        what = f"trace of {len(files)} {'process' if len(files) == 1 else 'processes'} in"
        print(_closing_lines(f"mlatrace: {ended}; {what}", str(out_dir)), file=sys.stderr)
    else:
        print(f"mlatrace: {ended}; no Python process ran under it: nothing was traced "
              f"(run.json in {out_dir})", file=sys.stderr)
    return exit_code



def _closing_lines(ended: str, out_dir: str) -> str:
    """Where the trace is and the command to read it, fitted to the terminal: a path that
    does not fit after its words goes on a line of its own (a terminal breaks a long line
    anywhere, inside the path too), the command kept copyable (a shell continuation)."""
    import shutil

    width = shutil.get_terminal_size((160, 24)).columns
    first = (f"{ended} {out_dir}" if len(ended) + 1 + len(out_dir) <= width
             else f"{ended}\n  {out_dir}")
    command = f"mlatrace report {out_dir}"
    head = "mlatrace: look at it with:"
    second = (f"{head} {command}" if len(head) + 1 + len(command) <= width
              else f"{head}\n  {command}" if 2 + len(command) <= width
              else f"{head} mlatrace report \\\n  {out_dir}")
    return f"{first}\n{second}"
