"""Stand-in of aiter/ops/topk.py (ROCm/aiter): top_k_per_row_decode(logits, next_n, seqLens,
indices, numRows, stride0, stride1, k=2048, stable=False) and the host query
topk_use_mulblocks(numRows, stride0) -> bool, with a toy threshold and a torch top-k.

Before ROCm/aiter#3773 the decode entry asked topk_use_mulblocks(numRows, stride0) and took
the multi-block path for a wide row stride; MLATRACE_CASE_VARIANT=one_block is the fix
(decode always takes the one-block kernel, no query)."""

from __future__ import annotations

import os

import torch

from mlatrace.reference import graph

MULTI_BLOCK_FROM = 65536   # toy threshold of the row length the query sees


def topk_use_mulblocks(numRows: int, stride0: int) -> bool:
    return stride0 >= MULTI_BLOCK_FROM


def _top_k_per_row_decode(logits, next_n, seqLens, indices, numRows, stride0, stride1, k=2048,
                          workspace=None, stable=False):
    graph.launch(_topk_rows, logits, seqLens, indices, k)


def _topk_rows(logits, seq_lens, indices, k):
    for row, length in enumerate(seq_lens.tolist()):
        top = torch.topk(logits[row, :length], min(k, length)).indices
        indices[row, :top.numel()] = top.to(indices.dtype)


def top_k_per_row_decode(logits, next_n, seqLens, indices, numRows, stride0, stride1, k=2048,
                         stable=False):
    workspace = None
    if os.environ.get("MLATRACE_CASE_VARIANT") != "one_block" and not stable:
        if topk_use_mulblocks(numRows, stride0):
            workspace = torch.zeros(16, dtype=torch.uint8)
    return _top_k_per_row_decode(logits, next_n, seqLens, indices, numRows, stride0, stride1, k,
                                 workspace, stable)


def top_k_per_row_prefill(logits, rowStarts, rowEnds, indices, values, numRows, stride0, stride1,
                          k=2048, stable=False):
    """The prefill entry asks the same query (kept after #3773); eager, not a decode graph's."""
    if not stable:
        topk_use_mulblocks(numRows, stride0)
    graph.launch(_topk_rows, logits, rowEnds - rowStarts, indices, k)
