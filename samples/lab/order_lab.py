"""Session 4 lab (run 24): is the splits bench's one-split gap an order effect? At length 1
the legacy@1 and bucketed columns launch the same one-split kernel as the sweep's
fixed:1, yet read ~0.2 us less (runs 9, 21, 23). Time the same calls in a fixed order,
twice, on one set of inputs.  python3 samples/lab/order_lab.py"""

import torch

from mlatrace.bench import splits_bench as sb

cfg = sb.Config(lengths=(1, 64), sweep=(), min_replays=20, max_replays=200,
                seconds_per_point=0.25, tune=False)
timer = sb.Timer(cfg)
ORDER = [("legacy@1", "legacy", 1), ("fixed:1", "fixed:1", None), ("device", "device", 1),
         ("fixed:128", "fixed:128", None), ("legacy@1", "legacy", 1),
         ("fixed:1", "fixed:1", None), ("device", "device", 1)]
for length in (1, 64):
    torch.manual_seed(length)
    sets = sb.make_sets(length, 16, "cuda")
    for rnd in range(2):
        line = []
        for label, policy, hint in ORDER:
            us = timer.per_call_us(sb.mla_calls(sets, policy, hint or length, "triton"))["us"]
            line.append(f"{label} {us:.3f}")
        print(f"length {length} round {rnd}: " + ", ".join(line), flush=True)
