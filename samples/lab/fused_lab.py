"""Run 13 lab: the device policy with the merge inside the stage-1 launch (one graph node)
against the shipped two-stage path, at the bench's ten lengths, with the best fixed split
from the same sweep as `bench splits`. Interleaved A/B (min of two medians each).

python3 samples/lab/fused_lab.py OUT_JSON [budget264]
"""

import json
import sys

import torch

from mlatrace.bench import splits_bench as sb
from mlatrace.reference import triton_mla

out = sys.argv[1]
variants = [("two", "off", None), ("fused", "cuda", None)]
if "budget264" in sys.argv[2:]:
    knobs264 = (264, 32, 4, 3, True)
    variants += [("two264", "off", knobs264), ("fused264", "cuda", knobs264)]
cfg = sb.Config(lengths=sb.LENGTHS, sweep=sb.SWEEP, min_replays=50, max_replays=3000,
                seconds_per_point=0.25, tune=False)
timer = sb.Timer(cfg)
saved = sb.stage1_knobs()
rows = []
for length in cfg.lengths:
    torch.manual_seed(length)
    sets = sb.make_sets(length, 16, "cuda")
    row = {"length": length}
    for _ in range(2):
        for name, merge, knobs in variants:
            triton_mla.MERGE_IN_GRID = merge
            sb.set_stage1_knobs(knobs or saved)
            us = timer.per_call_us(sb.mla_calls(sets, "device", 1, "triton"))["us"]
            row[name] = min(row.get(name, 1e9), us)
    triton_mla.MERGE_IN_GRID = "off"
    sb.set_stage1_knobs(saved)
    sweep = {s: timer.per_call_us(sb.mla_calls(sets, f"fixed:{s}", length, "triton"))["us"]
             for s in cfg.sweep}
    row["sweep"] = sweep
    row["best_s"] = min(sweep, key=sweep.get)
    row["best"] = sweep[row["best_s"]]
    row["one"] = sweep[1]
    rows.append(row)
    print(f"{length:>6}: " + "  ".join(f"{n} {row[n]:.2f}" for n, _, _ in variants)
          + f"  best {row['best']:.2f} (S={row['best_s']})  one {row['one']:.2f}"
          + f"  fused/best {row['fused'] / row['best']:.3f} two/best {row['two'] / row['best']:.3f}",
          flush=True)
    del sets
    with open(out, "w") as f:
        json.dump(rows, f, indent=1)
