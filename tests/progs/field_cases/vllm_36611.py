"""vllm#36611: FlashMLA with an FP8 KV cache in a FULL decode graph (batch 4), captured at the
dummy length and replayed at 2048.. tokens. Bad: the FP8 tile scheduler metadata is made in
the metadata build outside the graph (fresh tensors every step, the graph keeps reading the
capture's); MLATRACE_CASE_VARIANT=in_graph: made inside forward_mqa, so captured."""

import torch
from vllm.compilation.cuda_graph import BatchDescriptor, CUDAGraphMode, CUDAGraphWrapper
from vllm.forward_context import set_forward_context
from vllm.v1.attention.backends.mla.flashmla import FlashMLAImpl, FlashMLAMetadataBuilder
from vllm.v1.attention.backends.triton_attn import CommonAttentionMetadata


class Layer:
    layer_name = "model.layers.0.self_attn.attn"


BS = 4
builder, impl, layer = FlashMLAMetadataBuilder(BS), FlashMLAImpl(), Layer()
q, cache = torch.zeros(BS, 1, 16), torch.zeros(64, 16)
block_table = torch.zeros((BS, 8), dtype=torch.int32)
model = CUDAGraphWrapper(lambda md: impl.forward_mqa(q, cache, md, layer)[0])
for length in (1, 2048, 2049, 2050, 2051):      # the capture's dummy step, then decode steps
    lens = torch.full((BS,), length, dtype=torch.int32)
    md = builder.build(0, CommonAttentionMetadata(
        query_start_loc=torch.arange(BS + 1), seq_lens=lens, num_reqs=BS, num_actual_tokens=BS,
        max_query_len=1, max_seq_len=length, block_table_tensor=block_table))
    with set_forward_context(md, None, cudagraph_runtime_mode=CUDAGraphMode.FULL,
                             batch_descriptor=BatchDescriptor(BS)):
        out = model(md)
print("scheduled for", int(out[0, 0]), "live", int(out[0, 1]))
