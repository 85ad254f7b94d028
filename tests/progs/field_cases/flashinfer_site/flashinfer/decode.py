"""Stand-in of flashinfer-python 0.7.4 flashinfer/decode.py: BatchDecodeWithPagedKVCacheWrapper
(__init__, plan, run) with use_cuda_graph and the tensor-core (FA2) decode path, a toy
scheduler and kernel on the HostGraph; fast_decode_plan and trtllm_batch_decode_with_kv_cache
keep their names for the packs (not used by these cases).

The plan's padded_batch_size (plan_info[0], grid x of the decode kernel) under CUDA graphs:
0.7.4 pads it to the split-KV bound 2 * SMs // num_kv_heads even with disable_split_kv, whose
plan initializes only batch * cdiv(group, cta_tile_q) scheduler entries (flashinfer#4002);
MLATRACE_CASE_VARIANT=exact_grid launches exactly those (the proposed fix, flashinfer#4794)."""

from __future__ import annotations

import os

import torch

from flashinfer.mla._core import trtllm_batch_decode_with_kv_cache_mla  # noqa: F401
from mlatrace.reference import graph

SMS = 132
CTA_TILE_Q = 16


class BatchDecodeWithPagedKVCacheWrapper:
    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False,
                 use_tensor_cores=False, paged_kv_indptr_buffer=None,
                 paged_kv_indices_buffer=None, paged_kv_last_page_len_buffer=None,
                 backend="auto", jit_args=None, jit_kwargs=None):
        self._float_workspace_buffer = float_workspace_buffer
        self._int_workspace_buffer = torch.zeros(1024, dtype=torch.int32)
        self._use_cuda_graph = use_cuda_graph
        self._paged_kv_indptr_buf = paged_kv_indptr_buffer
        self._paged_kv_indices_buf = paged_kv_indices_buffer
        self._paged_kv_last_page_len_buf = paged_kv_last_page_len_buffer
        self._plan_info = None

    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim,
             page_size, *deprecated_positional_args, **kwargs):
        batch = len(last_page_len)
        group = num_qo_heads // num_kv_heads
        tiles = batch * -(-group // CTA_TILE_Q)        # the entries the plan initializes
        padded = tiles
        if self._use_cuda_graph:
            exact = (kwargs.get("disable_split_kv")
                     and os.environ.get("MLATRACE_CASE_VARIANT") == "exact_grid")
            if not exact:
                padded = max(2 * SMS // num_kv_heads, tiles)
        self._paged_kv_indptr_buf[: batch + 1].copy_(indptr)
        self._paged_kv_last_page_len_buf[:batch].copy_(last_page_len)
        work = self._int_workspace_buffer
        work.fill_(-1)                                   # what an earlier plan left behind
        work[:tiles] = torch.arange(tiles, dtype=torch.int32)
        self._plan_info = [padded, tiles, CTA_TILE_Q]

    def run(self, q, paged_kv_cache, *args, out=None, **kwargs):
        out = torch.zeros(self._plan_info[0]) if out is None else out
        graph.launch(_decode, out, self._int_workspace_buffer, self._plan_info[0])
        return out


def _decode(out, work, grid_x):
    # every CTA of the grid reads its scheduler entry; the padded tail reads -1 (uninitialized)
    out[:grid_x] = work[:grid_x].float()


def fast_decode_plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim,
                     page_size, pos_encoding_mode="NONE", window_left=-1, logits_soft_cap=None,
                     q_data_type=None, kv_data_type=None, data_type=None, sm_scale=None,
                     rope_scale=None, rope_theta=None, non_blocking=True, fixed_split_size=None,
                     disable_split_kv=False, q_len_per_req=1, global_override_indptr_cpu=None):
    raise NotImplementedError("stand-in")


def trtllm_batch_decode_with_kv_cache(query, kv_cache, workspace_buffer, block_tables, seq_lens,
                                      max_seq_len, *args, **kwargs):
    raise NotImplementedError("stand-in")
