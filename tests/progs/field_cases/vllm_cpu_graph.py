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
