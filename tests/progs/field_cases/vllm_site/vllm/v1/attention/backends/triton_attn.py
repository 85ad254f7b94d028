"""Stand-in of vllm 0.33.0 TRITON_ATTN: TritonAttentionMetadataBuilder.build(common_prefix_len,
common_attn_metadata, fast_build=False) and a decode that reads the block table rows.

The unified kernel loads block_table[row, seq_offset // block_size] with no bounds mask
(vllm#53658); here the same read is bounds-checked on the host, so a dummy sequence longer
than a block-table row raises where the GPU kernel reads past the row."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from mlatrace.reference import graph


@dataclass
class CommonAttentionMetadata:
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    num_reqs: int
    num_actual_tokens: int
    max_query_len: int
    max_seq_len: int
    block_table_tensor: torch.Tensor
    slot_mapping: Any = None


@dataclass
class TritonAttentionMetadata:
    num_actual_tokens: int
    max_query_len: int
    max_seq_len: int
    seq_lens: torch.Tensor
    block_table: torch.Tensor


class _ModelConfig:
    def __init__(self, max_model_len: int) -> None:
        self.max_model_len = max_model_len


class VllmConfig:
    def __init__(self, max_model_len: int) -> None:
        self.model_config = _ModelConfig(max_model_len)


class TritonAttentionMetadataBuilder:
    def __init__(self, kv_cache_spec, layer_names, vllm_config, device) -> None:
        self.vllm_config = vllm_config
        self.block_size = 16

    def build(self, common_prefix_len, common_attn_metadata, fast_build=False):
        m = common_attn_metadata
        return TritonAttentionMetadata(m.num_actual_tokens, m.max_query_len, m.max_seq_len,
                                       m.seq_lens, m.block_table_tensor)


def unified_attention_host_check(metadata: TritonAttentionMetadata, block_size: int) -> None:
    """The host side of the launch: the pages each row's seq_len needs against the row width."""
    pages = -(-metadata.max_seq_len // block_size)
    width = metadata.block_table.shape[1]
    if pages > width:
        raise RuntimeError(f"block_table row holds {width} pages, seq_len {metadata.max_seq_len} "
                           f"needs {pages}: an out-of-bounds read of the block table")
    graph.launch(_decode, metadata.seq_lens, metadata.block_table)


def _decode(seq_lens: torch.Tensor, block_table: torch.Tensor) -> None:
    block_table[:, 0].add_(0)
