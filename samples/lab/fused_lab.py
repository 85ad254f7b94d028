"""Runs 13-14 lab: the device policy with the merge inside the stage-1 launch (one graph
node) against the shipped two-stage path, with the best fixed split from a sweep.
Interleaved A/B (min of two medians each).

python3 samples/lab/fused_lab.py OUT_JSON LENGTHS SWEEP VARIANT...
  LENGTHS, SWEEP: comma lists ("all" = the bench's); VARIANT: name:merge:diag[:merge_dv]
  e.g. two:off:0 fused:cuda:0 early:cuda:1 nomerge:cuda:2 nowait:cuda:3
"""

import json
import sys

import torch

from mlatrace.bench import splits_bench as sb
from mlatrace.reference import triton_mla

out, lengths_arg, sweep_arg, *specs = sys.argv[1:]
lengths = sb.LENGTHS if lengths_arg == "all" else tuple(int(x) for x in lengths_arg.split(","))
sweep_splits = sb.SWEEP if sweep_arg == "all" else tuple(int(x) for x in sweep_arg.split(","))
variants = []
for spec in specs:
    name, merge, diag, *rest = spec.split(":")
    variants.append((name, merge, int(diag), int(rest[0]) if rest else 128))
cfg = sb.Config(lengths=lengths, sweep=sweep_splits, min_replays=50, max_replays=3000,
                seconds_per_point=0.25, tune=False)
timer = sb.Timer(cfg)
rows = []
for length in cfg.lengths:
    torch.manual_seed(length)
    sets = sb.make_sets(length, 16, "cuda")
    row = {"length": length}
    for _ in range(2):
        for name, merge, diag, merge_dv in variants:
            triton_mla.MERGE_IN_GRID, triton_mla.MERGE_DIAG = merge, diag
            triton_mla.MERGE_DV = merge_dv
            us = timer.per_call_us(sb.mla_calls(sets, "device", 1, "triton"))["us"]
            row[name] = min(row.get(name, 1e9), us)
    triton_mla.MERGE_IN_GRID, triton_mla.MERGE_DIAG, triton_mla.MERGE_DV = "off", 0, 128
    sweep = {s: timer.per_call_us(sb.mla_calls(sets, f"fixed:{s}", length, "triton"))["us"]
             for s in cfg.sweep}
    row["sweep"] = sweep
    row["best_s"] = min(sweep, key=sweep.get)
    row["best"] = sweep[row["best_s"]]
    row["one"] = sweep.get(1)
    rows.append(row)
    print(f"{length:>6}: " + "  ".join(f"{n} {row[n]:.2f}" for n, *_ in variants)
          + f"  best {row['best']:.2f} (S={row['best_s']})  one {row['one']}", flush=True)
    del sets
    with open(out, "w") as f:
        json.dump(rows, f, indent=1)
