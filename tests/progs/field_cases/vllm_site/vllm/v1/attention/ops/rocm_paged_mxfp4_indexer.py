"""Stand-in of vllm 0.33.0 rocm_paged_mxfp4_indexer._topk(logits, lengths, out, k): AITER's
decode top-k over each row's [0, lengths[row]), given the logits buffer's strides."""

from __future__ import annotations

import torch


def _topk(logits: torch.Tensor, lengths: torch.Tensor, out: torch.Tensor, k: int) -> None:
    from aiter.ops.topk import top_k_per_row_decode

    rows = logits.shape[0]
    top_k_per_row_decode(logits, 1, lengths.reshape(-1), out, rows, logits.stride(0),
                         logits.stride(1), k=k)
