"""Run 10 (GPU_NOTES.md): is the in-grid merge's cost its own code or its fusion?

PYTHONPATH=$PWD python3 samples/lab/merge_lab.py --out $OUT/run10

Times, per call from CUDA-graph replays (the splits bench's Timer), at several lengths:
- fused: stage 1 with the in-grid merge (merge_v3_kernels, commit 2b81d10);
- two-stage: stage 1 + the stage-2 kernel (the shipped design);
- merge kernel: stage 1 + a standalone kernel running the same merge code (`_merge_share`)
  on the stage-1 grid, 8 or 4 warps (no barrier: a separate kernel needs none);
and prints the fused kernel's registers and spills as compiled here (Triton 3.6).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
import merge_v3_kernels as k3  # noqa: E402

from mlatrace.bench import splits_bench as sb  # noqa: E402
from mlatrace.reference import policies  # noqa: E402

LENGTHS = (1, 64, 512, 2048, 16384, 100_000)
_merge_share_v3 = k3._merge_share


@triton.jit
def _merge_rows(partial_out, partial_lse, o, b, split, active, hblock, stride_po_b, stride_po_s,
                stride_po_h, stride_pl_b, stride_pl_s, stride_o_b, stride_o_h, nhead,
                BLOCK_H: tl.constexpr, D_LATENT: tl.constexpr, SB: tl.constexpr,
                E: tl.constexpr):
    """v4: stage 2's body in a loop: units (head, E columns), one [SB, E] load each."""
    offs_s = tl.arange(0, SB)
    split_ok = offs_s < active
    n_col: tl.constexpr = D_LATENT // E
    for unit in range(split, BLOCK_H * n_col, active):
        h = hblock * BLOCK_H + unit // n_col
        if h < nhead:
            cols = (unit % n_col) * E + tl.arange(0, E)
            lse = tl.load(partial_lse + b * stride_pl_b + offs_s * stride_pl_s + h,
                          mask=split_ok, other=float("-inf"), cache_modifier=".cg")
            top = tl.max(lse, 0)
            weight = tl.where(split_ok, tl.exp(lse - top), 0.0)
            part = tl.load(partial_out + b * stride_po_b + offs_s[:, None] * stride_po_s
                           + h * stride_po_h + cols[None, :], mask=split_ok[:, None], other=0.0,
                           cache_modifier=".cg")
            merged = tl.sum(weight[:, None] * part, 0) / tl.sum(weight, 0)
            tl.store(o + b * stride_o_b + h * stride_o_h + cols, merged.to(o.dtype.element_ty))


