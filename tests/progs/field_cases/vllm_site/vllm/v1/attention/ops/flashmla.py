"""Stand-in of vllm 0.33.0 vllm/v1/attention/ops/flashmla.py: get_mla_metadata_dense_fp8(
cache_seqlens, num_q_tokens_per_head_k, num_heads_k) -> (tile_scheduler_metadata,
num_splits), fresh tensors every call, and flash_mla_with_kvcache_fp8, which reads them
(toy schedule and kernel; launched through the HostGraph)."""

from __future__ import annotations

import torch

from mlatrace.reference import graph

NUM_SM_PARTS = 4


def get_mla_metadata_dense_fp8(cache_seqlens, num_q_tokens_per_head_k, num_heads_k):
    tile = torch.empty((NUM_SM_PARTS, 8), dtype=torch.int32)
    splits = torch.empty(cache_seqlens.shape[0] + 1, dtype=torch.int32)
    graph.launch(_schedule, cache_seqlens, tile, splits)
    return tile, splits


def _schedule(cache_seqlens, tile, splits):
    tile.zero_()
    tile[:, 2] = cache_seqlens.max()
    splits[0] = 0
    splits[1:] = torch.cumsum(torch.clamp(cache_seqlens // 1024, min=1), 0)


def flash_mla_with_kvcache_fp8(q, k_cache, block_table, cache_seqlens, head_dim_v,
                               tile_scheduler_metadata, num_splits, softmax_scale=None,
                               causal=False, descale_q=None, descale_k=None):
    out = torch.zeros(q.shape[0], head_dim_v)
    graph.launch(_attend, out, cache_seqlens, tile_scheduler_metadata, num_splits)
    return out, None


def _attend(out, cache_seqlens, tile, splits):
    out[:, 0] = tile[0, 2].float()      # the length the schedule was made for
    out[:, 1] = cache_seqlens.float()
