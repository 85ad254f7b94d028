"""Triton kernels of the reference MLA decode (stage 1 split attention, stage 2 merge).

Plain, portable Triton (tl.load/tl.store/tl.dot, masks, program_id) so the same code runs
on the H200 (Triton 3.6) and under TRITON_INTERPRET=1 on a CPU (Triton 3.9). The host
launches live in `mla.launch_stage1/launch_stage2`; these wrappers only state the grid.

Partition (mirrors `policies.kv_split_range` and `policies.device_partition`):
- static (legacy, bucketed, fixed): chunk = cdiv(seq_len, NUM_KV_SPLITS); every split
  writes a partial, an empty one with LSE -inf.
- device: chunk = whole tiles, active = non-empty chunks; programs at or beyond `active`
  exit at once, one active split writes `o` directly (on the Gluon stage 1, spread over
  `Stage1Config.column_splits` programs by value columns), and stage 2 merges only `active`.

Stage 2 of the device partition is a programmatic dependent launch on Hopper
(`MlaConfig.pdl`):
stage 1 triggers it at once, stage 2 reads seq_info while stage 1 runs and waits
(gdc_wait) before it reads a partial or writes `o`; with one active split it has nothing
to merge and exits without waiting.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

from mlatrace.reference import gluon_mla
from mlatrace.reference.kernel_config import (
    DEFAULT,
    PDL_MODES,
    SAFE_STAGES,
    SAFE_WARPS,
    MlaConfig,
    Stage1Config,
    Stage2Config,
)
from mlatrace.reference.layout import D_LATENT, D_ROPE
from mlatrace.reference.triton_partition import device_partition

# The configuration types live in kernel_config (no Triton import there); they are
# re-exported here so a caller tuning the kernels needs one import.
__all__ = ["DEFAULT", "MlaConfig", "Stage1Config", "Stage2Config", "stage1", "stage2"]


@triton.jit
def _mla_stage1_kernel(
    q_nope, q_pe, kv_c, k_pe, page_table, seq_info, sm_scale,
    o, lse_out, partial_out, partial_lse,
    stride_qn_b, stride_qn_h, stride_qp_b, stride_qp_h, stride_kv, stride_kpe, stride_pt_b,
    stride_o_b, stride_o_h, stride_po_b, stride_po_s, stride_po_h, stride_pl_b, stride_pl_s,
    nhead,
    NUM_KV_SPLITS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr,
    D_LATENT: tl.constexpr, D_ROPE: tl.constexpr, DEVICE_PARTITION: tl.constexpr,
    MIN_TILES: tl.constexpr, DIRECT_OUTPUT: tl.constexpr, RETURN_LSE: tl.constexpr, DOT_MODE: tl.constexpr,
    TILE_N: tl.constexpr = 64, PREFETCH: tl.constexpr = False, PDL: tl.constexpr = False,
    OFFSETS_32: tl.constexpr = False,
):
    """One (batch, split, head block): online softmax over the split's KV range.

    The partition works in BLOCK_N tiles (the policies' integers); the inner loop walks
    TILE_N rows at a time (TILE_N divides BLOCK_N). PREFETCH loads the next tile's
    page-table entries one iteration ahead, so the KV loads never wait on them. PDL lets
    stage 2 (launched as a programmatic dependent) start while this grid runs."""
    b = tl.program_id(0)
    split = tl.program_id(1)
    hblock = tl.program_id(2)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    heads = hblock * BLOCK_H + tl.arange(0, BLOCK_H)
    head_ok = heads < nhead
    offs_d = tl.arange(0, D_LATENT)
    offs_r = tl.arange(0, D_ROPE)
    # q does not depend on the length: its loads are in flight while seq_info arrives.
    qn = tl.load(q_nope + b * stride_qn_b + heads[:, None] * stride_qn_h + offs_d[None, :],
                 mask=head_ok[:, None], other=0.0)
    qp = tl.load(q_pe + b * stride_qp_b + heads[:, None] * stride_qp_h + offs_r[None, :],
                 mask=head_ok[:, None], other=0.0)
    seq_len = tl.load(seq_info + b)
    if DEVICE_PARTITION:
        active, chunk = device_partition(seq_len, NUM_KV_SPLITS, BLOCK_N, MIN_TILES)
    else:
        active = NUM_KV_SPLITS
        chunk = tl.cdiv(seq_len, NUM_KV_SPLITS)
    if split < active:
        start = split * chunk
        end = tl.minimum(start + chunk, seq_len)
        qk_scale = sm_scale * 1.4426950408889634  # scores in log2 units: exp2 below

        m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_H], tl.float32)
        acc = tl.zeros([BLOCK_H, D_LATENT], tl.float32)
        pt_row = page_table + b * stride_pt_b
        # Rows past `end` read row end-1 again (a written, finite row of this sequence):
        # their scores are set to -inf below, so they add nothing, and no load needs a
        # predicate (fewer instructions on stage 1's per-tile critical path).
        last = tl.maximum(end - 1, 0)
        if PREFETCH:
            next_slots = tl.load(pt_row + tl.minimum(start + tl.arange(0, TILE_N), last))
        for start_n in range(start, end, TILE_N):
            offs_n = start_n + tl.arange(0, TILE_N)
            row_ok = offs_n < end
            if PREFETCH:
                slots = next_slots
                next_slots = tl.load(pt_row + tl.minimum(offs_n + TILE_N, last))
            else:
                slots = tl.load(pt_row + tl.minimum(offs_n, last))
            if not OFFSETS_32:
                slots = slots.to(tl.int64)
            latent = tl.load(kv_c + slots[:, None] * stride_kv + offs_d[None, :])
            rope = tl.load(k_pe + slots[:, None] * stride_kpe + offs_r[None, :])
            if DOT_MODE == 1:
                latent = latent.to(tl.float32)
                qk = tl.dot(qn.to(tl.float32), tl.trans(latent), input_precision="ieee")
                qk += tl.dot(qp.to(tl.float32), tl.trans(rope.to(tl.float32)),
                             input_precision="ieee")
            elif DOT_MODE == 2:
                qk = tl.dot(qn, tl.trans(latent), input_precision="tf32x3")
                qk += tl.dot(qp, tl.trans(rope), input_precision="tf32x3")
            else:
                qk = tl.dot(qn, tl.trans(latent))
                qk += tl.dot(qp, tl.trans(rope))
            qk = tl.where(row_ok[None, :], qk * qk_scale, float("-inf"))
            m_i, l_i, acc = online_softmax_step(qk, latent, m_i, l_i, acc, DOT_MODE)

        nonempty = l_i > 0.0
        out = tl.where(nonempty[:, None], acc / tl.where(nonempty, l_i, 1.0)[:, None], 0.0)
        lse = tl.where(nonempty, (m_i + tl.log2(tl.where(nonempty, l_i, 1.0))) * 0.6931471805599453,
                       float("-inf"))
        if DIRECT_OUTPUT:
            write_o = True
        elif DEVICE_PARTITION:
            write_o = active == 1
        else:
            write_o = False
        if write_o:
            tl.store(o + b * stride_o_b + heads[:, None] * stride_o_h + offs_d[None, :],
                     out.to(o.dtype.element_ty), mask=head_ok[:, None])
            if RETURN_LSE:
                tl.store(lse_out + b * nhead + heads, lse, mask=head_ok)
        else:
            base = b * stride_po_b + split * stride_po_s
            tl.store(partial_out + base + heads[:, None] * stride_po_h + offs_d[None, :], out,
                     mask=head_ok[:, None])
            tl.store(partial_lse + b * stride_pl_b + split * stride_pl_s + heads, lse,
                     mask=head_ok)


@triton.jit
def _mla_stage2_kernel(
    partial_out, partial_lse, seq_info, o, lse_out,
    stride_po_b, stride_po_s, stride_po_h, stride_pl_b, stride_pl_s, stride_o_b, stride_o_h,
    nhead,
    NUM_KV_SPLITS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_S: tl.constexpr,
    BLOCK_DV: tl.constexpr, DEVICE_PARTITION: tl.constexpr, MIN_TILES: tl.constexpr,
    RETURN_LSE: tl.constexpr, PDL: tl.constexpr = False, SMALL_S: tl.constexpr = 0,
    MID_S: tl.constexpr = 0, ONE_SPLIT_NO_WAIT: tl.constexpr = False,
):
    """One (batch, head, column block): online LSE-weighted merge, BLOCK_S splits per load
    (all of them when BLOCK_S >= splits: one round trip to memory). When at most SMALL_S
    (else MID_S) splits are active, a runtime branch loads that many instead: the device
    partition launches BLOCK_S = 256 splits' worth and a short sequence uses a few.

    With PDL this grid is a programmatic dependent of stage 1: it may start while stage 1
    runs, reads seq_info (which stage 1 never writes) meanwhile, and waits for stage 1's
    completion and memory (gdc_wait) before touching the partials or `o`. With one active
    split it touches neither, so it exits without waiting (ONE_SPLIT_NO_WAIT)."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    dblock = tl.program_id(2)
    if DEVICE_PARTITION:
        seq_len = tl.load(seq_info + b)
        active, _ = device_partition(seq_len, NUM_KV_SPLITS, BLOCK_N, MIN_TILES)
    else:
        active = NUM_KV_SPLITS
    if PDL:
        if ONE_SPLIT_NO_WAIT:
            if active > 1:
                tl.extra.cuda.gdc_wait()
        else:
            tl.extra.cuda.gdc_wait()
    # With one active split stage 1 already wrote o (device partition only).
    if active > 1:
        # Few active splits (short sequences under the device partition): a narrow tile.
        if SMALL_S > 0 and active <= SMALL_S:
            _merge_head(partial_out, partial_lse, o, lse_out, b, h, dblock, active,
                        stride_po_b, stride_po_s, stride_po_h, stride_pl_b, stride_pl_s,
                        stride_o_b, stride_o_h, nhead, SMALL_S, BLOCK_DV, RETURN_LSE)
        elif MID_S > 0 and active <= MID_S:
            _merge_head(partial_out, partial_lse, o, lse_out, b, h, dblock, active,
                        stride_po_b, stride_po_s, stride_po_h, stride_pl_b, stride_pl_s,
                        stride_o_b, stride_o_h, nhead, MID_S, BLOCK_DV, RETURN_LSE)
        else:
            _merge_head(partial_out, partial_lse, o, lse_out, b, h, dblock, active,
                        stride_po_b, stride_po_s, stride_po_h, stride_pl_b, stride_pl_s,
                        stride_o_b, stride_o_h, nhead, BLOCK_S, BLOCK_DV, RETURN_LSE)


@triton.jit
def online_softmax_step(qk, values, m_i, l_i, acc, DOT_MODE: tl.constexpr):
    """Fold one tile into a running softmax: `qk` holds the tile's scaled (log2) scores,
    -inf where masked; `values` its rows (float32 already in DOT_MODE 1). Returns the new
    (max, sum, accumulator): one home for the update both decode kernels make per tile."""
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(qk - m_new[:, None])
    l_new = l_i * alpha + tl.sum(p, 1)
    if DOT_MODE == 1:
        pv = tl.dot(p, values, input_precision="ieee")
    elif DOT_MODE == 2:
        pv = tl.dot(p, values, input_precision="tf32x3")
    else:
        pv = tl.dot(p.to(values.dtype), values)
    return m_new, l_new, acc * alpha[:, None] + pv


@triton.jit
def _merge_head(partial_out, partial_lse, o, lse_out, b, h, dblock, active,
                stride_po_b, stride_po_s, stride_po_h, stride_pl_b, stride_pl_s,
                stride_o_b, stride_o_h, nhead, BLOCK_S: tl.constexpr, BLOCK_DV: tl.constexpr,
                RETURN_LSE: tl.constexpr):
    """Merge `active` splits of one (batch, head, column block), BLOCK_S splits per load."""
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = dblock * BLOCK_DV + tl.arange(0, BLOCK_DV)
    lse_base = partial_lse + b * stride_pl_b + h
    out_base = partial_out + b * stride_po_b + h * stride_po_h
    top = float("-inf")
    total = 0.0
    acc = tl.zeros([BLOCK_DV], tl.float32)
    for s0 in range(0, active, BLOCK_S):
        split_ok = s0 + offs_s < active
        lse = tl.load(lse_base + (s0 + offs_s) * stride_pl_s, mask=split_ok,
                      other=float("-inf"))
        part = tl.load(out_base + (s0 + offs_s)[:, None] * stride_po_s + offs_d[None, :],
                       mask=split_ok[:, None], other=0.0)
        new_top = tl.maximum(top, tl.max(lse, 0))
        safe_top = tl.where(new_top > float("-inf"), new_top, 0.0)
        rescale = tl.where(top > float("-inf"), tl.exp(top - safe_top), 0.0)
        weight = tl.where(lse > float("-inf"), tl.exp(lse - safe_top), 0.0)
        acc = acc * rescale + tl.sum(weight[:, None] * part, 0)
        total = total * rescale + tl.sum(weight, 0)
        top = new_top
    merged = tl.where(total > 0.0, acc / tl.where(total > 0.0, total, 1.0), 0.0)
    tl.store(o + b * stride_o_b + h * stride_o_h + offs_d, merged.to(o.dtype.element_ty))
    if RETURN_LSE:
        if dblock == 0:
            lse_all = tl.where(total > 0.0, top + tl.log(tl.where(total > 0.0, total, 1.0)),
                               float("-inf"))
            tl.store(lse_out + b * nhead + h, lse_all)


def dot_mode(cache: torch.Tensor) -> int:
    """0: native dot (bf16/fp16 operands on the GPU); 1: float32 'ieee' products (the CPU
    interpreter, whose bf16 tl.dot is wrong); 2: 'tf32x3' for float32 caches on the GPU
    (near-fp32 accuracy on the tensor cores; 'ieee' there spills the [16, 512] tiles)."""
    if not cache.is_cuda:
        return 1
    return 2 if cache.dtype == torch.float32 else 0


def pdl_enabled(like: torch.Tensor, device_partition: bool, mode: str = DEFAULT.pdl) -> bool:
    """Programmatic dependent launch of stage 2 (`MlaConfig.pdl`), on NVIDIA devices of
    compute capability >= 9 only (ROCm reports gfx9 parts as capability 9 too: never there)."""
    assert mode in PDL_MODES, mode
    wanted = mode == "all" or (mode == "device" and device_partition)
    return (wanted and like.is_cuda and torch.version.hip is None
            and torch.cuda.get_device_capability(like.device)[0] >= 9)


def column_splits(num_splits: int, most: int = DEFAULT.stage1.column_splits) -> int:
    """Programs sharing a one-tile sequence's value columns (`Stage1Config.column_splits`):
    the largest power of 2 within both `most` and the launch's splits."""
    n = 1
    while n * 2 <= min(most, num_splits):
        n *= 2
    return n


def offsets_fit_int32(*caches: torch.Tensor) -> bool:
    """Whether every element offset of these row-major caches fits in int32."""
    return all(c.shape[0] * c.stride(0) + c.shape[1] < 2**31 - 1 for c in caches)


def stage1(grid: tuple[int, int, int], *, q_nope: torch.Tensor, q_pe: torch.Tensor,
           kv_c: torch.Tensor, k_pe: torch.Tensor, page_table: torch.Tensor,
           seq_info: torch.Tensor, sm_scale: float, o: torch.Tensor,
           lse_out: torch.Tensor | None, partial_out: torch.Tensor | None,
           partial_lse: torch.Tensor | None, num_splits: int, block_n: int,
           device_partition: bool, min_tiles: int, block_h: int,
           config: MlaConfig = DEFAULT) -> None:
    """Launch stage 1 on grid (batch, NUM_KV_SPLITS, cdiv(nhead, BLOCK_H)) as `config` says."""
    cfg = config.stage1
    for t in (q_nope, q_pe, o):
        assert t.stride(-1) == 1, "last dim must be contiguous"
    assert kv_c.stride(-1) == 1 and k_pe.stride(-1) == 1 and page_table.stride(-1) == 1
    direct = partial_out is None
    if direct:
        partial_out, partial_lse = o, o  # never written: DIRECT_OUTPUT
    ppo, ppl = (partial_out.stride(), partial_lse.stride()) if not direct else ((0, 0, 0, 0),
                                                                               (0, 0, 0))
    lse_arg = lse_out if lse_out is not None else o
    mode = dot_mode(kv_c)
    tile_n = min(cfg.tile_n, block_n) if mode != 2 else block_n

    # Arguments both stage-1 kernels take (the Gluon one has fewer constexprs).
    args = (q_nope, q_pe, kv_c, k_pe, page_table, seq_info, float(sm_scale),
            o, lse_arg, partial_out, partial_lse,
            q_nope.stride(0), q_nope.stride(1), q_pe.stride(0), q_pe.stride(1),
            kv_c.stride(0), k_pe.stride(0), page_table.stride(0),
            o.stride(0), o.stride(1), ppo[0], ppo[1], ppo[2], ppl[0], ppl[1],
            q_nope.shape[1])
    common = dict(NUM_KV_SPLITS=num_splits, BLOCK_N=block_n,
                  DEVICE_PARTITION=device_partition, MIN_TILES=min_tiles,
                  DIRECT_OUTPUT=direct, RETURN_LSE=lse_out is not None,
                  PDL=pdl_enabled(kv_c, device_partition, config.pdl) and not direct)

    def launch(num_warps: int, num_stages: int) -> None:
        _mla_stage1_kernel[grid](
            *args, **common, BLOCK_H=block_h, D_LATENT=D_LATENT, D_ROPE=D_ROPE,
            DOT_MODE=mode, TILE_N=tile_n, PREFETCH=cfg.prefetch and mode != 2,
            OFFSETS_32=cfg.offsets_32 and offsets_fit_int32(kv_c, k_pe),
            num_warps=num_warps, num_stages=num_stages,
        )

    if mode == 2:
        launch(SAFE_WARPS, SAFE_STAGES)
        return
    # The Gluon kernel's row offsets are 32-bit: larger caches take the Triton kernel.
    if (cfg.gluon and block_h == 16 and gluon_mla.available(kv_c)
            and offsets_fit_int32(kv_c, k_pe)):
        gluon_mla._mla_stage1_wgmma_kernel[grid](
            *args, **common,
            COL_SPLITS=column_splits(num_splits, cfg.column_splits) if device_partition else 1,
            num_warps=gluon_mla.NUM_WARPS)
        return
    try:
        launch(cfg.num_warps, cfg.num_stages)
    except OutOfResources:
        if not cfg.fallback:
            raise
        launch(SAFE_WARPS, SAFE_STAGES)


def stage2(grid: tuple[int, int, int], *, partial_out: torch.Tensor,
           partial_lse: torch.Tensor, seq_info: torch.Tensor, o: torch.Tensor,
           lse_out: torch.Tensor | None, num_splits: int, block_n: int,
           device_partition: bool, min_tiles: int, block_s: int, block_dv: int,
           config: MlaConfig = DEFAULT) -> None:
    """Launch stage 2 on grid (batch, nhead, 512 // BLOCK_DV) as `config` says."""
    assert o.stride(-1) == 1 and partial_out.stride(-1) == 1
    cfg = config.stage2
    pdl = pdl_enabled(partial_out, device_partition, config.pdl)
    _mla_stage2_kernel[grid](
        partial_out, partial_lse, seq_info, o, lse_out if lse_out is not None else o,
        partial_out.stride(0), partial_out.stride(1), partial_out.stride(2),
        partial_lse.stride(0), partial_lse.stride(1), o.stride(0), o.stride(1),
        o.shape[1],
        NUM_KV_SPLITS=num_splits, BLOCK_N=block_n, BLOCK_S=block_s, BLOCK_DV=block_dv,
        DEVICE_PARTITION=device_partition, MIN_TILES=min_tiles,
        RETURN_LSE=lse_out is not None, PDL=pdl,
        ONE_SPLIT_NO_WAIT=cfg.one_split_no_wait and device_partition,
        SMALL_S=cfg.small_s if cfg.small_s < block_s else 0,
        MID_S=cfg.mid_s if cfg.mid_s < block_s else 0, num_warps=cfg.num_warps,
        **({"launch_pdl": True} if pdl else {}),
    )
