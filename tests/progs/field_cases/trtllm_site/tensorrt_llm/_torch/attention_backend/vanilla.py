"""Stand-in of TensorRT-LLM tensorrt_llm/_torch/attention_backend/vanilla.py
VanillaAttentionMetadata.prepare(self): the host seq_lens (a CPU tensor) of the step."""

from __future__ import annotations

import torch


class VanillaAttentionMetadata:
    def __init__(self, max_num_requests: int) -> None:
        self.seq_lens = torch.zeros(max_num_requests, dtype=torch.int32)
        self.num_seqs = 0
        self.num_tokens = 0

    def prepare(self) -> None:
        self.num_tokens = int(self.seq_lens[: self.num_seqs].sum())
