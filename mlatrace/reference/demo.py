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
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from mlatrace.exitcodes import ExitCode, MlatraceError

SERVE_ARGS = ("--ctx", "2048", "--steps", "8", "--batch", "2", "--heads", "16",
              "--layers", "2", "--capture-len", "1", "--check")
"""Small enough to finish in seconds on a 2-core CPU, long enough for MLT001 (>= 8 x 64)."""

EXPECTED_ERRORS = {"legacy": {"MLT001"}, "bucketed": {"MLT001"}, "device": set()}
"""Error findings each policy must produce when captured once as a FULL graph at length 1."""


def serve_command(policy: str, device: str, graph: str = "full") -> list[str]:
    return [sys.executable, "-m", "mlatrace.reference.serve", "--policy", policy,
            "--device", device, "--graph", graph, *SERVE_ARGS]


def main(policy: str = "legacy", out: str | None = None, device: str = "auto",
         graph: str = "full") -> int:
    """Trace the serve program with `policy`, print its report; see the module docstring."""
    missing = missing_reference_deps()
    if missing:
        raise MlatraceError(f"mlatrace demo: needs {missing}, which this Python "
                            f"({sys.executable}) cannot import: install the reference extra, "
                            "pip install 'mlatrace[reference]'")
    out_dir = Path(out) if out else Path(tempfile.mkdtemp(prefix=f"mlatrace-demo-{policy}-"))
    serve = serve_command(policy, device, graph)
    shown = " ".join(["python", *serve[1:]])
    print(f"$ mlatrace run --out {out_dir} -- {shown}", flush=True)
    run = subprocess.run([sys.executable, "-m", "mlatrace", "run", "--out", str(out_dir),
                          "--", *serve])
    if run.returncode != 0:
        raise MlatraceError(f"demo: the traced run failed with exit code {run.returncode}; "
                            f"trace: {out_dir}")
    print(flush=True)
    print(f"$ mlatrace report {out_dir}", flush=True)
    error_ids = show_report(out_dir)
    if error_ids is None:
        return 0
    expected = EXPECTED_ERRORS.get(policy, set()) if graph == "full" else set()
    ok = expected <= error_ids if expected else not error_ids
    verdict = ", ".join(sorted(error_ids)) or "no errors"
    want = ", ".join(sorted(expected)) or "no errors"
    print(f"\ndemo: policy {policy} ({graph} graph) -> {verdict}; expected {want}: "
          f"{'as expected' if ok else 'NOT as expected'}")
    return ExitCode.OK if ok else ExitCode.FAILED


def missing_reference_deps() -> str | None:
    """The reference program's first dependency this interpreter cannot import, if any."""
    try:
        import torch  # noqa: F401  (the traced child imports it the same way)
    except ImportError:
        return "torch"
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
