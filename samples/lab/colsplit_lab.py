"""Session 6 lab (run 42): one-tile sequences under the device partition split the value
columns over the launch's idle programs (`triton_mla.STAGE1_COLUMN_SPLITS`,
`gluon_mla._one_tile_columns`): each of N programs computes the 64 keys' scores and
writes 512/N columns of `o`, so the P.V and the epilogue of a short decode are 1/N long.
Correctness first (gpu_check's bf16 MLA checks with it on), then an interleaved A/B at
the bench's lengths (min of two medians) against one split and the best fixed split of
run 36 (longer sequences must not change: the main loop is untouched). Run 43 (`short`):
1 to 512 tokens only, N = 1, 2, 4, 8, five interleaved rounds, min and median.

  python3 samples/lab/colsplit_lab.py OUT_JSON [short]"""

import json
import statistics
import sys

import torch

from mlatrace.bench import splits_bench as sb
from mlatrace.reference import gpu_check, triton_mla

BEST = {1: 1, 64: 1, 128: 2, 512: 8, 1024: 16, 4096: 64, 8192: 128, 16384: 128, 32768: 128,
        65536: 128, 100_000: 128}
SHORT = sys.argv[2:] == ["short"]
variants = ({"cols1": 1, "cols2": 2, "cols4": 4, "cols8": 8} if SHORT
            else {"cols1": 1, "cols8": 8, "cols4": 4})


def set_variant(name: str) -> None:
    triton_mla.STAGE1_COLUMN_SPLITS = variants[name]


for variant in () if SHORT else ("cols8", "cols4"):
    set_variant(variant)
    results = []
    for nhead in (16, 128):
        gpu_check.check_mla(nhead, torch.bfloat16, gpu_check.LENGTH_SETS, results)
    bad = [r for r in results if not r["ok"]]
    print(f"CHECK {variant}: {len(results)} checks, {len(bad)} failed, "
          f"worst {max(r['err'] for r in results):.2e}", flush=True)
    for r in bad[:8]:
        print("  FAIL", gpu_check._line(r))

cfg = sb.Config(lengths=(1, 64, 128, 512) if SHORT else sb.LENGTHS, sweep=(), min_replays=50, max_replays=3000,
                seconds_per_point=0.2, tune=False)
timer = sb.Timer(cfg)
rows = []
for length in cfg.lengths:
    torch.manual_seed(length)
    sets = sb.make_sets(length, 16, "cuda")
    row = {"length": length}
    calls = {f"device_{v}": (v, "device", 1) for v in variants}
    calls.update({"one_split": ("cols1", "fixed:1", length),
                  "best": ("cols1", f"fixed:{BEST[length]}", length)})
    samples = {}
    for _ in range(5 if SHORT else 2):
        for key, (variant, policy, hint) in calls.items():
            set_variant(variant)
            try:
                us = timer.per_call_us(sb.mla_calls(sets, policy, hint, "triton"))["us"]
            except Exception as exc:  # report and go on
                print(f"{length} {key} FAILED {type(exc).__name__}: {str(exc)[-400:]}")
                us = float("nan")
            row[key] = min(row.get(key, 1e9), us)
            samples.setdefault(key, []).append(us)
    if SHORT:
        row.update({f"{k}_median": statistics.median(v) for k, v in samples.items()})
    rows.append(row)
    print(f"{length:>6}: " + "  ".join(f"{k} {v:.2f}" for k, v in row.items() if k != "length"),
          flush=True)
    del sets
    with open(sys.argv[1], "w") as f:
        json.dump(rows, f, indent=1)
