"""Stand-in of vllm 0.33.0 vllm/v1/attention/backends/mla/flashinfer_mla.py: the decode
metadata and FlashInferMLAImpl.forward_mqa calling FlashInfer's
trtllm_batch_decode_with_kv_cache_mla(..., max_seq_len=attn_metadata.max_seq_len).
MLATRACE_CASE_VARIANT=trtllm_gen passes backend="trtllm-gen" instead of "auto"."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from flashinfer.decode import trtllm_batch_decode_with_kv_cache_mla

from vllm.model_executor.layers.attention.mla_attention import (
    MLACommonImpl,
    MLACommonMetadataBuilder,
)

BACKEND = "trtllm-gen" if os.environ.get("MLATRACE_CASE_VARIANT") == "trtllm_gen" else "auto"


@dataclass
class FlashInferMLADecodeMetadata:
    block_table: torch.Tensor
    seq_lens: torch.Tensor


class FlashInferMLAMetadataBuilder(MLACommonMetadataBuilder):
    def __init__(self, max_num_reqs: int) -> None:
        self.seq_lens = torch.ones(max_num_reqs, dtype=torch.int32)   # persistent

    def _build_decode(self, block_table_tensor, seq_lens_device, max_seq_len, *rest):
        n = seq_lens_device.shape[0]
        self.seq_lens[:n].copy_(seq_lens_device)
        return FlashInferMLADecodeMetadata(block_table_tensor, self.seq_lens[:n])


class FlashInferMLAImpl(MLACommonImpl):
    def __init__(self) -> None:
        self.workspace = torch.zeros(16)

    def forward_mqa(self, q, kv_c_and_k_pe_cache, attn_metadata, layer):
        decode = attn_metadata.decode
        return trtllm_batch_decode_with_kv_cache_mla(
            q, kv_c_and_k_pe_cache, self.workspace, 128, 512, 64, decode.block_table,
            decode.seq_lens, attn_metadata.max_seq_len, backend=BACKEND), None
