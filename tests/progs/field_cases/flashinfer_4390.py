"""flashinfer#4390: vLLM FLASHINFER_MLA decode graphs (batch 4) where FlashInfer's autotuner
picks the MLA decode runner per batch size, profiled at one KV length (1024: trtllm-gen), and
the graphs replay at 65536 tokens, where the other runner is the faster one.

The installed vLLM's FlashInferMLAMetadataBuilder.build and FlashInferMLAImpl.forward_mqa run
in its CUDAGraphWrapper (captured into the HostGraph: vllm_cpu_graph.py) over the FlashInfer
stand-in (flashinfer_site: FlashInfer does not install here). Bad (default): 128 query heads,
which trtllm-gen tiles, so vLLM passes no backend (FlashInfer's "auto": the autotuner picks
per graph). MLATRACE_CASE_VARIANT=heads_96: 96 heads, which it cannot, so vLLM names the
backend ("cute-dsl") and nothing is chosen per graph (as the issue's resolution: one backend
at every length).

Replaced, because it allocates on "cuda": flashinfer_mla._get_workspace_buffer (a CPU int8
buffer here). FlashInferMLAImpl is made without __init__ (it needs a kv_b_proj linear layer
and a distributed group); forward_mqa is the installed method."""

import os

import torch
import vllm_cpu_graph
from flashinfer.autotuner import autotune
from vllm.compilation.cuda_graph import CUDAGraphWrapper
from vllm.config.compilation import CUDAGraphMode
from vllm.forward_context import BatchDescriptor, set_forward_context
from vllm.v1.attention.backends.mla import flashinfer_mla

HEADS = 96 if os.environ.get("MLATRACE_CASE_VARIANT") == "heads_96" else 128
BS, LAYER = 4, "model.layers.0.self_attn.attn"

flashinfer_mla._get_workspace_buffer = lambda return_lse: torch.zeros(1024, dtype=torch.int8)
vllm_cpu_graph.install()
config, layer, builder = vllm_cpu_graph.mla_setup(
    flashinfer_mla.FlashInferMLAMetadataBuilder, "auto", CUDAGraphMode.FULL_AND_PIECEWISE, LAYER)
hf = config.model_config.hf_config
head_size = hf.kv_lora_rank + hf.qk_rope_head_dim

impl = object.__new__(flashinfer_mla.FlashInferMLAImpl)
impl.kv_cache_dtype, impl.scale, impl.dcp_world_size = "auto", head_size ** -0.5, 1
impl.kv_lora_rank, impl.qk_nope_head_dim, impl.qk_rope_head_dim = (
    hf.kv_lora_rank, hf.qk_nope_head_dim, hf.qk_rope_head_dim)
impl.bmm1_scale = impl.bmm2_scale = impl._mla_counter_bytes = None
impl._mla_counter_max_batch = BS
q = torch.zeros(BS, HEADS, head_size)
cache = torch.zeros(64, 64, head_size)                   # 64-token pages
block_table = torch.zeros((BS, 1024), dtype=torch.int32)
seq_lens = torch.zeros(BS, dtype=torch.int32)            # the runner's persistent input buffers
query_start = torch.arange(BS + 1, dtype=torch.int32)
model = CUDAGraphWrapper(lambda md: impl.forward_mqa(q, cache, md, layer)[0], config,
                         CUDAGraphMode.FULL)


def step(length: int, mode) -> torch.Tensor:
    md = builder.build(0, vllm_cpu_graph.decode_metadata(seq_lens, query_start, length,
                                                         block_table))
    with set_forward_context({LAYER: md}, config, cudagraph_runtime_mode=mode,
                             batch_descriptor=BatchDescriptor(num_tokens=BS)):
        return model(md)


with autotune():                          # the warm-up's tuning run, eager
    step(1024, CUDAGraphMode.NONE)
step(1, CUDAGraphMode.FULL)               # the capture's dummy step
for n in range(4):
    out = step(65536 + n, CUDAGraphMode.FULL)
row = out.reshape(-1, 2)[0]               # the stand-in kernel's (live length, runner) per row
print("runner", "trtllm-gen" if row[1] == 1 else "cute-dsl", "at", int(row[0]))