@triton.jit
def _merge_share_v4(partial_out, partial_lse, o, lse_out, b, split, active, hblock,
                    stride_po_b, stride_po_s, stride_po_h, stride_pl_b, stride_pl_s,
                    stride_o_b, stride_o_h, nhead, BLOCK_H: tl.constexpr,
                    D_LATENT: tl.constexpr, RETURN_LSE: tl.constexpr, SB: tl.constexpr,
                    MERGE_TILE: tl.constexpr):
    """The v3 call signature (so the v3 stage-1 kernel can call it); RETURN_LSE unused."""
    if SB <= 16:
        _merge_rows(partial_out, partial_lse, o, b, split, active, hblock, stride_po_b,
                    stride_po_s, stride_po_h, stride_pl_b, stride_pl_s, stride_o_b, stride_o_h,
                    nhead, BLOCK_H, D_LATENT, SB, D_LATENT)
    else:
        _merge_rows(partial_out, partial_lse, o, b, split, active, hblock, stride_po_b,
                    stride_po_s, stride_po_h, stride_pl_b, stride_pl_s, stride_o_b, stride_o_h,
                    nhead, BLOCK_H, D_LATENT, SB, MERGE_TILE // SB)


@triton.jit
def _merge_only(partial_out, partial_lse, seq_info, o, lse_out,
                stride_po_b, stride_po_s, stride_po_h, stride_pl_b, stride_pl_s,
                stride_o_b, stride_o_h, nhead, NUM_KV_SPLITS: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr, D_LATENT: tl.constexpr,
                MERGE_TILE: tl.constexpr):
    b = tl.program_id(0)
    split = tl.program_id(1)
    hblock = tl.program_id(2)
    active, _ = k3._device_partition(tl.load(seq_info + b), NUM_KV_SPLITS, BLOCK_N, 1)
    if active > 1:
        if split < active:
            if active <= 4:
                k3._merge_share(partial_out, partial_lse, o, lse_out, b, split, active, hblock,
                                stride_po_b, stride_po_s, stride_po_h, stride_pl_b, stride_pl_s,
                                stride_o_b, stride_o_h, nhead, BLOCK_H, D_LATENT, False, 4,
                                MERGE_TILE)
            elif active <= 16:
                k3._merge_share(partial_out, partial_lse, o, lse_out, b, split, active, hblock,
                                stride_po_b, stride_po_s, stride_po_h, stride_pl_b, stride_pl_s,
                                stride_o_b, stride_o_h, nhead, BLOCK_H, D_LATENT, False, 16,
                                MERGE_TILE)
            elif active <= 64:
                k3._merge_share(partial_out, partial_lse, o, lse_out, b, split, active, hblock,
                                stride_po_b, stride_po_s, stride_po_h, stride_pl_b, stride_pl_s,
                                stride_o_b, stride_o_h, nhead, BLOCK_H, D_LATENT, False, 64,
                                MERGE_TILE)
            else:
                k3._merge_share(partial_out, partial_lse, o, lse_out, b, split, active, hblock,
                                stride_po_b, stride_po_s, stride_po_h, stride_pl_b, stride_pl_s,
                                stride_o_b, stride_o_h, nhead, BLOCK_H, D_LATENT, False, 256,
                                MERGE_TILE)


def calls(sets: list[dict], mode: str, warps: int = 8, tile: int = 16384,
          version: int = 3) -> list:
    splits = policies.num_kv_splits("device", 1, 1, 16, 1)
    grid = (1, splits, 1)
    out = []
    for s in sets:
        part = torch.empty(1, splits, 16, 512, dtype=torch.float32, device=s["o"].device)
        plse = torch.empty(1, splits, 16, dtype=torch.float32, device=s["o"].device)
        common = dict(q_nope=s["q_nope"], q_pe=s["q_pe"], kv_c=s["kv_c"], k_pe=s["kv_c"][:, 512:],
                      page_table=s["page_table"], seq_info=s["seq_info"],
                      sm_scale=1 / math.sqrt(576), o=s["o"], lse_out=None, partial_out=part,
                      partial_lse=plse, num_splits=splits, block_n=64, device_partition=True,
                      min_tiles=1, block_h=16)

        def call(common=common, part=part, plse=plse, s=s):
            k3.MERGE_TILE = tile
            k3._merge_share = _merge_share_v4 if version == 4 else _merge_share_v3
            k3.stage1(grid, **common, merge_in_grid=mode == "fused")
            if mode == "two-stage":
                k3.stage2((1, 16, 32), partial_out=part, partial_lse=plse,
                          seq_info=s["seq_info"], o=s["o"], lse_out=None, num_splits=splits,
                          block_n=64, device_partition=True, min_tiles=1, block_s=256,
                          block_dv=16)
            elif mode == "merge kernel":
                _merge_only[grid](part, plse, s["seq_info"], s["o"], s["o"], *part.stride()[:3],
                                  *plse.stride()[:2], s["o"].stride(0), s["o"].stride(1), 16,
                                  NUM_KV_SPLITS=splits, BLOCK_N=64, BLOCK_H=16, D_LATENT=512,
                                  MERGE_TILE=tile, num_warps=warps, num_stages=1)
        out.append(call)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    timer = sb.Timer(sb.Config(lengths=(), sweep=(), min_replays=10, max_replays=100,
                               seconds_per_point=0.2, tune=False))
    k3.STAGE2_SMALL_S, k3.STAGE2_MID_S = 16, 64
    variants = [("two-stage", 8, 16384, 3), ("fused", 8, 8192, 4), ("fused", 8, 4096, 4),
                ("merge kernel", 8, 8192, 4), ("merge kernel", 4, 8192, 4)]
    rows = []
    for length in LENGTHS:
        sets = sb.make_sets(length, 16, "cuda")
        row: dict = dict(length=length)
        for mode, warps, tile, version in variants:
            name = f"{mode} v{version} w{warps} t{tile}"
            try:
                row[name] = timer.per_call_us(calls(sets, mode, warps, tile, version))["us"]
            except Exception as exc:
                row[name] = f"{type(exc).__name__}: {exc}"[:200]
        rows.append(row)
        print(json.dumps(row), flush=True)
        (out / "lab.json").write_text(json.dumps(rows, indent=1))
        del sets
    from mlatrace.reference.mla import mla_reference

    for length in (512, 2048, 100_000):   # the fused v4 merge against float64
        st = sb.make_sets(length, 16, "cuda", num_sets=1)
        st[0]["o"].fill_(float("nan"))
        calls(st, "fused", 8, 8192, 4)[0]()
        calls(st, "fused", 8, 8192, 4)[0]()
        torch.cuda.synchronize()
        s0 = st[0]
        ref, _ = mla_reference(s0["q_nope"], s0["q_pe"], s0["kv_c"], s0["page_table"], [length],
                               1 / math.sqrt(576))
        err = ((s0["o"].double() - ref).abs().max() / ref.abs().max()).item()
        print(json.dumps(dict(check=length, fused_v4_rel_err=err)), flush=True)
    info = []
    for fn in (k3._mla_stage1_kernel, _merge_only):
        for cache in fn.device_caches.values():
            for kernel in cache[0].values():
                info.append(dict(fn=fn.fn.__name__, regs=kernel.n_regs, spills=kernel.n_spills,
                                 shared=kernel.metadata.shared,
                                 sass_bytes=len(kernel.asm.get("cubin", b""))))
    print(json.dumps(info), flush=True)
    (out / "compiled.json").write_text(json.dumps(info, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
