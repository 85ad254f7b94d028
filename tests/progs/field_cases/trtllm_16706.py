"""TensorRT-LLM#16706: a T5 encoder CUDA graph (4 requests), captured on a dummy batch of
64-token requests and replayed for batches of 37..40-token requests. Bad: the relative-position
bias is built inside the captured forward from the capture's lengths, so every replay adds the
64-length bias. MLATRACE_CASE_VARIANT=rebuild (the fix): the bias is rebuilt for the replayed
lengths before each replay, into the buffer the graph reads."""

import os

import torch
from tensorrt_llm._torch.attention_backend.vanilla import VanillaAttentionMetadata
from tensorrt_llm._torch.models.modeling_t5 import T5RelativePositionBias

from mlatrace.reference import graph
from mlatrace.reference.graph import HostGraph

REQS, WIDTH, HEADS = 4, 64, 8
REBUILD = os.environ.get("MLATRACE_CASE_VARIANT") == "rebuild"
bias_module = T5RelativePositionBias(32, HEADS, 128, is_decoder=False)
metadata = VanillaAttentionMetadata(REQS)
static_bias = torch.zeros(1, HEADS, WIDTH, WIDTH)
scores = torch.zeros(REQS, HEADS, WIDTH, WIDTH)


def encoder_forward(length: int) -> None:
    with torch.no_grad():
        bias = static_bias if REBUILD else bias_module(length, length, "cpu")
    graph.launch(lambda: scores.copy_(bias.expand_as(scores)))   # scores + bias, per head


def prepare(length: int) -> None:
    metadata.num_seqs = REQS
    metadata.seq_lens[:REQS] = length
    metadata.prepare()
    if REBUILD:
        with torch.no_grad():
            fresh = bias_module(length, length, "cpu")
        static_bias.zero_()
        static_bias[..., :length, :length].copy_(fresh)


prepare(WIDTH)                      # the dummy batch the encoder graph is captured on
encoder_graph = HostGraph()
encoder_graph.capture_begin()
try:
    encoder_forward(WIDTH)
finally:
    encoder_graph.capture_end()
for length in (37, 38, 39, 40):
    prepare(length)
    encoder_graph.replay()
