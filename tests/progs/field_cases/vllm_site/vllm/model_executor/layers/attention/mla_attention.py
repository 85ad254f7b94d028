"""Stand-in of vllm 0.33.0 vllm/model_executor/layers/attention/mla_attention.py: the MLA
metadata builder's build(common_prefix_len, common_attn_metadata, fast_build=False), which
hands the decode part to the backend's _build_decode, and the impl base class."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class MLACommonMetadata:
    num_decodes: int
    decode: Any
    max_seq_len: int = 0


class MLACommonMetadataBuilder:
    def build(self, common_prefix_len, common_attn_metadata, fast_build=False):
        m = common_attn_metadata
        decode = self._build_decode(m.block_table_tensor, m.seq_lens, m.max_seq_len)
        return MLACommonMetadata(m.num_reqs, decode, m.max_seq_len)


class MLACommonImpl:
    def forward_mqa(self, q, kv_c_and_k_pe_cache, attn_metadata, layer):
        raise NotImplementedError
