"""AITER-style two-stage split-KV MLA decode (`mla_gluon`), in torch and Triton.

Layout (AITER's 2-D view, page size 1): q_nope [batch, nhead, 512], q_pe [batch, nhead, 64],
kv_c [num_slots, 576] (512 latent + 64 rope per row; the value is the latent part),
o [batch, nhead, 512] written in place, page_table [batch, max_pages] int32 (slot of each
token), seq_info [batch] int32 on the device (the runtime KV lengths).

The host chooses NUM_KV_SPLITS from host arguments only (`policies.num_kv_splits`); the
kernels read the real lengths from `seq_info` on the device. That split is what a CUDA
graph freezes: captured with `min_kv_seq_len=1`, the legacy policy launches one stage-1
program per (batch, head block) forever after, correct but slow at 100K (seed 002).

Stage 1, grid (batch, NUM_KV_SPLITS, head blocks): online softmax over the split's KV
range, writing a partial output and its log-sum-exp. Stage 2, grid (batch, nhead,
512 // BLOCK_DV): merges the splits weighted by their LSE. With one split, stage 1 writes
`o` directly and stage 2 is skipped (`skip_stage2`), as AITER does.

`launch_stage1`, `launch_stage2` and `skip_stage2` are the host-side launches the
`reference` probe pack records (grid as a 3-tuple, constexprs as upper-case keywords):
keep their names and keyword arguments stable.
"""

from __future__ import annotations

import math

import torch

from mlatrace.reference import graph, policies
from mlatrace.reference.kernel_config import DEFAULT, MlaConfig

# KV_ROW is imported from here by callers that predate layout.py (whatif).
from mlatrace.reference.layout import D_LATENT, D_ROPE, KV_ROW  # noqa: F401
from mlatrace.reference.policies import BLOCK_N, HEAD_BLOCK

STAGE1_NAME = "_mla_stage1_kernel"
STAGE2_NAME = "_mla_stage2_kernel"
BACKENDS = ("auto", "torch", "triton")


