"""Session 5 lab (run 37): where the device policy's extra 0.4 us at 1 and 64 tokens
goes, with the Gluon stage 1. Variants of the device policy against one split:
stage-2 column blocks of 64 (128 stage-2 programs instead of 256), a launch budget of 16
(16 stage-1 programs instead of 132: the idle programs' share), and stage 2 without
PDL. Interleaved, min of three medians.

  python3 samples/lab/short_lab.py OUT_JSON"""

import json
import sys

from mlatrace.bench import splits_bench as sb
from mlatrace.reference import mla, policies, triton_mla

VARIANTS = {  # name: (policy, BLOCK_DV, budget, USE_PDL)
    "one_split": ("fixed:1", 32, 132, "device"),
    "device": ("device", 32, 132, "device"),
    "device_dv64": ("device", 64, 132, "device"),
    "device_b16": ("device", 32, 16, "device"),
    "device_nopdl": ("device", 32, 132, "off"),
}
cfg = sb.Config(lengths=(1, 64, 512), sweep=(), min_replays=50, max_replays=3000,
                seconds_per_point=0.2, tune=False)
timer = sb.Timer(cfg)
rows = []
for length in cfg.lengths:
    sets = sb.make_sets(length, 16, "cuda")
    row = {"length": length}
    for _ in range(3):
        for name, (policy, dv, budget, pdl) in VARIANTS.items():
            mla.BLOCK_DV, policies.DEVICE_PROGRAM_BUDGET, triton_mla.USE_PDL = dv, budget, pdl
            us = timer.per_call_us(sb.mla_calls(sets, policy, 1, "triton"))["us"]
            row[name] = min(row.get(name, 1e9), us)
    mla.BLOCK_DV, policies.DEVICE_PROGRAM_BUDGET, triton_mla.USE_PDL = 32, 132, "device"
    rows.append(row)
    print(f"{length:>6}: " + "  ".join(f"{k} {v:.2f}" for k, v in row.items() if k != "length"),
          flush=True)
    with open(sys.argv[1], "w") as f:
        json.dump(rows, f, indent=1)
