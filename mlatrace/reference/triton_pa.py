"""Triton kernel of the reference PA-v1 decode: one program per (sequence, KV head).

Each program walks min(cdiv(seq_len, BLOCK_SIZE), max_num_blocks) KV blocks, where
`max_num_blocks` is a host integer (frozen by a CUDA graph) and `seq_len` is read on the
device: replays shorter than captured are right, longer ones lose the tail (seed 000).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mlatrace.reference.triton_mla import dot_mode, online_softmax_step

PA_WARPS = 4


@triton.jit
def _paged_attention_v1_kernel(
    out, query, key_cache, value_cache, block_tables, seq_lens, scale, v_scale,
    max_num_blocks,
    stride_q_s, stride_q_h, stride_o_s, stride_o_h,
    stride_kc_b, stride_kc_h, stride_kc_t, stride_vc_b, stride_vc_h, stride_vc_t,
    stride_bt_s,
    GROUP: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    HEAD_SIZE: tl.constexpr, DOT_MODE: tl.constexpr,
):
    """Online softmax over the sequence's blocks, for the GROUP query heads of one KV head."""
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq_len = tl.load(seq_lens + seq)
    num_blocks = tl.minimum(tl.cdiv(seq_len, BLOCK_SIZE), max_num_blocks)

    offs_g = tl.arange(0, BLOCK_G)
    head_ok = offs_g < GROUP
    heads = kv_head * GROUP + offs_g
    offs_d = tl.arange(0, HEAD_SIZE)
    offs_t = tl.arange(0, BLOCK_SIZE)
    q = tl.load(query + seq * stride_q_s + heads[:, None] * stride_q_h + offs_d[None, :],
                mask=head_ok[:, None], other=0.0)
    qk_scale = scale * 1.4426950408889634

    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, HEAD_SIZE], tl.float32)
    for blk in range(0, num_blocks):
        phys = tl.load(block_tables + seq * stride_bt_s + blk).to(tl.int64)
        tok_ok = blk * BLOCK_SIZE + offs_t < seq_len
        k = tl.load(key_cache + phys * stride_kc_b + kv_head * stride_kc_h
                    + offs_t[:, None] * stride_kc_t + offs_d[None, :])
        v = tl.load(value_cache + phys * stride_vc_b + kv_head * stride_vc_h
                    + offs_t[:, None] * stride_vc_t + offs_d[None, :])
        if DOT_MODE == 1:
            v = v.to(tl.float32)
            qk = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
        elif DOT_MODE == 2:
            qk = tl.dot(q, tl.trans(k), input_precision="tf32x3")
        else:
            qk = tl.dot(q, tl.trans(k))
        qk = tl.where(tok_ok[None, :], qk * qk_scale, float("-inf"))
        m_i, l_i, acc = online_softmax_step(qk, v, m_i, l_i, acc, DOT_MODE)

    nonempty = l_i > 0.0
    result = tl.where(nonempty[:, None], acc / tl.where(nonempty, l_i, 1.0)[:, None], 0.0)
    tl.store(out + seq * stride_o_s + heads[:, None] * stride_o_h + offs_d[None, :],
             (result * v_scale).to(out.dtype.element_ty), mask=head_ok[:, None])


def paged_attention(out: torch.Tensor, query: torch.Tensor, key_cache: torch.Tensor,
                    value_cache: torch.Tensor, num_kv_heads: int, scale: float,
                    block_tables: torch.Tensor, seq_lens: torch.Tensor, block_size: int,
                    max_num_blocks: int, v_scale: float) -> None:
    """Launch on grid (num_seqs, num_kv_heads); `max_num_blocks` bounds every program's walk."""
    num_seqs, num_heads, head_size = query.shape
    group = num_heads // num_kv_heads
    assert block_size >= 16 and block_size & (block_size - 1) == 0, "block_size: power of 2 >= 16"
    assert head_size >= 16 and head_size & (head_size - 1) == 0, "head_size: power of 2 >= 16"
    assert key_cache.stride(-1) == 1 and value_cache.stride(-1) == 1 and query.stride(-1) == 1
    grid = (num_seqs, num_kv_heads, 1)
    _paged_attention_v1_kernel[grid](
        out, query, key_cache, value_cache, block_tables, seq_lens, float(scale),
        float(v_scale), max_num_blocks,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
        block_tables.stride(0),
        GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)), BLOCK_SIZE=block_size,
        HEAD_SIZE=head_size, DOT_MODE=dot_mode(key_cache),
        num_warps=PA_WARPS,
    )
