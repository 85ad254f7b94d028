"""Stand-in of vllm 0.33.0 GPUModelRunner._dummy_run(num_tokens, cudagraph_runtime_mode, ...,
is_graph_capturing): for a FULL capture every dummy request's seq_len is the step's query
length, max_query_len = num_tokens for a non-uniform batch (vllm#53658);
MLATRACE_CASE_VARIANT=clamp bounds it by max_model_len (vllm#53671)."""

from __future__ import annotations

import os

import torch

from vllm.compilation.cuda_graph import BatchDescriptor, CUDAGraphMode, CUDAGraphWrapper
from vllm.forward_context import set_forward_context
from vllm.v1.attention.backends.triton_attn import (
    CommonAttentionMetadata,
    TritonAttentionMetadataBuilder,
    VllmConfig,
    unified_attention_host_check,
)


class GPUModelRunner:
    def __init__(self, max_model_len: int, max_num_reqs: int, block_size: int = 16) -> None:
        self.max_model_len = max_model_len
        self.vllm_config = VllmConfig(max_model_len)
        self.block_size = block_size
        self.builder = TritonAttentionMetadataBuilder(None, ["layers.0"], self.vllm_config, "cpu")
        self.block_table = torch.zeros((max_num_reqs, -(-max_model_len // block_size)),
                                       dtype=torch.int32)
        self.optimistic_seq_lens_cpu = torch.zeros(max_num_reqs, dtype=torch.int32)
        self.model = CUDAGraphWrapper(self._forward)
        self.clamp = os.environ.get("MLATRACE_CASE_VARIANT") == "clamp"

    def _forward(self, metadata):
        unified_attention_host_check(metadata, self.block_size)
        return metadata.num_actual_tokens

    def _dummy_run(self, num_tokens, cudagraph_runtime_mode=None, force_attention=False,
                   uniform_decode=False, allow_microbatching=True, skip_eplb=False,
                   is_profile=False, create_mixed_batch=False, remove_lora=True,
                   is_graph_capturing=False, num_active_loras=0, profile_seq_lens=None,
                   randomize_inputs=False):
        num_reqs = min(num_tokens, self.block_table.shape[0])
        max_query_len = num_tokens          # a non-uniform batch: one request takes them all
        seq_lens = max_query_len
        if self.clamp:
            seq_lens = min(seq_lens, self.max_model_len)
        self.optimistic_seq_lens_cpu[:num_reqs] = seq_lens
        metadata = self.builder.build(0, CommonAttentionMetadata(
            query_start_loc=torch.arange(num_reqs + 1, dtype=torch.int32),
            seq_lens=self.optimistic_seq_lens_cpu[:num_reqs].clone(), num_reqs=num_reqs,
            num_actual_tokens=num_tokens, max_query_len=max_query_len,
            max_seq_len=int(self.optimistic_seq_lens_cpu[:num_reqs].max()),
            block_table_tensor=self.block_table[:num_reqs]))
        with set_forward_context(metadata, self.vllm_config,
                                 cudagraph_runtime_mode=cudagraph_runtime_mode,
                                 batch_descriptor=BatchDescriptor(num_tokens)):
            return self.model(metadata)

    def capture_model(self, sizes):
        for size in sorted(sizes, reverse=True):
            self._dummy_run(size, CUDAGraphMode.FULL, is_graph_capturing=True)

    def execute_model(self, num_tokens, seq_len):
        num_reqs = num_tokens
        self.optimistic_seq_lens_cpu[:num_reqs] = seq_len
        metadata = self.builder.build(0, CommonAttentionMetadata(
            query_start_loc=torch.arange(num_reqs + 1, dtype=torch.int32),
            seq_lens=self.optimistic_seq_lens_cpu[:num_reqs].clone(), num_reqs=num_reqs,
            num_actual_tokens=num_tokens, max_query_len=1, max_seq_len=seq_len,
            block_table_tensor=self.block_table[:num_reqs]))
        with set_forward_context(metadata, self.vllm_config,
                                 cudagraph_runtime_mode=CUDAGraphMode.FULL,
                                 batch_descriptor=BatchDescriptor(num_tokens)):
            return self.model(metadata)
