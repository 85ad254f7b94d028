"""Run vLLM's real CUDAGraphWrapper on CPU: its torch.cuda graph calls go to the project's
reference HostGraph (mlatrace.reference.graph), which records the launches made while
capturing and re-runs them at replay, as a CUDA graph does with kernels.

Replaced, because the CPU build has no CUDA graphs: torch.cuda.CUDAGraph (-> HostGraph),
torch.cuda.graph (-> HostGraph.capture_begin/capture_end), and in vllm.compilation.cuda_graph
current_stream (a CUDA stream), set_graph_pool_id / graph_pool_handle (a CUDA graph pool) and
weak_ref_tensors (the CPU build has no torch.ops._C.weak_ref_tensor: the output stays a plain
reference).
Everything else CUDAGraphWrapper.__call__ does (forward context, batch descriptor, entry per
descriptor, capture once, replay after) is the installed vLLM's code."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import torch

from mlatrace.reference.graph import HostGraph

TINY_MODEL = Path(os.environ.get("MLATRACE_TINY_MODEL",
                                 Path.home() / ".cache" / "mlatrace" / "tiny-deepseek-v2-mla"))


@contextlib.contextmanager
def _host_graph(graph: HostGraph, pool=None, stream=None, capture_error_mode="global"):
    graph.capture_begin()
    try:
        yield
    finally:
        graph.capture_end()


def install() -> None:
    """Point vLLM's graph capture at HostGraph (call before the first capture)."""
    import vllm.compilation.cuda_graph as cuda_graph
    import vllm.compilation.cudagraph_pool as cudagraph_pool
    from vllm.platforms import current_platform

    torch.cuda.CUDAGraph = HostGraph
    torch.cuda.graph = _host_graph
    cuda_graph.current_stream = lambda: None
    cuda_graph.weak_ref_tensors = lambda tensors: tensors
    cudagraph_pool.set_graph_pool_id = lambda pool: None
    current_platform.graph_pool_handle = lambda: None
    current_platform.get_global_graph_pool = lambda: None


class _PrefillBackend:
    """The layer's MLA prefill backend: the field cases build decode batches only."""

    @classmethod
    def clone(cls):
        return cls


def mla_setup(builder_cls, cache_dtype: str, cudagraph_mode, layer_name: str):
    """(config, layer, builder) for an MLA backend's real metadata builder on CPU.

    The VllmConfig is the tiny DeepSeek-V2 MLA model's (tests/e2e_vllm) with `cache_dtype`;
    the CPU platform sets cudagraph_mode NONE, so `cudagraph_mode` (a CUDAGraphMode) is put
    back as a CUDA platform would have it. The builder reads the model's attention layer from
    static_forward_context: registered here with the model's MLA dims and unit q/k scales."""
    from vllm.config import CacheConfig, ModelConfig, VllmConfig, set_current_vllm_config
    from vllm.v1.kv_cache_interface import MLAAttentionSpec

    model_config = ModelConfig(model=str(TINY_MODEL), max_model_len=2048)
    config = VllmConfig(model_config=model_config,
                        cache_config=CacheConfig(cache_dtype=cache_dtype))
    config.compilation_config.cudagraph_mode = cudagraph_mode
    hf = model_config.hf_config

    class Layer:
        """The model's MLA attention layer as the builder and forward_mqa read it."""
        q_lora_rank, kv_lora_rank = hf.q_lora_rank, hf.kv_lora_rank
        qk_nope_head_dim, qk_rope_head_dim = hf.qk_nope_head_dim, hf.qk_rope_head_dim
        v_head_dim = hf.v_head_dim
        prefill_backend = _PrefillBackend
        _q_scale, _k_scale = torch.ones(()), torch.ones(())
        _q_scale_float = _k_scale_float = 1.0

    layer = Layer()
    layer.layer_name = layer_name
    config.compilation_config.static_forward_context[layer_name] = layer
    spec = MLAAttentionSpec(block_size=64, num_kv_heads=1,
                            head_size=hf.kv_lora_rank + hf.qk_rope_head_dim,
                            dtype=torch.uint8 if cache_dtype.startswith("fp8") else torch.bfloat16,
                            cache_dtype_str=cache_dtype)
    with set_current_vllm_config(config):
        builder = builder_cls(spec, [layer_name], config, torch.device("cpu"))
    return config, layer, builder


def decode_metadata(seq_lens: torch.Tensor, query_start: torch.Tensor, length: int,
                    block_table: torch.Tensor):
    """The CommonAttentionMetadata of a one-token-a-request decode step at `length`,
    over the runner's persistent seq_lens / query_start_loc buffers."""
    from vllm.v1.attention.backend import CommonAttentionMetadata

    batch = seq_lens.shape[0]
    seq_lens.fill_(length)
    return CommonAttentionMetadata(
        query_start_loc=query_start, query_start_loc_cpu=query_start, seq_lens=seq_lens,
        num_reqs=batch, num_actual_tokens=batch, max_query_len=1, max_seq_len=length,
        block_table_tensor=block_table, slot_mapping=torch.zeros(batch, dtype=torch.int64))