def mla_gluon(q_nope: torch.Tensor, q_pe: torch.Tensor, kv_c: torch.Tensor, o: torch.Tensor,
              page_table: torch.Tensor, seq_info: torch.Tensor, sm_scale: float, *,
              k_pe: torch.Tensor | None = None, kv_pe_offset: int = D_LATENT,
              min_kv_seq_len: int = 1, policy: str = "legacy", return_lse: bool = False,
              backend: str = "auto", config: MlaConfig | None = None,
              ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """MLA decode attention into `o`; returns (o, lse [batch, nhead] fp32 or None).

    Capturable in a CUDA graph: no host sync, no read of `seq_info` on the host.
    `min_kv_seq_len` is only a host hint for the split policy. `config` (a frozen
    `kernel_config.MlaConfig`, default `kernel_config.DEFAULT`) sets the kernels'
    meta-parameters and the device policy's launch budget.
    """
    config = DEFAULT if config is None else config
    batch, nhead, d_latent = q_nope.shape
    if d_latent != D_LATENT or tuple(q_pe.shape) != (batch, nhead, D_ROPE):
        raise ValueError(f"expected q_nope [b, h, {D_LATENT}] and q_pe [b, h, {D_ROPE}], "
                         f"got {tuple(q_nope.shape)} and {tuple(q_pe.shape)}")
    if tuple(o.shape) != (batch, nhead, D_LATENT):
        raise ValueError(f"o must be [{batch}, {nhead}, {D_LATENT}], got {tuple(o.shape)}")
    if kv_c.dim() != 2 or kv_c.shape[1] < D_LATENT:
        raise ValueError(f"kv_c must be [num_slots, >= {D_LATENT}], got {tuple(kv_c.shape)}")
    if k_pe is None:
        k_pe = kv_c[:, kv_pe_offset:kv_pe_offset + D_ROPE]
    if k_pe.shape[-1] != D_ROPE:
        raise ValueError(f"k_pe must have {D_ROPE} columns (kv_pe_offset={kv_pe_offset})")
    if page_table.dim() != 2 or page_table.shape[0] != batch or seq_info.shape[0] != batch:
        raise ValueError("page_table must be [batch, max_pages] and seq_info [batch]")
    backend = resolve_backend(backend, q_nope)

    qlen = 1
    num_splits = policies.num_kv_splits(policy, batch, qlen, nhead, min_kv_seq_len, BLOCK_N,
                                        device_budget=config.device_budget)
    device_partition = policies.uses_device_partition(policy)
    min_tiles = config.min_tiles
    lse_out = torch.empty(batch, nhead, dtype=torch.float32, device=o.device) if return_lse else None
    stage1_grid = (batch, num_splits, policies.head_blocks(nhead))
    common = dict(q_nope=q_nope, q_pe=q_pe, kv_c=kv_c, k_pe=k_pe, page_table=page_table,
                  seq_info=seq_info, sm_scale=sm_scale, o=o, lse_out=lse_out)
    if num_splits == 1:
        launch_stage1(STAGE1_NAME, stage1_grid, **common, partial_out=None, partial_lse=None,
                      NUM_KV_SPLITS=1, BLOCK_N=BLOCK_N, BLOCK_H=HEAD_BLOCK,
                      DEVICE_PARTITION=device_partition, MIN_TILES_PER_SPLIT=min_tiles,
                      backend=backend, config=config)
        skip_stage2(STAGE2_NAME, reason="num_kv_splits_is_1")
        return o, lse_out

    partial_out = torch.empty(batch, num_splits, nhead, D_LATENT, dtype=torch.float32,
                              device=o.device)
    partial_lse = torch.empty(batch, num_splits, nhead, dtype=torch.float32, device=o.device)
    launch_stage1(STAGE1_NAME, stage1_grid, **common, partial_out=partial_out,
                  partial_lse=partial_lse, NUM_KV_SPLITS=num_splits, BLOCK_N=BLOCK_N,
                  BLOCK_H=HEAD_BLOCK, DEVICE_PARTITION=device_partition,
                  MIN_TILES_PER_SPLIT=min_tiles, backend=backend, config=config)
    block_dv = config.stage2.block_dv
    stage2_grid = (batch, nhead, D_LATENT // block_dv)
    launch_stage2(STAGE2_NAME, stage2_grid, partial_out=partial_out, partial_lse=partial_lse,
                  seq_info=seq_info, o=o, lse_out=lse_out, NUM_KV_SPLITS=num_splits,
                  BLOCK_N=BLOCK_N, BLOCK_S=stage2_block_s(num_splits, config.stage2.max_block_s),
                  BLOCK_DV=block_dv, DEVICE_PARTITION=device_partition,
                  MIN_TILES_PER_SPLIT=min_tiles, backend=backend, config=config)
    return o, lse_out


def stage2_block_s(num_splits: int, max_block_s: int = DEFAULT.stage2.max_block_s) -> int:
    """Splits per stage-2 load: the next power of 2 of `num_splits`, at most `max_block_s`."""
    block = 1
    while block < min(num_splits, max_block_s):
        block *= 2
    return block


def resolve_backend(backend: str, like: torch.Tensor) -> str:
    """'auto' is Triton on CUDA and torch elsewhere."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected one of {BACKENDS}")
    if backend == "auto":
        return "triton" if like.is_cuda else "torch"
    return backend


def launch_stage1(name: str, grid: tuple[int, int, int], *, q_nope: torch.Tensor,
                  q_pe: torch.Tensor, kv_c: torch.Tensor, k_pe: torch.Tensor,
                  page_table: torch.Tensor, seq_info: torch.Tensor, sm_scale: float,
                  o: torch.Tensor, lse_out: torch.Tensor | None,
                  partial_out: torch.Tensor | None, partial_lse: torch.Tensor | None,
                  NUM_KV_SPLITS: int, BLOCK_N: int, BLOCK_H: int, DEVICE_PARTITION: bool,
                  MIN_TILES_PER_SPLIT: int, backend: str,
                  config: MlaConfig = DEFAULT) -> None:
    """Stage 1 over `grid` = (batch, NUM_KV_SPLITS, head blocks); partials=None writes `o`.

    The device work goes through `graph.launch`, so a reference HostGraph capture on CPU
    records it with these host decisions frozen, as a CUDA graph does.
    """
    args = dict(q_nope=q_nope, q_pe=q_pe, kv_c=kv_c, k_pe=k_pe, page_table=page_table,
                seq_info=seq_info, sm_scale=sm_scale, o=o, lse_out=lse_out,
                partial_out=partial_out, partial_lse=partial_lse, num_splits=NUM_KV_SPLITS,
                block_n=BLOCK_N, device_partition=DEVICE_PARTITION,
                min_tiles=MIN_TILES_PER_SPLIT)
    if backend == "triton":
        from mlatrace.reference import triton_mla

        graph.launch(triton_mla.stage1, grid, **args, block_h=BLOCK_H, config=config)
    else:
        graph.launch(stage1_torch, **args)


def launch_stage2(name: str, grid: tuple[int, int, int], *, partial_out: torch.Tensor,
                  partial_lse: torch.Tensor, seq_info: torch.Tensor, o: torch.Tensor,
                  lse_out: torch.Tensor | None, NUM_KV_SPLITS: int, BLOCK_N: int, BLOCK_S: int,
                  BLOCK_DV: int, DEVICE_PARTITION: bool, MIN_TILES_PER_SPLIT: int,
                  backend: str, config: MlaConfig = DEFAULT) -> None:
    """Stage 2 over `grid` = (batch, nhead, 512 // BLOCK_DV): LSE-weighted merge of splits."""
    args = dict(partial_out=partial_out, partial_lse=partial_lse, seq_info=seq_info, o=o,
                lse_out=lse_out, num_splits=NUM_KV_SPLITS, block_n=BLOCK_N,
                device_partition=DEVICE_PARTITION, min_tiles=MIN_TILES_PER_SPLIT)
    if backend == "triton":
        from mlatrace.reference import triton_mla

        graph.launch(triton_mla.stage2, grid, **args, block_s=BLOCK_S, block_dv=BLOCK_DV,
                     config=config)
    else:
        graph.launch(stage2_torch, **args)


def skip_stage2(name: str, reason: str) -> None:
    """Marks that no stage-2 launch exists (one split); the probe records `kernel.skip`."""
    del name, reason


# ----------------------------------------------------------------------------------------
# torch stages: the same partition and merge as the Triton kernels, vectorised over splits
# with tensor ops on `seq_info` (no .item(), so they also run inside a CUDA graph).
# ----------------------------------------------------------------------------------------


def split_bounds(seq_len: torch.Tensor, num_splits: int, block_n: int,
                 device_partition: bool, min_tiles: int = 1,
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-sequence (chunk, active splits, seq_len) as int64 tensors, computed on the device.

    Mirrors `policies.kv_split_range` (static chunk = cdiv(len, splits)) and
    `policies.device_partition` (whole tiles, active = non-empty chunks).
    """
    seq_len = seq_len.to(torch.int64)
    if not device_partition:
        chunk = (seq_len + num_splits - 1) // num_splits
        return chunk, torch.full_like(seq_len, num_splits), seq_len
    tiles = ((seq_len + block_n - 1) // block_n).clamp(min=1)
    tiles_per_split = (tiles + tiles.clamp(max=num_splits) - 1) // tiles.clamp(max=num_splits)
    tiles_per_split = tiles_per_split.clamp(min=min_tiles)
    active = (tiles + tiles_per_split - 1) // tiles_per_split
    return tiles_per_split * block_n, active, seq_len


def used_splits(seq_info: torch.Tensor, num_splits: int, block_n: int, device_partition: bool,
                min_tiles: int = 1) -> int:
    """Splits the torch stages compute: all on CUDA (no host read of seq_info), on the CPU
    only up to the longest sequence's non-empty ones (the rest are empty: LSE -inf)."""
    if seq_info.is_cuda:
        return num_splits
    lengths = [int(n) for n in seq_info.tolist()]
    return max([nonempty_splits(n, num_splits, block_n, device_partition, min_tiles)
                for n in lengths] + [1])


def nonempty_splits(seq_len: int, num_splits: int, block_n: int, device_partition: bool,
                    min_tiles: int = 1) -> int:
    """How many splits own at least one KV position (host integers)."""
    if device_partition:
        return policies.device_partition(seq_len, num_splits, block_n, min_tiles)[0]
    return policies.cdiv(seq_len, policies.cdiv(seq_len, num_splits)) if seq_len else 0


def max_chunk(max_pages: int, num_splits: int, block_n: int, device_partition: bool,
              min_tiles: int = 1) -> int:
    """Host upper bound on any split's length for sequences of at most `max_pages` tokens."""
    if not device_partition:
        return max(1, policies.cdiv(max_pages, num_splits))
    tiles = max(1, policies.cdiv(policies.cdiv(max_pages, block_n), num_splits), min_tiles)
    return tiles * block_n


def stage1_torch(*, q_nope: torch.Tensor, q_pe: torch.Tensor, kv_c: torch.Tensor,
                 k_pe: torch.Tensor, page_table: torch.Tensor, seq_info: torch.Tensor,
                 sm_scale: float, o: torch.Tensor, lse_out: torch.Tensor | None,
                 partial_out: torch.Tensor | None, partial_lse: torch.Tensor | None,
                 num_splits: int, block_n: int, device_partition: bool,
                 min_tiles: int) -> None:
    """Every split's softmax-weighted latent sum and LSE at once, in float32."""
    batch, nhead, _ = q_nope.shape
    dev = q_nope.device
    chunk, active, seq_len = split_bounds(seq_info, num_splits, block_n, device_partition,
                                          min_tiles)
    width = max_chunk(page_table.shape[1], num_splits, block_n, device_partition, min_tiles)
    used = used_splits(seq_info, num_splits, block_n, device_partition, min_tiles)
    if not seq_info.is_cuda:
        # A CPU "kernel" may read its own inputs: trim the padding, same result, less work.
        longest = max([int(n) for n in seq_info.tolist()] + [0])
        width = min(width, max_chunk(longest, num_splits, block_n, device_partition, min_tiles))
    split_ids = torch.arange(used, device=dev)
    offs = torch.arange(width, device=dev)
    # pos[b, s, c]: the KV position of column c in split s; valid inside the split's range.
    start = split_ids[None, :] * chunk[:, None]
    pos = start[:, :, None] + offs[None, None, :]
    end = torch.minimum(start + chunk[:, None], seq_len[:, None])
    valid = (pos < end[:, :, None]) & (split_ids[None, :, None] < active[:, None, None])
    pos = pos.clamp(max=page_table.shape[1] - 1)
    slots = torch.gather(page_table.to(torch.int64), 1, pos.reshape(batch, -1))
    slots = slots.clamp(0, kv_c.shape[0] - 1).reshape(batch, used, width)
    latent = kv_c[:, :D_LATENT][slots].float()              # [b, s, c, 512]
    rope = k_pe[slots].float()                                # [b, s, c, 64]
    scores = (torch.einsum("bhd,bscd->bshc", q_nope.float(), latent)
              + torch.einsum("bhd,bscd->bshc", q_pe.float(), rope)) * sm_scale
    scores = scores.masked_fill(~valid[:, :, None, :], float("-inf"))
    row_max = scores.amax(dim=-1)                             # [b, s, h]
    safe_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    p = torch.exp(scores - safe_max[..., None])               # exp(-inf) = 0 where masked
    denom = p.sum(dim=-1)
    part = torch.einsum("bshc,bscd->bshd", p, latent)
    nonempty = denom > 0
    part = torch.where(nonempty[..., None], part / denom.clamp(min=1e-30)[..., None],
                       torch.zeros_like(part))
    part_lse = torch.where(nonempty, safe_max + torch.log(denom.clamp(min=1e-30)),
                           torch.full_like(denom, float("-inf")))
    if partial_out is None:
        o.copy_(part[:, 0])
        if lse_out is not None:
            lse_out.copy_(part_lse[:, 0])
        return
    partial_out[:, :used].copy_(part)
    partial_lse[:, :used].copy_(part_lse)
    if device_partition:
        # One active split: stage 1 owns the output and stage 2 leaves it alone.
        single = (active == 1)[:, None]
        o.copy_(torch.where(single[..., None], part[:, 0], o.float()))
        if lse_out is not None:
            lse_out.copy_(torch.where(single, part_lse[:, 0], lse_out))


def stage2_torch(*, partial_out: torch.Tensor, partial_lse: torch.Tensor,
                 seq_info: torch.Tensor, o: torch.Tensor, lse_out: torch.Tensor | None,
                 num_splits: int, block_n: int, device_partition: bool,
                 min_tiles: int) -> None:
    """LSE-weighted merge of the (active) splits into `o`.

    Reads only the splits stage 1 wrote (`used_splits`); splits past a sequence's active
    count get weight 0 and finite partials (torch stage 1 writes every used split).
    """
    _, active, _ = split_bounds(seq_info, num_splits, block_n, device_partition, min_tiles)
    used = used_splits(seq_info, num_splits, block_n, device_partition, min_tiles)
    partial_out, partial_lse = partial_out[:, :used], partial_lse[:, :used]
    in_use = torch.arange(used, device=o.device)[None, :] < active[:, None]         # [b, s]
    lse = partial_lse.masked_fill(~in_use[:, :, None], float("-inf"))
    top = lse.amax(dim=1)                                                           # [b, h]
    safe_top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    weight = torch.exp(lse - safe_top[:, None, :])                                  # [b, s, h]
    total = weight.sum(dim=1)
    merged = torch.einsum("bsh,bshd->bhd", weight, partial_out)
    merged = torch.where(total[..., None] > 0, merged / total.clamp(min=1e-30)[..., None],
                         torch.zeros_like(merged))
    merged_lse = torch.where(total > 0, safe_top + torch.log(total.clamp(min=1e-30)),
                             torch.full_like(total, float("-inf")))
    if device_partition:
        multi = (active > 1)[:, None]
        o.copy_(torch.where(multi[..., None], merged, o.float()))
        if lse_out is not None:
            lse_out.copy_(torch.where(multi, merged_lse, lse_out))
        return
    o.copy_(merged)
    if lse_out is not None:
        lse_out.copy_(merged_lse)


# ----------------------------------------------------------------------------------------
# float64 naive reference (tests, GPU check): reads lengths on the host, never captured.
# ----------------------------------------------------------------------------------------


def mla_reference(q_nope: torch.Tensor, q_pe: torch.Tensor, kv_c: torch.Tensor,
                  page_table: torch.Tensor, seq_lens: list[int], sm_scale: float, *,
                  k_pe: torch.Tensor | None = None, kv_pe_offset: int = D_LATENT,
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Naive float64 MLA decode: (o [b, h, 512], lse [b, h]); empty sequences give 0, -inf."""
    if k_pe is None:
        k_pe = kv_c[:, kv_pe_offset:kv_pe_offset + D_ROPE]
    batch, nhead, _ = q_nope.shape
    out = torch.zeros(batch, nhead, D_LATENT, dtype=torch.float64, device=q_nope.device)
    lse = torch.full((batch, nhead), -math.inf, dtype=torch.float64, device=q_nope.device)
    for b, length in enumerate(seq_lens):
        if length == 0:
            continue
        slots = page_table[b, :length].long()
        latent = kv_c[slots, :D_LATENT].double()
        rope = k_pe[slots].double()
        scores = (q_nope[b].double() @ latent.T + q_pe[b].double() @ rope.T) * sm_scale
        lse[b] = torch.logsumexp(scores, dim=-1)
        out[b] = torch.softmax(scores, dim=-1) @ latent
    return out, lse
