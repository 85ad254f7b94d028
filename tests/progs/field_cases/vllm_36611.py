"""vllm#36611 (stale FP8 FlashMLA tile scheduler metadata in FULL graphs; the fix merged as
vllm#35175): the installed vLLM's FlashMLAMetadataBuilder.build / _build_decode with an FP8 KV
cache and FlashMLAImpl.forward_mqa inside the real CUDAGraphWrapper (FULL, batch 4), captured
at the dummy length 1 and replayed at 2048.. tokens.

Bad (default): the builder is made while cudagraph_mode has no FULL graphs (PIECEWISE), so
_build_decode skips its copy into the persistent cg_buf_* buffers and hands on the fresh
tensors get_mla_metadata_dense_fp8 returns each step - the code path before vllm#35175 - while
the decode runs in a FULL graph, which keeps reading the capture's tensors.
MLATRACE_CASE_VARIANT=persistent: the builder is made under FULL_AND_PIECEWISE (the CUDA
platform's default), so every step's metadata is copied into cg_buf_* and the graph reads it.

Replaced, because they are CUDA-only (vllm.v1.attention.ops.flashmla raises "FlashMLA is not
available" without vllm._flashmla_C): the three FlashMLA calls the backend module imports -
get_mla_metadata (returns an empty FlashMLASchedMeta here), get_mla_metadata_dense_fp8 (a CPU
schedule: fresh (num_sm_parts, 8) and (batch + 1,) int32 tensors from the live seq lens, as
the kernel allocates) and flash_mla_with_kvcache_fp8 (a CPU launch through the HostGraph that
reads the scheduled length from the tile metadata). FlashMLAImpl is made without __init__
(which needs a kv_b_proj linear layer, a distributed group and asserts FlashMLA's Hopper
support); forward_mqa is the installed method. The builder's config and attention layer:
vllm_cpu_graph.mla_setup (the tiny DeepSeek-V2 MLA model of tests/e2e_vllm)."""

import os

import torch
import vllm_cpu_graph
from vllm.compilation.cuda_graph import CUDAGraphWrapper
from vllm.config.compilation import CUDAGraphMode
from vllm.forward_context import BatchDescriptor, set_forward_context
from vllm.utils.platform_utils import num_compute_units
from vllm.v1.attention.backends.mla import flashmla

from mlatrace.reference import graph

PERSISTENT = os.environ.get("MLATRACE_CASE_VARIANT") == "persistent"
BS, LAYER = 4, "model.layers.0.self_attn.attn"


def get_mla_metadata(cache_seqlens, num_q_tokens_per_head_k, num_heads_k, **kwargs):
    return flashmla.FlashMLASchedMeta(), None


def get_mla_metadata_dense_fp8(cache_seqlens, num_q_tokens_per_head_k, num_heads_k):
    parts = max(1, num_compute_units() // num_heads_k)
    tile = torch.zeros((parts, 8), dtype=torch.int32)
    splits = torch.zeros(cache_seqlens.shape[0] + 1, dtype=torch.int32)
    tile[:, 2] = cache_seqlens.max()            # end index of each part's work: the live length
    splits[1:] = torch.cumsum(torch.clamp(cache_seqlens // 1024, min=1), 0)
    return tile, splits


def flash_mla_with_kvcache_fp8(q, k_cache, block_table, cache_seqlens, head_dim_v,
                               tile_scheduler_metadata, num_splits, softmax_scale=None,
                               causal=False, descale_q=None, descale_k=None):
    out = torch.zeros(q.shape[0], q.shape[1], q.shape[2], head_dim_v)
    graph.launch(_attend, out, cache_seqlens, tile_scheduler_metadata)
    return out, torch.zeros(q.shape[0], q.shape[2], q.shape[1])


def _attend(out, cache_seqlens, tile):
    out[..., 0] = tile[0, 2].float()            # the length the schedule was made for
    out[..., 1] = cache_seqlens[0].float()      # the live length


flashmla.get_mla_metadata = get_mla_metadata
flashmla.get_mla_metadata_dense_fp8 = get_mla_metadata_dense_fp8
flashmla.flash_mla_with_kvcache_fp8 = flash_mla_with_kvcache_fp8
vllm_cpu_graph.install()

config, layer, builder = vllm_cpu_graph.mla_setup(
    flashmla.FlashMLAMetadataBuilder, "fp8",
    CUDAGraphMode.FULL_AND_PIECEWISE if PERSISTENT else CUDAGraphMode.PIECEWISE, LAYER)
hf = config.model_config.hf_config
head_size = hf.kv_lora_rank + hf.qk_rope_head_dim

impl = object.__new__(flashmla.FlashMLAImpl)
impl.kv_cache_dtype, impl.kv_lora_rank, impl.scale = "fp8", hf.kv_lora_rank, head_size ** -0.5
impl.num_heads, impl.need_to_return_lse_for_decode = hf.num_attention_heads, False
q = torch.zeros(BS, hf.num_attention_heads, head_size)
cache = torch.zeros(64, 64, head_size)
block_table = torch.zeros((BS, 32), dtype=torch.int32)
seq_lens = torch.zeros(BS, dtype=torch.int32)          # the runner's persistent input buffers
query_start = torch.arange(BS + 1, dtype=torch.int32)
model = CUDAGraphWrapper(lambda md: impl.forward_mqa(q, cache, md, layer)[0], config,
                         CUDAGraphMode.FULL)
for length in (1, 2048, 2049, 2050, 2051):      # the capture's dummy step, then decode steps
    md = builder.build(0, vllm_cpu_graph.decode_metadata(seq_lens, query_start, length,
                                                         block_table))
    with set_forward_context({LAYER: md}, config, cudagraph_runtime_mode=CUDAGraphMode.FULL,
                             batch_descriptor=BatchDescriptor(num_tokens=BS)):
        out = model(md)
print("scheduled for", int(out[0, 0, 0]), "live", int(out[0, 0, 1]))
