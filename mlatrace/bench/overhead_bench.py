"""`mlatrace bench overhead`: decode step time, traced vs untraced, per graph mode.

    mlatrace bench overhead --graph full,breakable,none

Runs the reference serve program (`--bench`) for each graph mode of the reference
engine (`full`: one replayed graph per step, device policy; `breakable`: graph segments
with one eager MLA call per layer, bucketed policy; `none`: eager, device policy),
alternating an untraced run with one under `mlatrace run` for `rounds` rounds, so both
see the same machine state. Each run captures, then times `steps` decode steps; on CUDA
each step is timed with CUDA events read after the loop (GPU time) and by the host clock
over the whole loop (wall), with `torch.cuda.set_sync_debug_mode("error")` on while the
steps run (`--sync-debug`), so a probe that synchronised would fail the run.
Reports per mode the median over rounds of each run's median step (GPU) and wall per
step, both ratios, and the records per step of the traced runs; writes it all as JSON.
Runs on CPU too (host graph, small shapes), clearly marked: indicative only.

`--in-process` measures instead, per mode, one traced process that alternates blocks
of steps with the probes at work and without them (`mlatrace.bench.overhead_ab`): a
figure that the host's drift between runs does not move. Without them is, by
`--baseline`, every patch taken off (`unpatched`, default: traced vs untraced in one
process) or the wrappers passing every call through (`passthrough`: the probes' work
beyond bare wrappers). `--host-only` (with it) drops the device work, so the step's
Python is what remains: the probes' share on a CPU box.

Exit codes: 0 ok (goals met, or CPU, or --in-process), 1 a CUDA ratio missed its goal,
2 a run failed.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from mlatrace.common import plural
from mlatrace.exitcodes import ExitCode, MlatraceError

GOALS = {"full": 1.01, "breakable": 1.01, "none": 1.02}
POLICY = {"full": "device", "breakable": "bucketed", "none": "device"}
ROUNDS = 3

CUDA_SERVE_ARGS = ("--device", "cuda", "--ctx", "16384", "--batch", "4", "--heads", "16",
                   "--layers", "16", "--hidden", "1024", "--warmup", "20", "--sync-debug")
CPU_SERVE_ARGS = ("--device", "cpu", "--ctx", "512", "--batch", "2", "--heads", "16",
                  "--layers", "2", "--warmup", "3")
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


def trace_options(sample: int | None, step_aside: str | None) -> tuple[str, ...]:
    """The `mlatrace run` options of the traced runs (None: mlatrace's default)."""
    return (*(("--sample", str(sample)) if sample is not None else ()),
            *(("--step-aside", step_aside) if step_aside is not None else ()))


def run_once(command: list[str], trace_dir: Path | None, options: tuple[str, ...] = ()) -> dict:
    """One serve run (traced under `mlatrace run` when trace_dir is given); its JSON line."""
    if trace_dir is not None:
        command = [sys.executable, "-m", "mlatrace", "run", "--out", str(trace_dir), *options,
                   "--", *command]
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


def mode_command(mode: str, on_cuda: bool, steps: int) -> list[str]:
    """The serve command of one graph mode (policy per POLICY)."""
    base = CUDA_SERVE_ARGS if on_cuda else CPU_SERVE_ARGS
    return serve_bench_command((*base, "--graph", mode, "--policy", POLICY[mode]), steps)


def bench_mode(mode: str, on_cuda: bool, steps: int, rounds: int, options: tuple[str, ...],
               tmp: Path) -> dict:
    """Alternate untraced and traced runs of one mode; medians, ratios, records per step."""
    command = mode_command(mode, on_cuda, steps)
    untraced: list[dict] = []
    traced: list[dict] = []
    records: dict[str, int] = {}
    for round_index in range(rounds):
        untraced.append(run_once(command, None))
        trace_dir = tmp / f"{mode}-traced-{round_index}"
        traced.append(run_once(command, trace_dir, options))
        for kind, n in count_records(trace_dir).items():
            records[kind] = records.get(kind, 0) + n
    warmup = int(command[command.index("--warmup") + 1])
    row = {"graph": mode, "policy": POLICY[mode], "runs": {"untraced": untraced,
                                                           "traced": traced}}
    for label, runs in (("untraced", untraced), ("traced", traced)):
        row[f"{label}_step_us"] = statistics.median(r["median_step_us"] for r in runs)
        row[f"{label}_wall_us"] = statistics.median(r["wall_step_us"] for r in runs)
    row["ratio"] = row["traced_step_us"] / row["untraced_step_us"]
    row["wall_ratio"] = row["traced_wall_us"] / row["untraced_wall_us"]
    row["records"] = {k: v // rounds for k, v in sorted(records.items())}
    row["records_per_step"] = sum(records.values()) / rounds / (warmup + steps)
    row["goal"] = GOALS[mode]
    return row


def in_process_mode(mode: str, on_cuda: bool, host_only: bool, options: tuple[str, ...],
                    tmp: Path, baseline: str = "unpatched", layers: int = 16) -> dict:
    """One traced run of overhead_ab for `mode`: its JSON line (RuntimeError if it failed)."""
    command = [sys.executable, "-m", "mlatrace", "run", "--out", str(tmp / f"{mode}-ab"),
               *options, "--",
               sys.executable, "-m", "mlatrace.bench.overhead_ab", "--graph", mode,
               "--baseline", baseline, "--layers", str(layers),
               "--policy", POLICY[mode], "--device", "cuda" if on_cuda else "cpu",
               *([] if on_cuda else ["--ctx", "512"]), *(["--host-only"] if host_only else [])]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith('{"bench": "overhead_ab"')]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{' '.join(command)} exited {done.returncode}: "
                           f"{(done.stderr or done.stdout).strip()[-500:]}")
    return json.loads(lines[-1])


