"""Run 16 lab: stage 1 with the latent in four quarters (STAGE1_SPLIT_QK) against the
shipped one-chain stage 1, at the bench's lengths: device policy and fixed splits
(interleaved A/B, min of two medians).  python3 samples/lab/splitqk_lab.py OUT_JSON"""

import json
import sys

import torch

from mlatrace.bench import splits_bench as sb
from mlatrace.reference import triton_mla

BEST = {1: 1, 64: 1, 512: 8, 1024: 16, 4096: 64, 8192: 128, 16384: 128, 32768: 128,
        65536: 128, 100_000: 128}   # best fixed split per length in run 9
cfg = sb.Config(lengths=sb.LENGTHS, sweep=(), min_replays=50, max_replays=3000,
                seconds_per_point=0.25, tune=False)
timer = sb.Timer(cfg)
rows = []
for length in cfg.lengths:
    torch.manual_seed(length)
    sets = sb.make_sets(length, 16, "cuda")
    row = {"length": length}
    policies = {"device": ("device", 1), "one": ("fixed:1", length),
                "best": (f"fixed:{BEST[length]}", length)}
    for _ in range(2):
        for split_qk in (False, True):
            triton_mla.STAGE1_SPLIT_QK = split_qk
            for name, (policy, hint) in policies.items():
                key = f"{name}{'_q' if split_qk else ''}"
                us = timer.per_call_us(sb.mla_calls(sets, policy, hint, "triton"))["us"]
                row[key] = min(row.get(key, 1e9), us)
    triton_mla.STAGE1_SPLIT_QK = False
    rows.append(row)
    print(f"{length:>6}: " + "  ".join(f"{k} {v:.2f}" for k, v in row.items() if k != "length"),
          flush=True)
    del sets
    with open(sys.argv[1], "w") as f:
        json.dump(rows, f, indent=1)
