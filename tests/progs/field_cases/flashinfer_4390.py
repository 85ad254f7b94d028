"""flashinfer#4390: vLLM FLASHINFER_MLA decode graphs (batch 4) where FlashInfer's autotuner
picks the MLA decode runner per batch size, profiled at one KV length (1024: trtllm-gen), and
the graphs replay at 65536 tokens, where the other runner is the faster one. Healthy
(MLATRACE_CASE_VARIANT=trtllm_gen, the issue's resolution: one backend fast at every
length): the backend is explicit and nothing is chosen per graph."""

import torch
from flashinfer.autotuner import autotune
from vllm.compilation.cuda_graph import BatchDescriptor, CUDAGraphMode, CUDAGraphWrapper
from vllm.forward_context import set_forward_context
from vllm.v1.attention.backends.mla.flashinfer_mla import (
    FlashInferMLAImpl,
    FlashInferMLAMetadataBuilder,
)
from vllm.v1.attention.backends.triton_attn import CommonAttentionMetadata


class Layer:
    layer_name = "model.layers.0.self_attn.attn"


BS = 4
builder, impl, layer = FlashInferMLAMetadataBuilder(BS), FlashInferMLAImpl(), Layer()
q, cache = torch.zeros(BS, 1, 128, 576), torch.zeros(64, 576)
block_table = torch.zeros((BS, 8), dtype=torch.int32)
model = CUDAGraphWrapper(lambda md: impl.forward_mqa(q, cache, md, layer)[0])


def step(length: int, mode) -> torch.Tensor:
    lens = torch.full((BS,), length, dtype=torch.int32)
    md = builder.build(0, CommonAttentionMetadata(
        query_start_loc=torch.arange(BS + 1), seq_lens=lens, num_reqs=BS, num_actual_tokens=BS,
        max_query_len=1, max_seq_len=length, block_table_tensor=block_table))
    with set_forward_context(md, None, cudagraph_runtime_mode=mode,
                             batch_descriptor=BatchDescriptor(BS)):
        return model(md)


with autotune():                          # the warm-up's tuning run, eager
    step(1024, CUDAGraphMode.NONE)
step(1, CUDAGraphMode.FULL)               # the capture's dummy step
for n in range(4):
    out = step(65536 + n, CUDAGraphMode.FULL)
print("runner", "trtllm-gen" if out[0, 1] == 1 else "cute-dsl", "at", int(out[0, 0]))
