"""Stand-in of vllm 0.33.0 vllm/v1/attention/backends/mla/flashmla.py with an FP8 KV cache:
FlashMLAMetadataBuilder._build_decode and FlashMLAImpl.forward_mqa.

Where the FP8 tile scheduler metadata comes from (MLATRACE_CASE_VARIANT):
- "" (vllm#36611's bug, as before vllm#35175): _build_decode calls get_mla_metadata_dense_fp8
  eagerly every step and hands its fresh tensors to the decode; the graph reads the
  capture-time tensors;
- "in_graph" (vllm#36611's fix): forward_mqa calls it, so the scheduling runs inside the
  graph at every replay from the live seq lens."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from vllm.model_executor.layers.attention.mla_attention import (
    MLACommonImpl,
    MLACommonMetadataBuilder,
)
from vllm.v1.attention.ops.flashmla import flash_mla_with_kvcache_fp8, get_mla_metadata_dense_fp8

IN_GRAPH = os.environ.get("MLATRACE_CASE_VARIANT") == "in_graph"


@dataclass
class FlashMLASchedMeta:
    tile_scheduler_metadata: Any = None
    num_splits: Any = None


@dataclass
class FlashMLADecodeMetadata:
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    scheduler_metadata: FlashMLASchedMeta


class FlashMLAMetadataBuilder(MLACommonMetadataBuilder):
    def __init__(self, max_num_reqs: int) -> None:
        self.seq_lens = torch.ones(max_num_reqs, dtype=torch.int32)   # persistent

    def _build_decode(self, block_table_tensor, seq_lens_device, max_seq_len, *rest):
        n = seq_lens_device.shape[0]
        self.seq_lens[:n].copy_(seq_lens_device)
        meta = FlashMLASchedMeta()
        if not IN_GRAPH:
            meta.tile_scheduler_metadata, meta.num_splits = get_mla_metadata_dense_fp8(
                self.seq_lens[:n], 16, 1)
        return FlashMLADecodeMetadata(block_table_tensor, self.seq_lens[:n], meta)


class FlashMLAImpl(MLACommonImpl):
    kv_lora_rank = 8

    def forward_mqa(self, q, kv_c_and_k_pe_cache, attn_metadata, layer):
        decode = attn_metadata.decode
        meta = decode.scheduler_metadata
        tile, splits = meta.tile_scheduler_metadata, meta.num_splits
        if IN_GRAPH:
            tile, splits = get_mla_metadata_dense_fp8(decode.seq_lens, 16, 1)
        return flash_mla_with_kvcache_fp8(q, kv_c_and_k_pe_cache, decode.block_table,
                                          decode.seq_lens, self.kv_lora_rank, tile, splits)
