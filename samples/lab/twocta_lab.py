"""Session 4 lab (run 27): two 8-warp stage-1 programs per SM. Run 26 showed the load
pattern alone (stage 1 with only the P.V MMA) reaches 3.60 TB/s at 100K with two
programs per SM, and 3.27 with one. The full stage 1 is one program per SM (164 KiB of
shared memory, 152 registers). Budget 264 with one KV buffer (num_stages 2, 92 KiB) and
a 128-register cap (STAGE1_MAXNREG) fits two. Interleaved A/B, min of two medians.

  python3 samples/lab/twocta_lab.py OUT_JSON"""

import json
import sys

import torch

from mlatrace.bench import splits_bench as sb
from mlatrace.reference import triton_mla

BEST = {1: 1, 64: 1, 512: 8, 4096: 64, 16384: 128, 65536: 128, 100_000: 128}
SHIPPED = sb.stage1_knobs()
VARIANTS = {  # stage-1 knobs (budget, tile, warps, stages, prefetch), register cap
    "ship": (SHIPPED, None), "b264s2": ((264, 64, 8, 2, True), None),
    "b264s2r128": ((264, 64, 8, 2, True), 128), "b264s3r128": ((264, 64, 8, 3, True), 128)}


def set_variant(name: str) -> None:
    knobs, cap = VARIANTS[name]
    sb.set_stage1_knobs(knobs)
    triton_mla.STAGE1_MAXNREG = cap


cfg = sb.Config(lengths=tuple(BEST), sweep=(), min_replays=50, max_replays=3000,
                seconds_per_point=0.15, tune=False)
timer = sb.Timer(cfg)
rows = []
for length in cfg.lengths:
    torch.manual_seed(length)
    sets = sb.make_sets(length, 16, "cuda")
    row = {"length": length}
    policies = {"device": ("device", 1), "best": (f"fixed:{BEST[length]}", length)}
    if length >= 4096:
        policies["f256"] = ("fixed:256", length)
    for _ in range(2):
        for variant in VARIANTS:
            set_variant(variant)
            for name, (policy, hint) in policies.items():
                key = f"{name}_{variant}"
                try:
                    us = timer.per_call_us(sb.mla_calls(sets, policy, hint, "triton"))["us"]
                except Exception as exc:  # noqa: BLE001 (a config that does not fit)
                    print(f"{key}: {type(exc).__name__} {str(exc)[:100]}", flush=True)
                    us = float("nan")
                row[key] = min(row.get(key, 1e9), us)
    set_variant("ship")
    rows.append(row)
    print(f"{length:>6}: " + "  ".join(f"{k} {v:.2f}" for k, v in row.items() if k != "length"),
          flush=True)
    del sets
    with open(sys.argv[1], "w") as f:
        json.dump(rows, f, indent=1)
