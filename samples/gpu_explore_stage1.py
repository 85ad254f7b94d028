"""Run 4 (GPU_NOTES.md): the in-grid merge and the keys-on-M stage 1, checked and timed.

Run from the repo root on the H200:
    PYTHONPATH=$PWD python3 samples/gpu_explore_stage1.py check --out $OUT/run4
    PYTHONPATH=$PWD python3 samples/gpu_explore_stage1.py sweep --out $OUT/run4

`check` compares the device policy (eager, and replayed from a graph captured at length 1)
with the float64 reference for the in-grid merge on and off and keys-on-M on and off, and
checks the merge counters are left at zero. `sweep` times the device policy at short and
long lengths by merge mode and stage-1 config (each config compiled without the fallback),
and records each config's registers, spills, shared memory and whether it uses wgmma.
Results: <out>/check.json, <out>/sweep.json (written after every point).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

from mlatrace.bench import splits_bench as sb
from mlatrace.reference import mla, policies, triton_mla

SHORT = (1, 64, 128, 256, 512, 1024, 2048, 4096, 16384)
LONG = 100_000
BEST_FIXED = {1: 1, 64: 1, 128: 2, 256: 4, 512: 8, 1024: 16, 2048: 32, 4096: 64,
              16384: 128, 100_000: 128}
# (budget, tile_n, warps, stages, prefetch, keys_on_m)
CONFIGS = (
    (132, 64, 8, 3, True, False), (132, 64, 16, 3, True, False), (264, 32, 8, 3, True, False),
    (132, 32, 16, 4, True, False),
)


def save(path: Path, data) -> None:
    path.write_text(json.dumps(data, indent=1, default=str))


def set_config(cfg: tuple) -> None:
    (policies.DEVICE_PROGRAM_BUDGET, triton_mla.STAGE1_TILE_N, triton_mla.STAGE1_WARPS,
     triton_mla.STAGE1_STAGES, triton_mla.STAGE1_PREFETCH, triton_mla.STAGE1_KEYS_ON_M) = cfg


def compiled_info() -> list[dict]:
    """Registers, spills, shared memory and wgmma use of every compiled stage-1 variant."""
    out = []
    try:
        for cache in triton_mla._mla_stage1_kernel.device_caches.values():
            for key, kernel in cache[0].items():
                ptx = kernel.asm.get("ptx", "") if hasattr(kernel, "asm") else ""
                out.append(dict(key=str(key)[-200:], regs=getattr(kernel, "n_regs", None),
                                spills=getattr(kernel, "n_spills", None),
                                shared=getattr(kernel.metadata, "shared", None),
                                wgmma="wgmma" in ptx, mma_sync="mma.sync" in ptx))
    except Exception as exc:  # diagnostics only
        out.append(dict(error=f"{type(exc).__name__}: {exc}"))
    return out


def check(out: Path, quick: bool = False) -> int:
    results, failed = [], 0
    sc = 1 / math.sqrt(576)
    cases = [(1, 16, [1]), (1, 16, [64]), (1, 16, [100]), (1, 16, [300]), (1, 16, [513]),
             (1, 16, [1000]), (1, 16, [5000]), (1, 16, [100_000]), (2, 16, [7, 40_000]),
             (8, 16, [1, 65, 900, 3000, 17, 4096, 12_345, 64]), (1, 128, [20_000]),
             (4, 128, [5, 2000, 70, 9000])]
    for merge in (True,) if quick else (True, False):
        for keys_on_m in (False,) if quick else (False, True):
            triton_mla.MERGE_IN_GRID, triton_mla.STAGE1_KEYS_ON_M = merge, keys_on_m
            for batch, nhead, lens in cases:
                for dtype in (torch.bfloat16, torch.float32):
                    if dtype == torch.float32 and (keys_on_m or quick or max(lens) > 20_000):
                        continue
                    torch.manual_seed(len(results))
                    maxp = max(lens) + 64
                    slots = maxp * batch + 64
                    kv = torch.randn(slots, 576, device="cuda").to(dtype)
                    pt = torch.stack([torch.randperm(slots, device="cuda")[:maxp]
                                      for _ in range(batch)]).int()
                    qn = torch.randn(batch, nhead, 512, device="cuda").to(dtype)
                    qp = torch.randn(batch, nhead, 64, device="cuda").to(dtype)
                    o = torch.full((batch, nhead, 512), float("nan"), device="cuda", dtype=dtype)
                    si = torch.ones(batch, dtype=torch.int32, device="cuda")
                    ref, rlse = mla.mla_reference(qn, qp, kv, pt, lens, sc)

                    def call(qn=qn, qp=qp, kv=kv, o=o, pt=pt, si=si):
                        return mla.mla_gluon(qn, qp, kv, o, pt, si, sc, policy="device",
                                             min_kv_seq_len=1, return_lse=True)
                    errs = {}
                    try:
                        call()                               # compile, allocate counters
                        si.copy_(torch.tensor(lens, dtype=torch.int32))
                        o.fill_(float("nan"))
                        _, lse = call()
                        torch.cuda.synchronize()
                        errs["eager"] = ((o.double() - ref).abs().max().item()
                                         / ref.abs().max().item(),
                                         (lse.double() - rlse).abs().max().item())
                        si.fill_(1)
                        g = torch.cuda.CUDAGraph()
                        with torch.cuda.graph(g):
                            _, glse = call()
                        si.copy_(torch.tensor(lens, dtype=torch.int32))
                        o.fill_(float("nan"))
                        for _ in range(3):
                            g.replay()
                        torch.cuda.synchronize()
                        errs["replay"] = ((o.double() - ref).abs().max().item()
                                          / ref.abs().max().item(),
                                          (glse.double() - rlse).abs().max().item())
                        counters = triton_mla._COUNTERS.get(o.device)
                        errs["counters_zero"] = bool(counters is None or
                                                     int(counters.abs().sum()) == 0)
                        del g
                    except Exception as exc:
                        errs["error"] = f"{type(exc).__name__}: {exc}"[:400]
                    tol = 3e-2 if dtype == torch.bfloat16 else 1e-4
                    ok = ("error" not in errs and errs["counters_zero"]
                          and all(e[0] < tol and e[1] < 1e-3 * max(1, math.log(max(lens)))
                                  for k, e in errs.items() if k in ("eager", "replay")))
                    failed += not ok
                    row = dict(merge=merge, keys_on_m=keys_on_m, batch=batch, nhead=nhead,
                               lens=lens, dtype=str(dtype), ok=ok, **errs)
                    results.append(row)
                    print(json.dumps(row), flush=True)
                    save(out / "check.json", results)
    print(f"check: {len(results)} cases, {failed} failed", flush=True)
    (out / "merge_ok").write_text("1" if failed == 0 else "0")
    return 0 if failed == 0 else 1


def sweep(out: Path, budget_s: float, merge_ok: bool) -> int:
    t_start = time.time()
    cfg = sb.Config(lengths=(), sweep=(), min_replays=10, max_replays=100,
                    seconds_per_point=0.2, tune=False)
    timer = sb.Timer(cfg)
    data: dict = dict(gpu=torch.cuda.get_device_name(), triton=sb._triton_version(),
                      read_ceiling=sb.read_ceiling("cuda"), short=[], long=[], compiled=[])
    print(f"read ceiling {data['read_ceiling'] / 1e12:.2f} TB/s", flush=True)
    triton_mla.FALLBACK_CONFIG = False
    triton_mla.MERGE_IN_GRID = merge_ok
    default = (policies.DEVICE_PROGRAM_BUDGET, triton_mla.STAGE1_TILE_N, triton_mla.STAGE1_WARPS,
               triton_mla.STAGE1_STAGES, triton_mla.STAGE1_PREFETCH, triton_mla.STAGE1_KEYS_ON_M)

    def timed(sets, policy, hint=1):
        try:
            return timer.per_call_us(sb.mla_calls(sets, policy, hint, "triton"))["us"]
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"[:300]

    # Short lengths: merge off / on (default stage 1), keys-on-M on, best fixed split.
    for length in SHORT:
        sets = sb.make_sets(length, 16, "cuda")
        row = dict(length=length)
        for merge in (False, True) if merge_ok else (False,):
            triton_mla.MERGE_IN_GRID = merge
            row[f"device_merge{int(merge)}"] = timed(sets, "device")
        row["best_fixed"] = (BEST_FIXED[length], timed(sets, f"fixed:{BEST_FIXED[length]}", length))
        row["one_split"] = timed(sets, "fixed:1", length)
        data["short"].append(row)
        print(json.dumps(row), flush=True)
        save(out / "sweep.json", data)
        del sets
    # 100K: every config with the merge on (and the default with it off).
    sets = sb.make_sets(LONG, 16, "cuda")
    nbytes = sb.mla_bytes(LONG, 16)
    for merge in (False, True) if merge_ok else (False,):
        triton_mla.MERGE_IN_GRID = merge
        for c in CONFIGS:
            if merge and c[0] > 132:
                continue
            if time.time() - t_start > budget_s:
                print("sweep: time budget reached", flush=True)
                break
            set_config(c)
            us = timed(sets, "device")
            entry = dict(merge=merge, budget=c[0], tile_n=c[1], warps=c[2], stages=c[3],
                         prefetch=c[4], keys_on_m=c[5], us=us,
                         tbps=nbytes / us / 1e6 if isinstance(us, float) else None)
            data["long"].append(entry)
            print(json.dumps(entry), flush=True)
            save(out / "sweep.json", data)
        set_config(default)
    best_fixed = timed(sets, "fixed:128", LONG)
    data["long_best_fixed128"] = best_fixed
    print(f"fixed 128 at {LONG}: {best_fixed}", flush=True)
    data["compiled"] = compiled_info()
    save(out / "sweep.json", data)
    return 0


DIAG_LENGTHS = (1, 64, 128, 512, 1024, 2048, 4096, 16384, 100_000)
DIAG_VARIANTS = {  # name: (MERGE_IN_GRID, MERGE_DIAG, STAGE2_SMALL_S, STAGE2_MID_S)
    "two-stage": (False, 0, 0, 0), "small_s16": (False, 0, 16, 0),
    "small_s16+mid64": (False, 0, 16, 64), "small_s8+mid32": (False, 0, 8, 32),
    "merge": (True, 0, 0, 0), "merge barrier only": (True, 1, 0, 0),
}


def diag(out: Path) -> int:
    """Where the in-grid merge's time goes, and the two-stage short-length levers."""
    cfg = sb.Config(lengths=(), sweep=(), min_replays=10, max_replays=100,
                    seconds_per_point=0.2, tune=False)
    timer = sb.Timer(cfg)
    rows = []
    for length in DIAG_LENGTHS:
        sets = sb.make_sets(length, 16, "cuda")
        row: dict = dict(length=length)
        for name, (merge, diag_mode, small_s, mid_s) in DIAG_VARIANTS.items():
            (triton_mla.MERGE_IN_GRID, triton_mla.MERGE_DIAG, triton_mla.STAGE2_SMALL_S,
             triton_mla.STAGE2_MID_S) = merge, diag_mode, small_s, mid_s
            try:
                row[name] = timer.per_call_us(sb.mla_calls(sets, "device", 1, "triton"))["us"]
            except Exception as exc:
                row[name] = f"{type(exc).__name__}: {exc}"[:200]
        triton_mla.MERGE_IN_GRID, triton_mla.MERGE_DIAG = False, 0
        triton_mla.STAGE2_SMALL_S, triton_mla.STAGE2_MID_S = 0, 0
        n = BEST_FIXED[length]
        row["best_fixed"] = (n, timer.per_call_us(sb.mla_calls(sets, f"fixed:{n}", length,
                                                               "triton"))["us"])
        rows.append(row)
        print(json.dumps(row), flush=True)
        save(out / "diag.json", rows)
        del sets
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("part", choices=("check", "sweep", "diag"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=330)
    ap.add_argument("--merge", action="store_true", help="sweep the in-grid merge too")
    ap.add_argument("--quick", action="store_true", help="check: merge on, bf16 only")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.part == "check":
        return check(out, args.quick)
    if args.part == "diag":
        return diag(out)
    merge_ok = args.merge or ((out / "merge_ok").exists()
                              and (out / "merge_ok").read_text() == "1")
    return sweep(out, args.budget_s, merge_ok)


if __name__ == "__main__":
    sys.exit(main())
