"""`mlatrace bench record`: what one recorded event costs the traced program, all in.

All-in means whole-process cost: a loop of N events runs in a real subprocess, traced
(`mlatrace run`) and untraced, and again with 0 events; the cost per event is

    ((traced(N) - traced(0)) - (untraced(N) - untraced(0))) / N

so it includes the hot path, the flush thread, the encoding and the writing at exit,
and excludes interpreter start and the launcher. Two workloads: `mlatrace.mark()` and a
probed pure-Python call (`mlatrace.reference.policies.num_kv_splits`, shipped
`reference` pack, a new length each call so every call records one `kernel.split`).
Two clocks: CPU time of the whole process tree (user + system, every thread; steadier
on a shared box) and wall time. Runs alternate and the figures are medians.

The probed loop's traced runs also show whether the recorder kept up: their
`process.end` must report no drops and exact counts per kind.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mlatrace import record
from mlatrace.exitcodes import ExitCode
from mlatrace.settings import name_of

GOAL_NS = 1000
LOOP_MODULE = '''
import sys

def main(workload, calls):
    if workload == "mark":
        import mlatrace
        mark = mlatrace.mark
        for i in range(calls):
            mark("step", i=i)
    else:
        from mlatrace.reference import policies
        split = policies.num_kv_splits
        for i in range(calls):
            split("legacy", 4, 1, 16, i + 1)
'''


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_loop(workdir: Path, workload: str, calls: int, traced: bool
             ) -> tuple[float, float, Path | None]:
    """(CPU s of the process tree, wall s, trace dir) of one loop process."""
    cmd = [sys.executable, "-c", f"import bench_loop_all; bench_loop_all.main({workload!r}, "
                                 f"{calls})"]
    out = None
    if traced:
        out = workdir / f"trace-{workload}-{calls}-{time.monotonic_ns()}"
        cmd = [sys.executable, "-m", "mlatrace", "run", "--quiet", "--out", str(out), "--",
               *cmd]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(workdir), *filter(None, [os.environ.get("PYTHONPATH")])]))
    env.pop(name_of("out"), None)
    cpu0, wall0 = _children_cpu_s(), time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    return _children_cpu_s() - cpu0, time.perf_counter() - wall0, out


def process_end(trace_dir: Path) -> dict:
    """The traced loop process's `process.end` record."""
    for path in trace_dir.glob("p*.jsonl"):
        with path.open() as lines:
            last = None
            for line in lines:
                last = line
            if last:
                end = json.loads(last)
                if end.get("k") == "process.end":
                    return end
    return {}


def all_in(workload: str, calls: int, repeats: int, workdir: Path) -> dict:
    """Median all-in ns per event (CPU and wall) of one workload, and its traced ends."""
    samples: dict[tuple[bool, int], list[tuple[float, float]]] = {}
    ends = []
    for _ in range(repeats):
        for traced in (False, True):
            for n in (0, calls):
                cpu, wall, out = run_loop(workdir, workload, n, traced)
                samples.setdefault((traced, n), []).append((cpu, wall))
                if out is not None and n:
                    ends.append(process_end(out))

    def cost(index: int) -> float:
        med = {key: statistics.median(v[index] for v in values)
               for key, values in samples.items()}
        added = (med[(True, calls)] - med[(True, 0)]) - (med[(False, calls)] - med[(False, 0)])
        return added / calls * 1e9

    untraced_ns = (statistics.median(v[0] for v in samples[(False, calls)])
                   - statistics.median(v[0] for v in samples[(False, 0)])) / calls * 1e9
    return {"workload": workload, "calls": calls, "repeats": repeats,
            "cpu_ns_per_event": cost(0), "wall_ns_per_event": cost(1),
            "untraced_cpu_ns_per_call": untraced_ns, "ends": ends}


def emit_cost_ns(events: int, batches: int = 20) -> list[float]:
    """Hot-path cost of record.emit alone, in-process, one figure per batch."""
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
                time.sleep(0.05)
        finally:
            record.stop()
    return costs


def main(events: int = 500_000, repeats: int = 3, json_out: str | None = None) -> int:
    """Print the all-in cost per event of both workloads and the probed loop's drops."""
    costs = emit_cost_ns(min(events, 200_000))
    print(f"record.emit hot path alone (in-process): median {statistics.median(costs):.0f} "
          f"ns/event over {len(costs)} batches")
    results = []
    with tempfile.TemporaryDirectory(prefix="mlatrace-bench-record-") as tmp:
        workdir = Path(tmp)
        (workdir / "bench_loop_all.py").write_text(LOOP_MODULE)
        for workload in ("mark", "probed"):
            results.append(all_in(workload, events, repeats, workdir))
    print(f"all-in cost per recorded event ({events} events vs 0, traced minus untraced, "
          f"medians of {repeats} alternating runs; goal <= {GOAL_NS} ns):")
    label = {"mark": "mlatrace.mark()", "probed": "probed num_kv_splits call"}
    ok = True
    for result in results:
        ends = result["ends"]
        dropped = [end.get("dropped") for end in ends]
        kind = "mark" if result["workload"] == "mark" else "kernel.split"
        counts = [end.get("counts", {}).get(kind) for end in ends]
        exact = all(c == events for c in counts)
        ok = ok and not any(dropped) and exact
        print(f"  {label[result['workload']]:27s} CPU {result['cpu_ns_per_event']:6.0f} ns, "
              f"wall {result['wall_ns_per_event']:6.0f} ns  (untraced call "
              f"{result['untraced_cpu_ns_per_call']:.0f} ns); traced runs: dropped {dropped}, "
              f"{kind} counted {counts}{'' if exact else ' (NOT exact)'}")
    if json_out:
        Path(json_out).write_text(json.dumps({"bench": "record", "events": events,
                                              "results": results}, indent=1) + "\n")
    return ExitCode.OK if ok else ExitCode.FAILED


if __name__ == "__main__":
    sys.exit(main())
