"""Stand-in of sglang 0.5.23 DecodeCudaGraphRunner: capture_one_shape(size, forward) runs the
backend's init_forward_metadata_out_graph(in_capture=True) then captures; load_batch fills
the static buffers and re-runs the metadata path; execute replays the shape's graph."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mlatrace.reference.graph import HostGraph


@dataclass
class ForwardBatch:
    batch_size: int
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    seq_lens_sum: int


@dataclass
class _Buffers:
    seq_lens: torch.Tensor
    req_pool_indices: torch.Tensor


class DecodeCudaGraphRunner:
    def __init__(self, attn_backend, max_bs: int) -> None:
        self.attn_backend = attn_backend
        self.graphs: dict[int, HostGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.buffers = _Buffers(torch.ones(max_bs, dtype=torch.int32),
                                torch.zeros(max_bs, dtype=torch.int32))
        self.bs = 0

    def capture_one_shape(self, size, forward, stream_idx=None, variant_label=None,
                          attention_variant=None):
        lens = torch.ones(size, dtype=torch.int32)   # the fill value of a capture
        batch = ForwardBatch(size, lens, lens.clone(), size)
        self.attn_backend.init_forward_metadata_out_graph(batch, in_capture=True)
        out = torch.zeros(size)
        g = HostGraph()
        g.capture_begin()
        try:
            forward(out, size)
        finally:
            g.capture_end()
        self.graphs[size], self.outputs[size] = g, out

    def load_batch(self, forward_batch, pp_proxy_tensors=None):
        bs = forward_batch.batch_size
        self.buffers.seq_lens[:bs].copy_(forward_batch.seq_lens)
        self.bs = bs
        self.attn_backend.init_forward_metadata_out_graph(forward_batch)

    def execute(self, forward_batch, pp_proxy_tensors=None):
        self.load_batch(forward_batch, pp_proxy_tensors)
        self.graphs[self.bs].replay()
        return self.outputs[self.bs]
