"""Session 4 lab (run 22): stage 1 with fewer instructions per tile. Clamped rows instead of
masked loads (STAGE1_CLAMP_ROWS) and 32-bit row offsets (STAGE1_OFFSETS_32) take the
loop from 717 to 504 SASS instructions per warp per tile on Triton 3.6 (sm_90 compile on
the CPU box). Is stage 1 issue-bound enough for that to show? Interleaved A/B at the
bench's lengths, min of two medians; `gpu_check --quick` first with both on.

  python3 samples/lab/clamp_lab.py OUT_DIR"""

import json
import sys
from pathlib import Path

import torch

from mlatrace.bench import splits_bench as sb
from mlatrace.reference import gpu_check, triton_mla

OUT = Path(sys.argv[1])
OUT.mkdir(parents=True, exist_ok=True)
BEST = {1: 1, 64: 1, 512: 8, 1024: 16, 4096: 64, 8192: 128, 16384: 128, 32768: 128,
        65536: 128, 100_000: 128}   # best fixed split per length in run 21
SHIPPED = sb.stage1_knobs()
B264 = (264, 32, 4, 3, True)
VARIANTS = {  # clamp rows, 32-bit offsets, stage-1 knobs
    "base": (False, False, SHIPPED), "clamp": (True, False, SHIPPED),
    "clamp32": (True, True, SHIPPED), "clamp32_b264": (True, True, B264)}


def set_variant(name: str) -> None:
    clamp, off32, knobs = VARIANTS[name]
    triton_mla.STAGE1_CLAMP_ROWS = clamp
    triton_mla.STAGE1_OFFSETS_32 = off32
    sb.set_stage1_knobs(knobs)


set_variant("clamp32")
print("gpu_check (clamp32) rc", gpu_check.main(["--quick", "--out", str(OUT / "check")]),
      flush=True)
cfg = sb.Config(lengths=sb.LENGTHS, sweep=(), min_replays=50, max_replays=3000,
                seconds_per_point=0.2, tune=False)
timer = sb.Timer(cfg)
rows = []
for length in cfg.lengths:
    torch.manual_seed(length)
    sets = sb.make_sets(length, 16, "cuda")
    row = {"length": length}
    policies = {"device": ("device", 1), "best": (f"fixed:{BEST[length]}", length)}
    if length <= 1024 or length == 100_000:
        policies["one"] = ("fixed:1", length)
    if length >= 4096:
        policies["f256"] = ("fixed:256", length)
    for _ in range(2):
        for variant in VARIANTS:
            set_variant(variant)
            for name, (policy, hint) in policies.items():
                key = f"{name}_{variant}"
                us = timer.per_call_us(sb.mla_calls(sets, policy, hint, "triton"))["us"]
                row[key] = min(row.get(key, 1e9), us)
    set_variant("base")
    rows.append(row)
    print(f"{length:>6}: " + "  ".join(f"{k} {v:.2f}" for k, v in row.items() if k != "length"),
          flush=True)
    del sets
    (OUT / "ab.json").write_text(json.dumps(rows, indent=1))
