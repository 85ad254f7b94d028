"""Stand-in of the vllm 0.33.0 CommonAttentionMetadata fields the aiter_3773 and
flashinfer_4390 cases' metadata builders read (the real class lives in
vllm/v1/attention/backend.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


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
