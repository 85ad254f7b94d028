"""Session 5 lab: the Gluon stage 1 (warpgroup MMA, keys on M, cp.async ring;
`gluon_mla`) against the portable Triton stage 1, interleaved A/B at the bench's
lengths, min of two medians; device policy and the best fixed split of run 23. Runs
29-32 compared ring depths and warp counts (commit ebb7e96); run 33 compares q loaded
before / after the partition, and times a plain copy moving the same bytes as the 100K
decode through the same graph timer (what launch and ramp leave of the ceiling at this
size). Run 35: one KV slot per program and two programs per SM (RING 1, budget 264).

  python3 samples/lab/gluon_lab.py OUT_JSON"""

import json
import sys

import torch

from mlatrace.bench import splits_bench as sb
from mlatrace.reference import gpu_check, triton_mla

BEST = {1: 1, 64: 1, 512: 8, 1024: 16, 4096: 64, 8192: 128, 16384: 128, 32768: 128,
        65536: 128, 100_000: 128}
BYTES_100K = 115.6e6
# The knobs of runs 29-35 (NBUF, WARPS, q early, RING) are in git history (ebb7e96,
# e312d5b); what is left compares the shipped Gluon stage 1 with the Triton one.
variants = {"triton": False, "gluon": True}


def set_variant(name: str) -> None:
    triton_mla.STAGE1_GLUON = variants[name]


# Correctness first (gpu_check's bf16 MLA checks: every policy, eager and graph@1,
# nhead 16 and 128, lengths 1 .. 100K), per Gluon variant.
for variant in [v for v in variants if v != "triton"]:
    set_variant(variant)
    results = []
    for nhead in (16, 128):
        gpu_check.check_mla(nhead, torch.bfloat16, gpu_check.LENGTH_SETS, results)
    bad = [r for r in results if not r["ok"]]
    worst = max(r["err"] for r in results)
    print(f"CHECK {variant}: {len(results)} checks, {len(bad)} failed, worst {worst:.2e}",
          flush=True)
    for r in bad[:8]:
        print("  FAIL", gpu_check._line(r))

cfg = sb.Config(lengths=sb.LENGTHS, sweep=(), min_replays=50, max_replays=3000,
                seconds_per_point=0.2, tune=False)
timer = sb.Timer(cfg)
rows = []
for length in cfg.lengths:
    torch.manual_seed(length)
    sets = sb.make_sets(length, 16, "cuda")
    row = {"length": length}
    calls = {"device": ("device", 1), "best": (f"fixed:{BEST[length]}", length)}
    for _ in range(2):
        for variant in variants:
            set_variant(variant)
            for name, (policy, hint) in calls.items():
                key = f"{name}_{variant}"
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
for variant in variants:
    set_variant(variant)
    print(variant, sb.stage_breakdown(cfg, timer, 100_000, lambda line: None))
half = int(BYTES_100K // 4)   # bf16 elements: read + write = the decode's bytes
pairs = [(torch.randn(half, device="cuda").to(torch.bfloat16),
          torch.empty(half, dtype=torch.bfloat16, device="cuda")) for _ in range(4)]
copy_us = timer.per_call_us([lambda s=s, d=d: d.copy_(s) for s, d in pairs])["us"]
print(f"same-size copy (115.6 MB moved) in the graph timer: {copy_us:.2f} us,"
      f" {BYTES_100K / copy_us / 1e6:.2f} TB/s; ceiling {sb.read_ceiling('cuda') / 1e12:.2f}")
r = rows[-1]
print("100K TB/s: " + "  ".join(f"{k} {BYTES_100K / v / 1e6:.2f}" for k, v in r.items()
                                if k != "length"))
