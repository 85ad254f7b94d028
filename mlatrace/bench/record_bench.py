"""`mlatrace bench record`: what recording costs the traced program.

Two figures, both medians over repeated runs on this machine:
1. the recorder's cost per event (`record.emit` on the hot path, in-process);
2. the traced/untraced time ratio of a tight loop calling a probed function,
   each in a real subprocess (traced = `mlatrace run --probes <pack>`), so the
   figure includes injection, the probe engine's wrapper and the flush thread.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mlatrace import record

LOOP_MODULE = '''
import json, sys, time

def probed(x, y):
    return x + y

def main(calls):
    probed(0, 0)
    start = time.perf_counter_ns()
    for i in range(calls):
        probed(i, 1)
    elapsed = time.perf_counter_ns() - start
    print(json.dumps({"ns_per_call": elapsed / calls}))
'''

LOOP_PACK = '''
[pack]
name = "bench_loop"
library = "bench_loop"
checked = ["mlatrace bench record"]

[[probe]]
name = "probed"
targets = ["bench_loop:probed"]
params = ["x", "y"]
kind = "attn.call"
when = "call"
[probe.fields]
op = "'bench'"
hints.x = "args.x"
'''


def emit_cost_ns(events: int, batches: int = 20) -> list[float]:
    """Per-event cost of record.emit, one figure per batch of events/batches emits."""
    per_batch = max(1, events // batches)
    costs = []
    with tempfile.TemporaryDirectory() as tmp:
        record.start(tmp)
        try:
            for _ in range(batches):
                start = time.perf_counter_ns()
                for i in range(per_batch):
                    record.emit("kernel.launch", name="k", grid=(i, 1, 1), capturing=False,
                                gid=None)
                costs.append((time.perf_counter_ns() - start) / per_batch)
                time.sleep(0.25)  # let the flush thread drain, as a real program's gaps do
            dropped = record.current().dropped
        finally:
            record.stop()
    if dropped:
        print(f"note: {dropped} events dropped (queue bound reached)")
    return costs


def _loop_ns_per_call(workdir: Path, calls: int, traced: bool) -> float:
    # Imported (not run as __main__) so that the pack's target `bench_loop:probed` exists.
    cmd = [sys.executable, "-c", f"import bench_loop; bench_loop.main({calls})"]
    if traced:
        out = workdir / f"trace-{time.monotonic_ns()}"
        cmd = [sys.executable, "-m", "mlatrace", "run", "--out", str(out),
               "--probes", str(workdir / "bench_loop.toml"), "--", *cmd]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(workdir), *filter(None, [os.environ.get("PYTHONPATH")])]))
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])["ns_per_call"]


def loop_ratio(calls: int, repeats: int = 5) -> tuple[float, float, int]:
    """Median ns per call untraced and traced, alternating runs; and events recorded."""
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        (workdir / "bench_loop.py").write_text(LOOP_MODULE)
        (workdir / "bench_loop.toml").write_text(LOOP_PACK)
        plain, traced = [], []
        for _ in range(repeats):
            plain.append(_loop_ns_per_call(workdir, calls, traced=False))
            traced.append(_loop_ns_per_call(workdir, calls, traced=True))
        from mlatrace.trace import open_trace

        events = 0
        for trace_dir in workdir.glob("trace-*"):
            for proc in open_trace(trace_dir).processes:
                events += sum(1 for r in proc.records() if r["k"] == "attn.call")
        return statistics.median(plain), statistics.median(traced), events // repeats


def main(events: int = 200_000) -> int:
    """Print the recorder's per-event cost and the probed-loop ratio."""
    costs = emit_cost_ns(events)
    print(f"record.emit: median {statistics.median(costs):.0f} ns/event "
          f"(min {min(costs):.0f}, max {max(costs):.0f}; {len(costs)} batches of "
          f"{events // len(costs)} events; goal <= 1000 ns)")
    calls = max(10_000, events // 2)
    plain, traced, recorded = loop_ratio(calls)
    print(f"probed tight loop ({calls} calls, 5 alternating runs, medians): "
          f"untraced {plain:.0f} ns/call, traced {traced:.0f} ns/call, "
          f"added {traced - plain:.0f} ns/call, ratio {traced / plain:.2f}x "
          f"({recorded} attn.call records per traced run)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
