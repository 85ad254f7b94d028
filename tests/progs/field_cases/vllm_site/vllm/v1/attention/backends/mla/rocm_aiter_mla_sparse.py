"""Stand-in of vllm 0.33.0 ROCMAiterMLASparseMetadataBuilder.build(common_prefix_len,
common_attn_metadata, fast_build=False): the decode metadata the sparse indexer reads."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class _Decode:
    seq_lens: torch.Tensor
    block_table: torch.Tensor


@dataclass
class ROCMAiterMLASparseMetadata:
    num_decodes: int
    decode: _Decode


class ROCMAiterMLASparseMetadataBuilder:
    def __init__(self, seq_lens: torch.Tensor, block_table: torch.Tensor) -> None:
        self.seq_lens, self.block_table = seq_lens, block_table   # persistent buffers

    def build(self, common_prefix_len, common_attn_metadata, fast_build=False):
        m = common_attn_metadata
        self.seq_lens[:m.num_reqs].copy_(m.seq_lens)
        return ROCMAiterMLASparseMetadata(m.num_reqs, _Decode(self.seq_lens[:m.num_reqs],
                                                              self.block_table[:m.num_reqs]))


class ROCMAiterMLASparseImpl:
    """The impl the vllm_mla pack probes (forward_mqa); not used by these cases."""

    def forward_mqa(self, q, kv_c_and_k_pe_cache, attn_metadata, layer):
        raise NotImplementedError("stand-in")
