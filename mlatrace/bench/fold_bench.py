"""Trace bytes per steady decode step, folding on and off (CPU, the reference engine).

    python -m mlatrace.bench.fold_bench --runs 10 --steps 10000 --off-steps 2000 \
        --json-out fold.json

Runs `python -m mlatrace.reference.serve` (FULL graphs, device policy, a tiny model so a
step is a millisecond or two on one CPU thread) under `mlatrace run --fold 10`, `--runs`
times for `--steps` steps (the engine's lengths grow by one a step, so several shorter
runs keep the step short), and once under `--fold 0` for `--off-steps`. Reports the
bytes and records per step, over whole files and without each file's fixed header and
`process.end`, and the size of a day at 50 steps a second.

    python -m mlatrace.bench.fold_bench --increment 1000 --steps 200

runs `mlatrace run` with every default instead, twice, 1,000 steps apart: the bytes and
records a steady step adds, the replay-time sample included.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SERVE = ("--device", "cpu", "--policy", "device", "--layers", "1", "--hidden", "16",
         "--heads", "1", "--batch", "1", "--ctx", "64", "--warmup", "0")
STEPS_PER_S = 50
DAY_S = 86_400


def traced(out: Path, fold: str | None, steps: int, graph: str) -> dict:
    """One traced serve run (fold None: every `mlatrace run` default): its file's size,
    records and kinds."""
    cmd = [sys.executable, "-m", "mlatrace", "run",
           *(["--fold", fold] if fold is not None else []), "--out", str(out), "--",
           sys.executable, "-m", "mlatrace.reference.serve", *SERVE, "--graph", graph,
           "--steps", str(steps)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    start = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}: {done.stderr[-2000:]}")
    (path,) = out.glob("p*.jsonl")
    size = path.stat().st_size
    kinds: dict[str, int] = {}
    fixed = 0
    with path.open() as lines:
        for line in lines:
            kind = json.loads(line).get("k")
            kinds[kind] = kinds.get(kind, 0) + 1
            if kind in ("process", "process.end"):
                fixed += len(line)
    records = sum(kinds.values())
    return {"fold": float(fold) if fold is not None else None, "graph": graph, "steps": steps, "bytes": size,
            "fixed_bytes": fixed, "records": records, "kinds": dict(sorted(kinds.items())),
            "bytes_per_step": size / steps, "records_per_step": records / steps,
            "day_mb_at_50_steps_per_s": size / steps * STEPS_PER_S * DAY_S / 1e6,
            "seconds": round(time.perf_counter() - start, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--off-steps", type=int, default=2_000)
    parser.add_argument("--graph", default="full")
    parser.add_argument("--json-out", default=None)
    parser.add_argument("--increment", type=int, default=0, metavar="STEPS",
                        help="instead: bytes a steady step adds with every default on, "
                             "from two runs --steps apart by STEPS")
    args = parser.parse_args(argv)
    if args.increment:
        return increment(args.steps, args.increment, args.graph, args.json_out)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for run in range(args.runs):
            rows.append(traced(Path(tmp) / f"on{run}", "10", args.steps, args.graph))
            print(json.dumps(rows[-1]), flush=True)
        rows.append(traced(Path(tmp) / "off", "0", args.off_steps, args.graph))
    on = [r for r in rows if r["fold"]]
    steps = sum(r["steps"] for r in on)
    size = sum(r["bytes"] for r in on)
    steady = size - sum(r["fixed_bytes"] for r in on)
    total = {"runs": len(on), "steps": steps, "bytes": size,
             "records": sum(r["records"] for r in on), "bytes_per_step": size / steps,
             "bytes_per_step_without_header_and_end": steady / steps,
             "records_per_step": sum(r["records"] for r in on) / steps,
             "day_mb_at_50_steps_per_s": steady / steps * STEPS_PER_S * DAY_S / 1e6}
    print(f"folding on, {len(on)} runs, {steps} steps: {size} B; {total['bytes_per_step']:.2f} B "
          f"per step ({total['bytes_per_step_without_header_and_end']:.2f} B without headers "
          f"and process.end), {total['records_per_step']:.4f} records per step; a day at 50 "
          f"steps/s: {total['day_mb_at_50_steps_per_s']:.1f} MB")
    for row in rows[-1:]:
        print(f"fold {row['fold']:g} s, {row['graph']}, {row['steps']} steps: {row['bytes']} B, "
              f"{row['records']} records; {row['bytes_per_step']:.2f} B and "
              f"{row['records_per_step']:.4f} records per step; a day at 50 steps/s: "
              f"{row['day_mb_at_50_steps_per_s']:.1f} MB ({row['seconds']} s)")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"bench": "fold", "serve": list(SERVE),
                                                   "runs": rows, "folded": total},
                                                  indent=1))
    return 0


def increment(steps: int, more: int, graph: str, json_out: str | None) -> int:
    """Bytes and records per steady step with every `mlatrace run` default on (folding,
    sampling, step-aside, replay timing): what `more` steps add to a run of `steps`."""
    with tempfile.TemporaryDirectory() as tmp:
        short = traced(Path(tmp) / "short", None, steps, graph)
        long = traced(Path(tmp) / "long", None, steps + more, graph)
    added = {kind: long["kinds"].get(kind, 0) - short["kinds"].get(kind, 0)
             for kind in sorted(set(long["kinds"]) | set(short["kinds"]))}
    row = {"bench": "fold --increment", "serve": list(SERVE), "graph": graph, "steps": steps,
           "more": more, "bytes_per_step": (long["bytes"] - short["bytes"]) / more,
           "records_per_step": (long["records"] - short["records"]) / more,
           "records_added": {k: v for k, v in added.items() if v},
           "seconds": [short["seconds"], long["seconds"]]}
    print(f"{graph}, every default on: {more} steps more add {long['bytes'] - short['bytes']} B, "
          f"{row['bytes_per_step']:.2f} B and {row['records_per_step']:.4f} records per step "
          f"({', '.join(f'{k} {v}' for k, v in row['records_added'].items())})")
    if json_out:
        Path(json_out).write_text(json.dumps(row, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
