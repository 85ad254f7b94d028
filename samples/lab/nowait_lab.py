"""Session 4 lab (run 20): stage 2 without gdc_wait for one active split (the new default)
against the old wait, and two configs measured before only at 100K: stage-2 column blocks
of 32 (mla.BLOCK_DV) and budget 264 with 32-row tiles and 4 warps (two CTAs per SM).
Interleaved A/B at the bench's lengths, min of two medians.

  python3 samples/lab/nowait_lab.py OUT_JSON"""

import json
import sys

import torch

from mlatrace.bench import splits_bench as sb
from mlatrace.reference import mla, triton_mla

BEST = {1: 1, 64: 1, 512: 8, 1024: 16, 4096: 64, 8192: 128, 16384: 128, 32768: 128,
        65536: 128, 100_000: 128}   # best fixed split per length in run 9
SHIPPED = sb.stage1_knobs()
B264 = (264, 32, 4, 3, True)
VARIANTS = {  # stage 2 waits, stage-2 BLOCK_DV, stage-1 knobs
    "wait": (True, 16, SHIPPED), "nowait": (False, 16, SHIPPED),
    "dv32": (False, 32, SHIPPED), "b264": (False, 16, B264), "b264_dv32": (False, 32, B264)}


def set_variant(name: str) -> None:
    wait, dv, knobs = VARIANTS[name]
    triton_mla.STAGE2_ONE_SPLIT_NO_WAIT = not wait
    mla.BLOCK_DV = dv
    sb.set_stage1_knobs(knobs)


cfg = sb.Config(lengths=sb.LENGTHS, sweep=(), min_replays=50, max_replays=3000,
                seconds_per_point=0.2, tune=False)
timer = sb.Timer(cfg)
rows = []
for length in cfg.lengths:
    torch.manual_seed(length)
    sets = sb.make_sets(length, 16, "cuda")
    row = {"length": length}
    policies = {"device": ("device", 1), "best": (f"fixed:{BEST[length]}", length)}
    if length <= 1024:
        policies["one"] = ("fixed:1", length)
    if length >= 4096:
        policies["f256"] = ("fixed:256", length)
    for _ in range(2):
        for variant in VARIANTS:
            set_variant(variant)
            for name, (policy, hint) in policies.items():
                if variant == "wait" and name != "device":
                    continue   # stage 2 of fixed splits never takes the no-wait branch
                key = f"{name}_{variant}"
                us = timer.per_call_us(sb.mla_calls(sets, policy, hint, "triton"))["us"]
                row[key] = min(row.get(key, 1e9), us)
    set_variant("nowait")
    rows.append(row)
    print(f"{length:>6}: " + "  ".join(f"{k} {v:.2f}" for k, v in row.items() if k != "length"),
          flush=True)
    del sets
    with open(sys.argv[1], "w") as f:
        json.dump(rows, f, indent=1)
