"""Session 4 lab (runs 17, 19): keys-on-M stage 1 (STAGE1_KEYS_ON_M), L2 prefetch
(STAGE1_L2_AHEAD) and
stage 2 without gdc_wait when one split is active (STAGE2_ONE_SPLIT_NO_WAIT).

  python3 samples/lab/kom_lab.py OUT_DIR [pdl] [check] [ab]

pdl:   does a normal launch after a PDL secondary that never waits see its primary done?
check: gpu_check --quick with the keys-on-M body.
ab:    interleaved A/B timing at the bench's lengths (min of two medians)."""

import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

from mlatrace.bench import splits_bench as sb
from mlatrace.reference import gpu_check, triton_mla

OUT = Path(sys.argv[1])
OUT.mkdir(parents=True, exist_ok=True)
STEPS = sys.argv[2:] or ["pdl", "check", "ab"]


@triton.jit
def _primary(flag, sink, SPIN: tl.constexpr):
    tl.extra.cuda.gdc_launch_dependents()
    x = tl.load(sink)
    for _ in range(SPIN):
        x = x * 1.0000001 + 1.0
    tl.store(sink, x)
    tl.store(flag, 1)


@triton.jit
def _secondary(flag, WAIT: tl.constexpr):
    if WAIT:
        tl.extra.cuda.gdc_wait()


@triton.jit
def _reader(flag, seen, i):
    tl.store(seen + i, tl.load(flag))


def pdl_order() -> dict:
    dev = "cuda"
    flag = torch.zeros(1, dtype=torch.int32, device=dev)
    sink = torch.ones(1, dtype=torch.float32, device=dev)
    out = {}
    for wait in (False, True):
        for mode in ("stream", "graph"):
            seen = torch.full((32,), -1, dtype=torch.int32, device=dev)

            def trial(i: int, wait: bool = wait, seen: torch.Tensor = seen) -> None:
                flag.zero_()
                _primary[(1,)](flag, sink, SPIN=200_000)
                _secondary[(1,)](flag, WAIT=wait, launch_pdl=True)
                _reader[(1,)](flag, seen, i)

            if mode == "stream":
                for i in range(32):
                    trial(i)
            else:
                trial(0)
                torch.cuda.synchronize()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    for i in range(32):
                        trial(i)
                seen.fill_(-1)
                g.replay()
            torch.cuda.synchronize()
            out[f"wait={wait} {mode}"] = seen.tolist()
            print(f"pdl order wait={wait} {mode}: reader saw flag=1 in "
                  f"{int((seen == 1).sum())}/32", flush=True)
    return out


BEST = {1: 1, 64: 1, 512: 8, 1024: 16, 4096: 64, 8192: 128, 16384: 128, 32768: 128,
        65536: 128, 100_000: 128}
VARIANTS = {  # keys on M, warps, stages, L2 tiles ahead, stage 2 no-wait
    "ship": (False, 8, 3, 0, False), "ship_l2": (False, 8, 3, 2, False),
    "kom8": (True, 8, 2, 0, False), "kom8_l2": (True, 8, 2, 2, False),
    "kom8_l3": (True, 8, 2, 3, False), "kom4_l2": (True, 4, 2, 2, False),
    "nowait": (False, 8, 3, 0, True)}
DEVICE_ONLY = ("nowait",)


def set_variant(name: str) -> None:
    keys, warps, stages, ahead, nowait = VARIANTS[name]
    triton_mla.STAGE1_KEYS_ON_M = keys
    triton_mla.KEYS_ON_M_WARPS = warps
    triton_mla.KEYS_ON_M_STAGES = stages
    triton_mla.STAGE1_L2_AHEAD = ahead
    triton_mla.STAGE2_ONE_SPLIT_NO_WAIT = nowait


def ab() -> list[dict]:
    cfg = sb.Config(lengths=sb.LENGTHS, sweep=(), min_replays=50, max_replays=3000,
                    seconds_per_point=0.2, tune=False)
    timer = sb.Timer(cfg)
    rows = []
    for length in cfg.lengths:
        torch.manual_seed(length)
        sets = sb.make_sets(length, 16, "cuda")
        row = {"length": length}
        policies = {"device": ("device", 1), "one": ("fixed:1", length),
                    "best": (f"fixed:{BEST[length]}", length)}
        if length >= 8192:
            policies["f256"] = ("fixed:256", length)
        for _ in range(2):
            for variant in VARIANTS:
                set_variant(variant)
                for name, (policy, hint) in policies.items():
                    if variant in DEVICE_ONLY and name != "device":
                        continue
                    key = f"{name}_{variant}"
                    us = timer.per_call_us(sb.mla_calls(sets, policy, hint, "triton"))["us"]
                    row[key] = min(row.get(key, 1e9), us)
        set_variant("ship")
        rows.append(row)
        print(f"{length:>6}: " + "  ".join(f"{k} {v:.2f}" for k, v in row.items()
                                           if k != "length"), flush=True)
        del sets
        (OUT / "ab.json").write_text(json.dumps(rows, indent=1))
    return rows


if "pdl" in STEPS:
    (OUT / "pdl.json").write_text(json.dumps(pdl_order(), indent=1))
if "check" in STEPS:
    set_variant("kom8_l2")
    triton_mla.STAGE2_ONE_SPLIT_NO_WAIT = True
    rc = gpu_check.main(["--quick", "--out", str(OUT / "check_kom")])
    set_variant("ship")
    print("gpu_check (keys on M, L2 prefetch, no wait) rc", rc, flush=True)
if "ab" in STEPS:
    ab()
