"""ROCm/aiter#3773: a DSA decode graph (batch 8) whose indexer logits buffer is allocated at
max_model_len 262144 wide; the live rows are ~8192 long. Before the fix the decode top-k asks
topk_use_mulblocks(numRows, stride0=262144) at capture and freezes the multi-block path;
MLATRACE_CASE_VARIANT=one_block: the fixed decode entry asks nothing. An eager prefill step
asks the same query first: it is no decode graph's decision and is not recorded.

The installed vLLM's indexer top-k (vllm.v1.attention.ops.rocm_paged_mxfp4_indexer._topk, k =
2048, DeepSeek's index top-k, so it takes AITER's top_k_per_row_decode) runs in its
CUDAGraphWrapper (captured into the HostGraph: vllm_cpu_graph.py) over the AITER stand-in
(aiter_site: AITER does not install here). The step's lengths come from the real
MLACommonMetadataBuilder.build (the CPU MLA backend's builder), in place of
ROCMAiterMLASparseMetadataBuilder, whose __init__ needs AITER's MLA metadata API
(get_mla_metadata_info_v1), which the stand-in does not have."""

import torch
import vllm_cpu_graph
from aiter.ops.topk import top_k_per_row_prefill
from vllm.compilation.cuda_graph import CUDAGraphWrapper
from vllm.config.compilation import CUDAGraphMode
from vllm.forward_context import BatchDescriptor, set_forward_context
from vllm.model_executor.layers.attention.mla_attention import MLACommonMetadataBuilder
from vllm.v1.attention.ops.rocm_paged_mxfp4_indexer import _topk

BS, WIDTH, K, LAYER = 8, 262144, 2048, "model.layers.0.self_attn.attn"
vllm_cpu_graph.install()
config, layer, builder = vllm_cpu_graph.mla_setup(
    MLACommonMetadataBuilder, "auto", CUDAGraphMode.FULL_AND_PIECEWISE, LAYER)
logits = torch.zeros((BS, WIDTH))
indices = torch.zeros((BS, K), dtype=torch.int32)
block_table = torch.zeros((BS, 16), dtype=torch.int32)
seq_lens = torch.zeros(BS, dtype=torch.int32)            # the runner's persistent input buffers
query_start = torch.arange(BS + 1, dtype=torch.int32)


def forward(metadata):
    _topk(logits, metadata.decode.seq_lens, indices, K)
    return indices


model = CUDAGraphWrapper(forward, config, CUDAGraphMode.FULL)


def step(length: int) -> None:
    md = builder.build(0, vllm_cpu_graph.decode_metadata(seq_lens, query_start, length,
                                                         block_table))
    with set_forward_context({LAYER: md}, config, cudagraph_runtime_mode=CUDAGraphMode.FULL,
                             batch_descriptor=BatchDescriptor(num_tokens=BS)):
        model(md)


prefill_logits = torch.randn(16, WIDTH)        # an eager prefill step asks the query too
top_k_per_row_prefill(prefill_logits, torch.zeros(16, dtype=torch.int32),
                      torch.full((16,), 4096, dtype=torch.int32), torch.zeros((16, K),
                      dtype=torch.int32), None, 16, prefill_logits.stride(0), 1, k=K)
step(1)                                        # the capture's dummy step
for n in range(4):
    logits[:, : 8192 + n].normal_()
    step(8192 + n)
