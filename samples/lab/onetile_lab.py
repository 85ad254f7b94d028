"""Session 4 lab (run 28): stage 1's straight-line path for splits of one tile
(STAGE1_ONE_TILE) against the pipelined loop for every split. Run 27 saw a one-buffer
pipeline 0.5-0.7 us faster at 1-512 tokens. Interleaved A/B, min of two medians.

  python3 samples/lab/onetile_lab.py OUT_JSON"""

import json
import sys

import torch

from mlatrace.bench import splits_bench as sb
from mlatrace.reference import triton_mla

BEST = {1: 1, 64: 1, 512: 8, 1024: 16, 4096: 64, 8192: 128, 16384: 128, 100_000: 128}
cfg = sb.Config(lengths=tuple(BEST), sweep=(), min_replays=50, max_replays=3000,
                seconds_per_point=0.15, tune=False)
timer = sb.Timer(cfg)
rows = []
for length in cfg.lengths:
    torch.manual_seed(length)
    sets = sb.make_sets(length, 16, "cuda")
    row = {"length": length}
    policies = {"device": ("device", 1), "best": (f"fixed:{BEST[length]}", length)}
    if length <= 1024:
        policies["one"] = ("fixed:1", length)
    for _ in range(2):
        for one_tile in (False, True):
            triton_mla.STAGE1_ONE_TILE = one_tile
            for name, (policy, hint) in policies.items():
                key = f"{name}_{'onetile' if one_tile else 'loop'}"
                us = timer.per_call_us(sb.mla_calls(sets, policy, hint, "triton"))["us"]
                row[key] = min(row.get(key, 1e9), us)
    triton_mla.STAGE1_ONE_TILE = True
    rows.append(row)
    print(f"{length:>6}: " + "  ".join(f"{k} {v:.2f}" for k, v in row.items() if k != "length"),
          flush=True)
    del sets
    with open(sys.argv[1], "w") as f:
        json.dump(rows, f, indent=1)