def main_in_process(modes: list[str], on_cuda: bool, host_only: bool,
                    options: tuple[str, ...], json_out: str | None,
                    baseline: str = "unpatched", layers: int = 16) -> int:
    """`bench overhead --in-process`: probes at work vs without, one process a mode."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="mlatrace-bench-overhead-") as tmp:
        try:
            for mode in modes:
                rows.append(in_process_mode(mode, on_cuda, host_only, options, Path(tmp),
                                            baseline, layers))
        except (RuntimeError, subprocess.TimeoutExpired) as error:
            raise MlatraceError(f"bench overhead: a run failed: {error}") from error
    clock = "gpu" if on_cuda and not host_only else "wall"
    without = "unpatched" if baseline == "unpatched" else "passed through"
    print(f"mlatrace bench overhead --in-process: device {'CUDA' if on_cuda else 'CPU'}"
          f"{', host only (device work dropped)' if host_only else ''}; one traced process "
          f"a mode, blocks of steps alternating probes at work / {without}; {layers} layers")
    print(f"{'graph mode':22s} {without:>15s} {'probes at work':>15s} "
          f"{'added':>10s} {'ratio ' + clock:>10s} {'ratio cpu':>10s}")
    for row in rows:
        label = f"{row['graph']} ({row['policy']})"
        added = row[f'active_{clock}_us'] - row[f'off_{clock}_us']
        print(f"{label:22s} {row[f'off_{clock}_us']:12.1f} us "
              f"{row[f'active_{clock}_us']:12.1f} us {added:7.1f} us {row[f'ratio_{clock}']:10.4f} "
              f"{row['ratio_cpu']:10.4f}")
    if json_out:
        Path(json_out).write_text(json.dumps({"bench": "overhead --in-process",
                                              "device": "cuda" if on_cuda else "cpu",
                                              "host_only": host_only,
                                              "baseline": baseline, "layers": layers,
                                              "options": list(options), "modes": rows},
                                             indent=1) + "\n")
        print(f"wrote {json_out}")
    return 0


def main(steps: int = 300, graphs: tuple[str, ...] | list[str] = ("full",),
         rounds: int = ROUNDS, sample: int | None = None, json_out: str | None = None,
         in_process: bool = False, host_only: bool = False, step_aside: str | None = None,
         baseline: str = "unpatched", layers: int = 16) -> int:
    """`mlatrace bench overhead`; `graphs`: modes of GOALS (cli.GraphModes checks them)."""
    modes = list(graphs)
    on_cuda = cuda_available()
    options = trace_options(sample, step_aside)
    if in_process:
        return main_in_process(modes, on_cuda, host_only, options, json_out, baseline, layers)
    if layers != 16:
        raise MlatraceError("bench overhead: --layers goes with --in-process")
    if host_only:
        raise MlatraceError("bench overhead: --host-only goes with --in-process")
    if not on_cuda:
        steps = min(steps, CPU_MAX_STEPS)
    rows = []
    with tempfile.TemporaryDirectory(prefix="mlatrace-bench-overhead-") as tmp:
        try:
            for mode in modes:
                rows.append(bench_mode(mode, on_cuda, steps, rounds, options, Path(tmp)))
        except RuntimeError as error:
            raise MlatraceError(f"bench overhead: a run failed: {error}") from error
    first = rows[0]["runs"]["untraced"][0]
    device_label = (f"CUDA ({first['device_name']})" if on_cuda
                    else "CPU (host graph; indicative only, no CUDA here)")
    print(f"mlatrace bench overhead: device {device_label}")
    print(f"serve: batch {first['batch']}, heads {first['heads']}, layers {first['layers']}, "
          f"ctx {first['ctx']}, {steps} timed steps, {plural(rounds, 'round')} alternating "
          f"untraced/traced; sync debug mode 'error': {'on' if first['sync_debug'] else 'off'}; "
          f"sampling: {'default' if sample is None else sample}, step-aside: "
          f"{'default' if step_aside is None else step_aside}")
    time_label = "GPU" if on_cuda else "host"
    print(f"{'graph mode':22s} {'untraced step':>14s} {'traced step':>12s} "
          f"{'ratio ' + time_label:>10s} {'ratio wall':>10s} {'records/step':>13s}  goal")
    missed = []
    for row in rows:
        met = row["ratio"] <= row["goal"] and row["wall_ratio"] <= row["goal"]
        if not met:
            missed.append(row["graph"])
        label = f"{row['graph']} ({row['policy']})"
        print(f"{label:22s} {row['untraced_step_us']:11.1f} us {row['traced_step_us']:9.1f} us "
              f"{row['ratio']:10.4f} {row['wall_ratio']:10.4f} {row['records_per_step']:13.2f}  "
              f"<= {row['goal']} {'met' if met else 'MISSED'}")
    for row in rows:
        kinds = ", ".join(f"{k} {v}" for k, v in row["records"].items())
        print(f"  {row['graph']}: records per traced run: {kinds}")
        if not row["records"].get("process"):
            print(f"  warning: {row['graph']}: the traced runs wrote no trace")
    summary = {"bench": "overhead", "device": "cuda" if on_cuda else "cpu",
               "device_name": first["device_name"], "steps": steps, "rounds": rounds,
               "sample": sample, "step_aside": step_aside, "modes": rows}
    if json_out:
        Path(json_out).write_text(json.dumps(summary, indent=1) + "\n")
        print(f"wrote {json_out}")
    return ExitCode.FAILED if on_cuda and missed else ExitCode.OK
