"""ROCm/aiter#3773: a DSA decode graph (batch 8) whose indexer logits buffer is allocated at
max_model_len 262144 wide; the live rows are ~8192 long. Before the fix the decode top-k asks
topk_use_mulblocks(numRows, stride0=262144) at capture and freezes the multi-block path;
MLATRACE_CASE_VARIANT=one_block: the fixed decode entry asks nothing. An eager prefill step
asks the same query first: it is no decode graph's decision and is not recorded."""

import torch
from aiter.ops.topk import top_k_per_row_prefill
from vllm.compilation.cuda_graph import BatchDescriptor, CUDAGraphMode, CUDAGraphWrapper
from vllm.forward_context import set_forward_context
from vllm.v1.attention.backends.mla.rocm_aiter_mla_sparse import ROCMAiterMLASparseMetadataBuilder
from vllm.v1.attention.backends.triton_attn import CommonAttentionMetadata
from vllm.v1.attention.ops.rocm_paged_mxfp4_indexer import _topk

BS, WIDTH, K = 8, 262144, 64
logits = torch.zeros((BS, WIDTH))
indices = torch.zeros((BS, K), dtype=torch.int32)
builder = ROCMAiterMLASparseMetadataBuilder(torch.ones(BS, dtype=torch.int32),
                                            torch.zeros((BS, 16), dtype=torch.int32))


def forward(metadata):
    _topk(logits, metadata.decode.seq_lens, indices, K)
    return indices


model = CUDAGraphWrapper(forward)


def step(length: int, mode) -> None:
    lens = torch.full((BS,), length, dtype=torch.int32)
    metadata = builder.build(0, CommonAttentionMetadata(
        query_start_loc=torch.arange(BS + 1), seq_lens=lens, num_reqs=BS, num_actual_tokens=BS,
        max_query_len=1, max_seq_len=length, block_table_tensor=builder.block_table))
    with set_forward_context(metadata, None, cudagraph_runtime_mode=mode,
                             batch_descriptor=BatchDescriptor(BS)):
        model(metadata)


prefill_logits = torch.randn(16, WIDTH)        # an eager prefill step asks the query too
top_k_per_row_prefill(prefill_logits, torch.zeros(16, dtype=torch.int32),
                      torch.full((16,), 4096, dtype=torch.int32), torch.zeros((16, K),
                      dtype=torch.int32), None, 16, prefill_logits.stride(0), 1, k=K)
step(1, CUDAGraphMode.FULL)                 # the capture's dummy step
for n in range(4):
    logits[:, : 8192 + n].normal_()
    step(8192 + n, CUDAGraphMode.FULL)
