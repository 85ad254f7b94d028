"""Session 6 lab (runs 39-40): the device partition as one graph node on the Gluon stage 1
(`triton_mla.STAGE2_IN_GRID`: the group's programs, idle ones included, meet at a
self-resetting counter and each merges a share) against the shipped two-node path
(stage 1 + PDL stage 2). Correctness first (gpu_check's bf16 MLA checks with the knob
on, counters back at 0), then an interleaved A/B at the bench's lengths (min of two
medians) with one split and the best fixed split of run 36 beside them.

  python3 samples/lab/merge1_lab.py OUT_JSON"""

import json
import sys

import torch

from mlatrace.bench import splits_bench as sb
from mlatrace.reference import gpu_check, policies, triton_mla

BEST = {1: 1, 64: 1, 512: 8, 1024: 16, 4096: 64, 8192: 128, 16384: 128, 32768: 128,
        65536: 128, 100_000: 128}
# name: (in-grid merge, MERGE_DIAG, device program budget)
variants = {"two": (False, 0, 132), "one": (True, 0, 132), "barrier": (True, 1, 132),
            "two_b16": (False, 0, 16), "one_b16": (True, 0, 16), "two_b2": (False, 0, 2)}


def set_variant(name: str) -> None:
    in_grid, diag, budget = variants[name]
    triton_mla.STAGE2_IN_GRID = in_grid
    triton_mla.MERGE_DIAG = diag
    policies.DEVICE_PROGRAM_BUDGET = budget


set_variant("one")
results = []
for nhead in (16, 128):
    gpu_check.check_mla(nhead, torch.bfloat16, gpu_check.LENGTH_SETS, results)
bad = [r for r in results if not r["ok"]]
print(f"CHECK one node: {len(results)} checks, {len(bad)} failed, "
      f"worst {max(r['err'] for r in results):.2e}", flush=True)
for r in bad[:8]:
    print("  FAIL", gpu_check._line(r))
for (_dev, members), counters in triton_mla._COUNTERS.items():
    print(f"counters of {members} members: all multiples: "
          f"{bool((counters % members == 0).all())}, max {int(counters.max())}", flush=True)

cfg = sb.Config(lengths=sb.LENGTHS, sweep=(), min_replays=50, max_replays=3000,
                seconds_per_point=0.2, tune=False)
timer = sb.Timer(cfg)
rows = []
for length in cfg.lengths:
    torch.manual_seed(length)
    sets = sb.make_sets(length, 16, "cuda")
    row = {"length": length}
    calls = {"device_two": ("two", "device", 1), "device_one": ("one", "device", 1),
             "barrier_only": ("barrier", "device", 1),
             "one_split": ("two", "fixed:1", length),
             "best": ("two", f"fixed:{BEST[length]}", length)}
    if length <= 512:
        calls.update({f"device_{v}": (v, "device", 1) for v in ("two_b16", "one_b16",
                                                                  "two_b2")})
    for _ in range(2):
        for key, (variant, policy, hint) in calls.items():
            set_variant(variant)
            try:
                us = timer.per_call_us(sb.mla_calls(sets, policy, hint, "triton"))["us"]
            except Exception as exc:  # report and go on
                print(f"{length} {key} FAILED {type(exc).__name__}: {str(exc)[-400:]}")
                us = float("nan")
            row[key] = min(row.get(key, 1e9), us)
    rows.append(row)
    print(f"{length:>6}: " + "  ".join(f"{k} {v:.2f}" for k, v in row.items() if k != "length"),
          flush=True)
    del sets
    with open(sys.argv[1], "w") as f:
        json.dump(rows, f, indent=1)
