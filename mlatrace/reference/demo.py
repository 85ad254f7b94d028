"""`mlatrace demo`: trace the reference decode program and show what its capture froze.

Runs `mlatrace run --out DIR -- python -m mlatrace.reference.serve ...` (capture at the
dummy length 1, then decode at ~2K tokens), then prints the report of the trace.
With the legacy (or bucketed) policy the FULL graph froze one KV split and the report
shows MLT001 frozen-one-split; with the device policy it is clean.

Exit codes: 0 the run worked and the report shows what the policy should produce,
1 it does not (a regression of the probes or the rules), 2 the traced run failed or
torch is not installed (`pip install 'mlatrace[reference]'`).
"""

from __future__ import annotations

import collections
import contextlib
import importlib.util
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TextIO

from mlatrace.exitcodes import ExitCode, MlatraceError

SERVE_ARGS = ("--ctx", "2048", "--steps", "8", "--batch", "2", "--heads", "16",
              "--layers", "2", "--capture-len", "1", "--check")
"""Small enough to finish in seconds on a 2-core CPU, long enough for MLT001 (>= 8 x 64)."""

EXPECTED_ERRORS = {"legacy": {"MLT001"}, "bucketed": {"MLT001"}, "device": set()}
"""Error findings each policy must produce when captured once as a FULL graph at length 1."""


def serve_command(policy: str, device: str, graph: str = "full") -> list[str]:
    return [sys.executable, "-m", "mlatrace.reference.serve", "--policy", policy,
            "--device", device, "--graph", graph, *SERVE_ARGS]


QUIET_S = 4.0
"""Longest silence while the traced program starts (Python, torch, the engine, its capture):
after it, a line says the demo is still working."""


def main(policy: str = "legacy", out: str | None = None, device: str = "auto",
         graph: str = "full") -> int:
    """Trace the serve program with `policy`, print its report; see the module docstring."""
    print(f"mlatrace demo: tracing the reference decode program (policy {policy}, {graph} "
          "graph); it starts Python, torch and the engine before its first line", flush=True)
    missing = missing_reference_deps()
    if missing:
        raise MlatraceError(f"mlatrace demo: needs {missing}, which this Python "
                            f"({sys.executable}) cannot import: install the reference extra, "
                            "pip install 'mlatrace[reference]'")
    out_dir = Path(out) if out else Path(tempfile.mkdtemp(prefix=f"mlatrace-demo-{policy}-"))
    code = None
    try:
        code = traced_demo(policy, out_dir, device, graph)
    finally:
        if out is None:
            if code in (ExitCode.OK, ExitCode.FAILED):
                shutil.rmtree(out_dir, ignore_errors=True)
                print("demo: trace removed (it was in a temporary directory; keep it with "
                      "--out DIR)", flush=True)
            else:   # the run failed or was cut short: the trace says why
                print(f"demo: trace kept in {out_dir}", flush=True)
    return code


def traced_demo(policy: str, out_dir: Path, device: str, graph: str) -> int:
    """The traced run and its report; the demo's exit code."""
    serve = serve_command(policy, device, graph)
    shown = " ".join(["python", *serve[1:]])
    print(f"$ mlatrace run --out {out_dir} -- {shown}", flush=True)
    code = relay([sys.executable, "-m", "mlatrace", "run", "--out", str(out_dir), "--", *serve])
    if code != 0:   # the trace is kept (the caller's `finally`): it says why
        raise MlatraceError(f"demo: the traced run failed with exit code {code}; "
                            f"trace: {out_dir}")
    print(flush=True)
    print(f"$ mlatrace report {out_dir}", flush=True)
    error_ids = show_report(out_dir)
    if error_ids is None:
        return ExitCode.OK
    expected = EXPECTED_ERRORS.get(policy, set()) if graph == "full" else set()
    ok = expected <= error_ids if expected else not error_ids
    verdict = ", ".join(sorted(error_ids)) or "no errors"
    want = ", ".join(sorted(expected)) or "no errors"
    print(f"\ndemo: policy {policy} ({graph} graph) -> {verdict}; expected {want}: "
          f"{'as expected' if ok else 'NOT as expected'}", flush=True)
    return ExitCode.OK if ok else ExitCode.FAILED


def relay(cmd: list[str], quiet_s: float = QUIET_S, out: TextIO | None = None) -> int:
    """Run `cmd`, passing its output (stdout and stderr) on line by line; when it says
    nothing for `quiet_s` seconds, say that it is still working. Its exit code."""
    out = out or sys.stdout
    env = dict(os.environ, PYTHONUNBUFFERED="1")   # its lines as they are printed
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1, env=env)
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    started = time.monotonic()
    serving = False
    try:
        while True:
            try:
                line = lines.get(timeout=quiet_s)
            except queue.Empty:
                what = ("decoding" if serving else
                        "the traced program starts: Python, torch, the engine, its capture")
                print(f"demo: still working ({time.monotonic() - started:.0f} s; {what})",
                      file=out, flush=True)
                continue
            if line is None:
                break
            serving = serving or line.startswith("mlatrace reference serve:")
            out.write(line)
            out.flush()
    except KeyboardInterrupt:   # the run had the same Ctrl-C: let it write its trace
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)
        raise
    return proc.wait()


def missing_reference_deps() -> str | None:
    """The reference program's first dependency this interpreter cannot import, if any
    (torch takes seconds to import: a line says so when it takes longer than QUIET_S)."""
    if importlib.util.find_spec("torch") is None:
        return "torch"
    timer = threading.Timer(QUIET_S, print, args=("demo: still working (importing torch)",),
                            kwargs={"flush": True})
    timer.daemon = True
    timer.start()
    try:
        import torch  # noqa: F401  (the traced child imports it the same way)
    except ImportError:
        return "torch"
    finally:
        timer.cancel()
    return None


def show_report(trace_dir: Path) -> set[str] | None:
    """Print the report; return the ids of error findings (None when analysis is unavailable)."""
    try:
        from mlatrace.output import report
    except ImportError:
        print_record_counts(trace_dir)
        return None
    report.main(str(trace_dir), as_json=False, verbose=False, config=None)
    try:
        from mlatrace import analysis, trace
    except ImportError:
        return None
    result = analysis.analyze(trace.open_trace(trace_dir))
    return {f.id for f in result.findings if f.severity == "error"}


def print_record_counts(trace_dir: Path) -> None:
    """Fallback before the report exists: record counts by kind per process file."""
    print(f"trace: {trace_dir} (mlatrace.output.report is not available; record counts follow)")
    for path in sorted(trace_dir.glob("p*.jsonl")):
        counts: collections.Counter[str] = collections.Counter()
        with path.open() as lines:
            for line in lines:
                try:
                    counts[json.loads(line).get("k", "?")] += 1
                except (json.JSONDecodeError, AttributeError):
                    counts["<malformed>"] += 1
        summary = ", ".join(f"{kind} {n}" for kind, n in sorted(counts.items()))
        print(f"  {path.name}: {summary}")
