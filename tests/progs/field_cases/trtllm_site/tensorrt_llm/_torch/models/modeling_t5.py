"""Stand-in of TensorRT-LLM tensorrt_llm/_torch/models/modeling_t5.py T5RelativePositionBias:
forward(query_length, key_length, device) builds the (1, heads, q, k) bias from host lengths
(a toy bucket table here)."""

from __future__ import annotations

import torch
from torch import nn


class T5RelativePositionBias(nn.Module):
    def __init__(self, num_buckets: int, num_heads: int, max_distance: int, is_decoder: bool,
                 dtype=None) -> None:
        super().__init__()
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.is_decoder = is_decoder
        self.relative_attention_bias = nn.Embedding(num_buckets, num_heads, dtype=dtype)

    def forward(self, query_length: int, key_length: int, device: torch.device) -> torch.Tensor:
        rel = (torch.arange(key_length)[None, :] - torch.arange(query_length)[:, None]).abs()
        buckets = torch.clamp(rel, max=self.num_buckets - 1)
        return self.relative_attention_bias(buckets).permute(2, 0, 1).unsqueeze(0)
