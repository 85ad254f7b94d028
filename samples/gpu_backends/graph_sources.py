"""One CUDA graph capture, its kernel nodes read from every source this machine has.

    PYTHONPATH=$PWD python3 samples/gpu_backends/graph_sources.py [--json FILE]

Captures a small decode-like step (a fill, a GEMM, a softmax and one Triton kernel on a
(4, 2) grid) with keep_graph=True, instantiates it, then reads its kernel nodes:

- `dot`: mlatrace's DOT path (CUDAGraph.debug_dump, parsed);
- `torch`: CUDAGraph.get_graph_data() where this torch has it and it gives grid dims
  (pytorch#183165, #196018), else the reason it cannot;
- `driver`: the driver's own kernel-node params through cuda.bindings
  (cudaGraphGetNodes, cuGraphKernelNodeGetParams, cuFuncGetName), where cuda.bindings is
  installed: an independent reading of the same template to check the DOT parse against;

and which source mlatrace's feature detection picks here (`mlatrace.probe.graph_data`).
Prints one JSON object; `same_*` compare each source's kernels with DOT's as multisets
(the sources list nodes in different orders).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from typing import Any

import torch


def _triton_kernel() -> Any:
    import triton
    import triton.language as tl

    @triton.jit
    def _scale_rows_kernel(x_ptr, n_cols, BLOCK: tl.constexpr):
        row, part = tl.program_id(0), tl.program_id(1)
        cols = part * BLOCK + tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(x_ptr + row * n_cols + cols, mask=mask)
        tl.store(x_ptr + row * n_cols + cols, x * 0.5, mask=mask)

    return _scale_rows_kernel


def capture() -> torch.cuda.CUDAGraph:
    """A keep_graph=True graph of a few torch ops and one Triton launch, instantiated."""
    kernel = _triton_kernel()
    a = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(64, 256, device="cuda", dtype=torch.bfloat16)
    x = torch.empty(4, 256, device="cuda", dtype=torch.float32)

    def step() -> None:
        x.fill_(1.0)
        torch.mm(a, b, out=out)
        torch.softmax(out.float(), dim=-1)
        kernel[(4, 2)](x, 256, BLOCK=128)

    step()   # compile and warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph(keep_graph=True)
    graph.enable_debug_mode()   # torch 2.11 dumps DOT only with it (what the probe asks too)
    with torch.cuda.graph(graph):
        step()
    graph.instantiate()
    return graph


def from_driver(graph: Any) -> tuple[list[dict] | None, str | None]:
    """The template's kernel nodes from the driver's node params (cuda.bindings)."""
    try:
        from cuda.bindings import driver, runtime
    except ImportError as exc:
        return None, f"no cuda.bindings: {exc}"
    raw = graph.raw_cuda_graph()
    err, _, count = runtime.cudaGraphGetNodes(raw, numNodes=0)
    err, nodes, count = runtime.cudaGraphGetNodes(raw, numNodes=count)
    if err != runtime.cudaError_t.cudaSuccess:
        return None, f"cudaGraphGetNodes: {err}"
    kernels = []
    for node in nodes[:count]:
        err, kind = runtime.cudaGraphNodeGetType(node)
        if kind != runtime.cudaGraphNodeType.cudaGraphNodeTypeKernel:
            continue
        err, params = driver.cuGraphKernelNodeGetParams(driver.CUgraphNode(init_value=int(node)))
        if err != driver.CUresult.CUDA_SUCCESS:
            return None, f"cuGraphKernelNodeGetParams: {err}"
        err, name = driver.cuFuncGetName(driver.CUfunction(init_value=int(params.func)))
        if err != driver.CUresult.CUDA_SUCCESS:
            return None, f"cuFuncGetName: {err}"
        kernels.append({"name": name.decode() if isinstance(name, bytes) else str(name),
                        "grid": [params.gridDimX, params.gridDimY, params.gridDimZ],
                        "block": [params.blockDimX, params.blockDimY, params.blockDimZ],
                        "smem": params.sharedMemBytes})
    return kernels, None


def _same(a: list[dict] | None, b: list[dict] | None) -> bool | None:
    if a is None or b is None:
        return None
    key = [(k["name"], tuple(k["grid"]), tuple(k["block"]), k["smem"]) for k in a]
    other = [(k["name"], tuple(k["grid"]), tuple(k["block"]), k["smem"]) for k in b]
    return Counter(key) == Counter(other)


def sources() -> dict[str, Any]:
    """Every source's kernels for one capture, and mlatrace's choice here."""
    from mlatrace.probe import graph_data

    graph = capture()
    dot, dot_error = graph_data.from_dot(graph, 1)
    torch_kernels, torch_why = graph_data.from_torch(graph)
    driver_kernels, driver_why = from_driver(graph)
    graph_data.reset()
    chosen = graph_data.read_nodes(graph, 1, instantiated=True)
    cls = torch.cuda.CUDAGraph
    return {
        "torch": torch.__version__,
        "cuda_driver": torch.cuda.driver_version() if hasattr(torch.cuda, "driver_version")
        else None,
        "features": {"get_graph_data": hasattr(cls, "get_graph_data"),
                     "post_instantiate_hook": graph_data.has_instantiate_hook(cls),
                     "replay_hooks": hasattr(cls, "register_replay_start_hook")},
        "dot": dot, "dot_error": dot_error,
        "torch_source": torch_kernels, "torch_why": torch_why,
        "driver": driver_kernels, "driver_why": driver_why,
        "chosen": chosen["source"], "chosen_why": chosen.get("source_why"),
        "chosen_kernels": chosen["kernels"],
        "same_torch": _same(torch_kernels, dot), "same_driver": _same(driver_kernels, dot),
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args()
    result = sources()
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as out:
            out.write(text + "\n")
    return 0 if result["dot"] and result["same_driver"] is not False \
        and result["same_torch"] is not False else 1


if __name__ == "__main__":
    sys.exit(main())
