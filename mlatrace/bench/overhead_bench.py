"""`mlatrace bench overhead`: decode step time under graph replay, traced vs untraced.

Runs the reference serve program (`--bench`) several times, alternating an untraced run
with one under `mlatrace run`, so both see the same machine state. Each run captures its
graph, then times `steps` replayed decode steps; on CUDA each step is timed with CUDA
events read after the loop, and `torch.cuda.set_sync_debug_mode("error")` is on while
the steps run (`--sync-debug`), so a probe that synchronised would fail the run.
Reports the median over runs of each run's median step time, and the traced/untraced
ratio (goal <= 1.01). Runs on CPU too (host graph), clearly marked; there the numbers
are only indicative.

Exit codes: 0 ok (goal met, or CPU), 1 the CUDA ratio missed the goal, 2 a run failed.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

GOAL_RATIO = 1.01
ROUNDS = 3

CUDA_SERVE_ARGS = ("--device", "cuda", "--policy", "device", "--graph", "full", "--ctx", "16384",
                   "--batch", "4", "--heads", "16", "--layers", "8", "--hidden", "1024",
                   "--warmup", "20", "--sync-debug")
CPU_SERVE_ARGS = ("--device", "cpu", "--policy", "legacy", "--graph", "full", "--ctx", "512",
                  "--batch", "2", "--heads", "16", "--layers", "2", "--warmup", "3")
CPU_MAX_STEPS = 40


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def serve_bench_command(serve_args: tuple[str, ...], steps: int) -> list[str]:
    return [sys.executable, "-m", "mlatrace.reference.serve", *serve_args, "--bench",
            "--steps", str(steps)]


def run_once(command: list[str], trace_dir: Path | None) -> dict:
    """One serve run (traced under `mlatrace run` when trace_dir is given); its JSON line."""
    if trace_dir is not None:
        command = [sys.executable, "-m", "mlatrace", "run", "--out", str(trace_dir), "--",
                   *command]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {result.returncode}:\n"
                           f"{result.stdout[-2000:]}\n{result.stderr[-4000:]}")
    for line in reversed(result.stdout.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"no JSON line in the output of {' '.join(command)}:\n{result.stdout}")


def count_records(trace_dir: Path) -> dict[str, int]:
    """Records by kind in a trace directory: proof that the traced runs were traced."""
    counts: dict[str, int] = {}
    for path in trace_dir.glob("p*.jsonl"):
        with path.open() as lines:
            for line in lines:
                try:
                    kind = json.loads(line).get("k", "?")
                except (json.JSONDecodeError, AttributeError):
                    kind = "<malformed>"
                counts[kind] = counts.get(kind, 0) + 1
    return counts


def main(steps: int = 200) -> int:
    on_cuda = cuda_available()
    serve_args = CUDA_SERVE_ARGS if on_cuda else CPU_SERVE_ARGS
    if not on_cuda:
        steps = min(steps, CPU_MAX_STEPS)
    command = serve_bench_command(serve_args, steps)
    untraced: list[dict] = []
    traced: list[dict] = []
    records: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="mlatrace-bench-overhead-") as tmp:
        try:
            for round_index in range(ROUNDS):
                untraced.append(run_once(command, None))
                trace_dir = Path(tmp) / f"traced-{round_index}"
                traced.append(run_once(command, trace_dir))
                for kind, n in count_records(trace_dir).items():
                    records[kind] = records.get(kind, 0) + n
        except RuntimeError as error:
            print(f"bench overhead: a run failed: {error}", file=sys.stderr)
            return 2

    first = untraced[0]
    device_label = (f"CUDA ({first['device_name']})" if on_cuda
                    else "CPU (host graph; indicative only, no CUDA here)")
    step_label = "GPU time per step (CUDA events)" if on_cuda else "host time per step"
    print(f"mlatrace bench overhead: device {device_label}")
    print(f"serve: policy {first['policy']}, graph {first['graph']}, batch {first['batch']}, "
          f"heads {first['heads']}, layers {first['layers']}, ctx {first['ctx']}, "
          f"{steps} timed steps x {ROUNDS} rounds each, alternating untraced/traced; "
          f"sync debug mode 'error': {'on' if first['sync_debug'] else 'off'}")
    rows = {}
    for label, runs in (("untraced", untraced), ("traced", traced)):
        rows[label] = (statistics.median(r["median_step_us"] for r in runs),
                       statistics.median(r["wall_step_us"] for r in runs))
    print(f"{'':10s} {'median step (us)':>18s} {'wall per step (us)':>20s}   per-round medians")
    for label, (median_us, wall_us) in rows.items():
        runs = untraced if label == "untraced" else traced
        per_round = ", ".join(f"{r['median_step_us']:.1f}" for r in runs)
        print(f"{label:10s} {median_us:18.1f} {wall_us:20.1f}   {per_round}")
    ratio = rows["traced"][0] / rows["untraced"][0]
    wall_ratio = rows["traced"][1] / rows["untraced"][1]
    met = ratio <= GOAL_RATIO
    print(f"ratio traced/untraced: {step_label} {ratio:.4f}, wall {wall_ratio:.4f} "
          f"(goal <= {GOAL_RATIO}: {'met' if met else 'MISSED'})")
    replays = records.get("graph.replay", 0)
    print(f"traced runs recorded {sum(records.values())} records "
          f"({replays} graph.replay, {records.get('attn.metadata', 0)} attn.metadata, "
          f"{records.get('probe.error', 0)} probe.error)")
    if not replays:
        print("warning: the traced runs recorded no graph.replay: were the probes active?")
    summary = {"bench": "overhead", "device": "cuda" if on_cuda else "cpu", "steps": steps,
               "rounds": ROUNDS, "untraced_median_step_us": rows["untraced"][0],
               "traced_median_step_us": rows["traced"][0], "ratio": ratio,
               "wall_ratio": wall_ratio, "goal": GOAL_RATIO, "records": records}
    print(json.dumps(summary))
    if on_cuda and not met:
        return 1
    return 0
