"""PA-v1-style paged GQA decode with AITER's capture-at-max-sequence-length contract.

`paged_attention_v1` follows vLLM's `_custom_ops.paged_attention_v1` argument names. The
launch is sized on the host from `max_seq_len`: every program walks at most
cdiv(max_seq_len, block_size) KV blocks, and each sequence stops early at its device
`seq_lens`. A CUDA graph captured at length L therefore replays correctly for sequences
up to L and silently drops every token past L when replayed longer (seed 000): the
caller must capture at the maximum length. The `reference` probe pack records each call
as `attn.call{op: paged_attention_v1, hints{max_seq_len}}`.

Layout (simplified from vLLM's vectorised key layout): query [num_seqs, num_heads,
head_size], key_cache and value_cache [num_blocks, num_kv_heads, block_size, head_size],
block_tables [num_seqs, max_num_blocks_per_seq] int32, seq_lens [num_seqs] int32 on the
device, out like query.
"""

from __future__ import annotations

import torch

from mlatrace.reference import graph
from mlatrace.reference.mla import resolve_backend
from mlatrace.reference.policies import cdiv

PA_KERNEL_NAME = "_paged_attention_v1_kernel"


def paged_attention_v1(out: torch.Tensor, query: torch.Tensor, key_cache: torch.Tensor,
                       value_cache: torch.Tensor, num_kv_heads: int, scale: float,
                       block_tables: torch.Tensor, seq_lens: torch.Tensor, block_size: int,
                       max_seq_len: int, alibi_slopes: torch.Tensor | None = None,
                       kv_cache_dtype: str = "auto", k_scale: float = 1.0,
                       v_scale: float = 1.0, *, backend: str = "auto") -> torch.Tensor:
    """Decode attention into `out`; reads at most cdiv(max_seq_len, block_size) blocks per sequence."""
    if alibi_slopes is not None or kv_cache_dtype != "auto":
        raise ValueError("reference PA v1 supports neither ALiBi nor an fp8 KV cache "
                         "(alibi_slopes=None, kv_cache_dtype='auto' only)")
    num_seqs, num_heads, head_size = query.shape
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    if tuple(key_cache.shape[1:]) != (num_kv_heads, block_size, head_size):
        raise ValueError(f"key_cache must be [num_blocks, {num_kv_heads}, {block_size}, "
                         f"{head_size}], got {tuple(key_cache.shape)}")
    # The host-side decision a graph freezes: how many KV blocks each program may walk.
    max_num_blocks = min(cdiv(max_seq_len, block_size), block_tables.shape[1])
    if resolve_backend(backend, query) == "triton":
        from mlatrace.reference import triton_pa

        graph.launch(triton_pa.paged_attention, out, query, key_cache, value_cache, num_kv_heads,
                                  scale * k_scale, block_tables, seq_lens, block_size,
                                  max_num_blocks, v_scale)
        return out
    graph.launch(_paged_attention_torch, out, query, key_cache, value_cache, num_kv_heads, scale * k_scale,
                           block_tables, seq_lens, block_size, max_num_blocks, v_scale)
    return out


def _paged_attention_torch(out: torch.Tensor, query: torch.Tensor, key_cache: torch.Tensor,
                           value_cache: torch.Tensor, num_kv_heads: int, scale: float,
                           block_tables: torch.Tensor, seq_lens: torch.Tensor,
                           block_size: int, max_num_blocks: int, v_scale: float) -> None:
    """Masked softmax over the first `max_num_blocks` blocks; no host sync (capturable)."""
    num_seqs, num_heads, head_size = query.shape
    group = num_heads // num_kv_heads
    width = max(1, max_num_blocks) * block_size
    tables = block_tables[:, :max(1, max_num_blocks)].to(torch.int64)
    keys = key_cache[tables].float()            # [s, nb, kvh, bs, d]
    values = value_cache[tables].float()
    keys = keys.permute(0, 2, 1, 3, 4).reshape(num_seqs, num_kv_heads, width, head_size)
    values = values.permute(0, 2, 1, 3, 4).reshape(num_seqs, num_kv_heads, width, head_size)
    q = query.float().reshape(num_seqs, num_kv_heads, group, head_size)
    scores = torch.einsum("skgd,sktd->skgt", q, keys) * scale
    limit = torch.clamp(seq_lens.to(torch.int64), max=max_num_blocks * block_size)
    valid = torch.arange(width, device=query.device)[None, :] < limit[:, None]      # [s, t]
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    top = scores.amax(dim=-1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    p = torch.exp(scores - top)
    denom = p.sum(dim=-1, keepdim=True)
    result = torch.einsum("skgt,sktd->skgd", p, values) * v_scale
    result = torch.where(denom > 0, result / denom.clamp(min=1e-30), torch.zeros_like(result))
    out.copy_(result.reshape(num_seqs, num_heads, head_size))


def paged_attention_reference(query: torch.Tensor, key_cache: torch.Tensor,
                              value_cache: torch.Tensor, num_kv_heads: int, scale: float,
                              block_tables: torch.Tensor, seq_lens: list[int],
                              block_size: int) -> torch.Tensor:
    """Naive float64 GQA decode over each sequence's full length (no capture contract)."""
    num_seqs, num_heads, head_size = query.shape
    group = num_heads // num_kv_heads
    out = torch.zeros(num_seqs, num_heads, head_size, dtype=torch.float64, device=query.device)
    for s, length in enumerate(seq_lens):
        if length == 0:
            continue
        tokens = torch.arange(length, device=query.device)
        blocks = block_tables[s, tokens // block_size].long()
        offsets = tokens % block_size
        for h in range(num_heads):
            kvh = h // group
            k = key_cache[blocks, kvh, offsets].double()
            v = value_cache[blocks, kvh, offsets].double()
            weights = torch.softmax(k @ query[s, h].double() * scale, dim=0)
            out[s, h] = weights @ v
    return out
