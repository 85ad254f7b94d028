"""`mlatrace bench html`: what `report --html` costs on top of `report`, and the file's size.

The trace is `bench analyze`'s (a TP2 decode server, 8 FULL graphs per rank, GPU times
on the replays). `mlatrace report TRACE` and `mlatrace report TRACE --html FILE` run
alternately, each in a fresh interpreter (imports included), the text report going to
/dev/null; the best wall time of each is compared. Goals: at most 2 s more than
`report`, and a page of at most 3 MB.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mlatrace.bench.analyze_bench import RANKS, write_trace
from mlatrace.exitcodes import ExitCode

GOAL_EXTRA_S = 2.0
GOAL_BYTES = 3_000_000


def _timed(args: list[str]) -> tuple[float, float]:
    """(wall s, CPU s of the command and its workers) of one `mlatrace` run."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "mlatrace", *args], stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, env=env, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"mlatrace {' '.join(args)} failed ({proc.returncode}): "
                           f"{proc.stderr[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main(events: int = 1_000_000, repeat: int = 3) -> int:
    """Generate, time both commands alternately (best of `repeat`), print; exit 0 when
    both goals are met, 1 otherwise."""
    with tempfile.TemporaryDirectory(prefix="mlatrace-bench-html-") as tmp:
        trace, page = Path(tmp) / "trace", Path(tmp) / "report.html"
        written = write_trace(trace, events)
        size_mb = sum(p.stat().st_size for p in trace.iterdir()) / 1e6
        plain, html = [], []
        for _ in range(repeat):
            plain.append(_timed(["report", str(trace)]))
            html.append(_timed(["report", str(trace), "--html", str(page)]))
        size = page.stat().st_size
    best_plain, best_html = min(plain), min(html)
    extra = best_html[0] - best_plain[0]
    ok = extra <= GOAL_EXTRA_S and size <= GOAL_BYTES
    print(f"trace: {written} events, {RANKS} processes, {size_mb:.0f} MB")
    print(f"report, best of {repeat}: {best_plain[0]:.2f} s wall, {best_plain[1]:.2f} s CPU "
          f"(runs: {', '.join(f'{w:.2f}' for w, _ in plain)})")
    print(f"report --html, best of {repeat}: {best_html[0]:.2f} s wall, {best_html[1]:.2f} s "
          f"CPU (runs: {', '.join(f'{w:.2f}' for w, _ in html)})")
    print(f"--html adds {extra:+.2f} s wall (goal <= {GOAL_EXTRA_S:.0f} s), "
          f"{best_html[1] - best_plain[1]:+.2f} s CPU; the page is {size / 1e6:.2f} MB "
          f"(goal <= {GOAL_BYTES / 1e6:.1f} MB)")
    print("OK: both goals met" if ok else "NOT MET")
    return ExitCode.OK if ok else ExitCode.FAILED
