"""Stand-in of sglang 0.5.23 sglang/srt/layers/attention/triton_backend.py (TritonAttnBackend):
the graph metadata path's names and signatures, with a toy split formula on the host.

MLATRACE_CASE_VARIANT=skip_replay_splits reproduces sglang#26019's refactor: the replay path
binds the static num_kv_splits buffer without calling get_num_kv_splits.
"""

from __future__ import annotations

import os

import torch

from mlatrace.reference import graph


class TritonAttnBackend:
    def __init__(self, max_bs: int, max_kv_splits: int = 16, core_count: int = 132) -> None:
        self.max_kv_splits = max_kv_splits
        self.static_kv_splits = False
        self.enable_deterministic = False
        self.device_core_count = core_count
        self.cuda_graph_num_kv_splits = torch.full((max_bs,), max_kv_splits, dtype=torch.int32)
        self.cuda_graph_kv_indices = torch.zeros(max_bs * 64, dtype=torch.int32)
        self.cuda_graph_seq_lens = torch.ones(max_bs, dtype=torch.int32)
        self.skip_replay_splits = os.environ.get("MLATRACE_CASE_VARIANT") == "skip_replay_splits"

    def get_num_kv_splits(self, num_kv_splits, seq_lens, uneven_batch=None):
        if self.static_kv_splits and not self.enable_deterministic:
            num_kv_splits.fill_(self.max_kv_splits)
            return
        # on device in SGLang (get_num_kv_splits_triton); a toy count here: 1 per 512 tokens
        num_kv_splits.copy_(torch.clamp((seq_lens + 511) // 512, 1, self.max_kv_splits))

    def init_forward_metadata(self, forward_batch):
        """The eager path (a batch no graph serves): this step's own split counts."""
        splits = torch.empty(forward_batch.batch_size, dtype=torch.int32)
        self.get_num_kv_splits(splits, forward_batch.seq_lens)

    def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False):
        bs = forward_batch.batch_size
        self.cuda_graph_seq_lens[:bs].copy_(forward_batch.seq_lens)
        if in_capture or not self.skip_replay_splits:
            self._apply_cuda_graph_metadata(None, bs, None, forward_batch.seq_lens,
                                            "DECODE", None)

    def _apply_cuda_graph_metadata(self, plan, bs, req_pool_indices, seq_lens, forward_mode,
                                   spec_info):
        self.get_num_kv_splits(self.cuda_graph_num_kv_splits[:bs], seq_lens[:bs])

    def forward_decode(self, out: torch.Tensor, bs: int) -> None:
        """The captured decode: reads the static split and length buffers when it runs."""
        graph.launch(_decode, out, self.cuda_graph_num_kv_splits[:bs], self.cuda_graph_seq_lens[:bs])


def _decode(out, num_kv_splits, seq_lens) -> None:
    out.copy_(seq_lens.to(out.dtype) / num_kv_splits.to(out.dtype))
