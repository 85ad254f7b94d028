"""Stand-in of TensorRT-LLM DecodingCUDAGraphRunner(batch_size, device, attn_metadata):
capture(forward_fn) warms up twice, then captures (a HostGraph here); run(inputs) copies the
step's inputs into the static ones and replays."""

from __future__ import annotations

import torch

from mlatrace.reference.graph import HostGraph


class DecodingCUDAGraphRunner:
    def __init__(self, batch_size, device, attn_metadata, spec_metadata=None, use_mrope=False):
        self.batch_size = batch_size
        self.input_ids = torch.ones(batch_size, dtype=torch.int32)
        self.attn_metadata = attn_metadata
        self._graph = None
        self._output = None

    def capture(self, forward_fn, pool=None):
        self._graph = HostGraph()
        inputs = {"attn_metadata": self.attn_metadata, "input_ids": self.input_ids}
        for _ in range(2):
            forward_fn(inputs)
        self._graph.capture_begin()
        try:
            self._output = forward_fn(inputs)
        finally:
            self._graph.capture_end()

    def run(self, inputs):
        self.input_ids[: inputs["input_ids"].shape[0]].copy_(inputs["input_ids"])
        self._graph.replay()
        return self._output
