"""Session 4 lab (runs 24-25): is the splits bench's one-split gap an order effect? At
length 1 the legacy@1 and bucketed columns launch the same one-split kernel as the sweep's
fixed:1, yet read ~0.2 us less (runs 9, 21, 23). Time calls in a given order on one set
of inputs, each label a policy ("device-nopdl": the device policy with PDL off).

  python3 samples/lab/order_lab.py LENGTH LABEL [LABEL...]"""

import sys

import torch

from mlatrace.bench import splits_bench as sb
from mlatrace.reference import triton_mla

length = int(sys.argv[1])
cfg = sb.Config(lengths=(length,), sweep=(), min_replays=20, max_replays=200,
                seconds_per_point=0.25, tune=False)
timer = sb.Timer(cfg)
torch.manual_seed(length)
sets = sb.make_sets(length, 16, "cuda")
line = []
for label in sys.argv[2:]:
    policy = "device" if label == "device-nopdl" else label
    triton_mla.USE_PDL = "off" if label == "device-nopdl" else "device"
    hint = 1 if policy in ("device", "legacy") else length
    us = timer.per_call_us(sb.mla_calls(sets, policy, hint, "triton"))["us"]
    line.append(f"{label} {us:.3f}")
print(f"length {length}: " + ", ".join(line), flush=True)
