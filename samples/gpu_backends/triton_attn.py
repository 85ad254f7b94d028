"""vLLM TRITON_ATTN's 2D / 3D kernel choice, captured in torch CUDA graphs at a batch above the
threshold and replayed at long contexts, with vLLM 0.33's own unified-attention kernels.

    python samples/gpu_backends/triton_attn.py stage /tmp/src .vendor-triton-attn
    PYTHONPATH=$PWD:.vendor-triton-attn/vllm:samples/gpu_backends \\
      python -m mlatrace run --probes samples/gpu_backends/triton_attn.toml -- \\
      python samples/gpu_backends/triton_attn.py run

`stage` copies, unmodified, the modules `vllm/v1/attention/ops/triton_unified_attention.py`
imports (the closure vendor.py computes from module-level imports), the wheel's dist-info
(so the shipped vllm_triton_attn pack sees vllm 0.33.0 and attaches to the real
`unified_attention`), and `vllm/v1/attention/backends/triton_attn.py` for the threshold
constants (read by ast, never imported). Nothing staged is committed.

`run` builds one paged KV cache (Llama-3-8B attention: 32 query heads, 8 KV heads, head 128,
bf16, page 16) and captures two graphs of one decode step at the same batch:

- `vllm`: the threshold TritonAttentionMetadataBuilder computes, MIN_LAUNCH_GRID_SIZE_2D //
  num_kv_heads snapped to the nearest capture size (16 here). The batch is above it, so the
  capture takes the 2D kernel (one KV split).
- `3d`: the threshold raised to the batch, so the same call takes the 3D kernel with
  NUM_PAR_SOFTMAX_SEGMENTS segments (what a KV-length-aware choice would pick at long context).

Both graphs are replayed at each context length; the line per length gives us per replay
(CUDA events, mean of REPLAYS) for both and their outputs' difference. Warm-ups go through
the unprobed function (`__wrapped__`), so the trace's only decisions are the captures'.
`--small` runs tiny shapes (CPU, TRITON_INTERPRET=1) to test the driver.
"""

from __future__ import annotations

import argparse
import ast
import math
import os
import shutil
import sys
from pathlib import Path

HEADS, KV_HEADS, HEAD, PAGE = 32, 8, 128, 16
CAPTURE_SIZES = [1, 2, 4] + list(range(8, 256, 8))  # vllm 0.33.0 default (compilation.py)
ENTRY = "vllm.v1.attention.ops.triton_unified_attention"


def stage(src_dir: str, out_dir: str) -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    import vendor

    src, out = Path(src_dir), Path(out_dir)
    dest_root = out / "vllm"
    if dest_root.exists():
        shutil.rmtree(dest_root)
    files = vendor.closure(src, [ENTRY], "vllm")
    for path in files.values():
        dest = dest_root / path.relative_to(src)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, dest)
    for info in src.glob("vllm-*.dist-info"):
        shutil.copytree(info, dest_root / info.name)
    upstream = out / "upstream"
    upstream.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src / "vllm/v1/attention/backends/triton_attn.py", upstream / "triton_attn.py")
    print(f"vllm: {len(files)} modules copied to {dest_root}")


def upstream_constants(vendor_dir: Path) -> dict[str, int]:
    """MIN_LAUNCH_GRID_SIZE_2D and NUM_PAR_SOFTMAX_SEGMENTS from the wheel's triton_attn.py."""
    tree = ast.parse((vendor_dir / "upstream" / "triton_attn.py").read_text())
    wanted = {"MIN_LAUNCH_GRID_SIZE_2D", "NUM_PAR_SOFTMAX_SEGMENTS"}
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id in wanted:
                    found[target.id] = int(node.value.value)
    missing = wanted - set(found)
    if missing:
        raise SystemExit(f"triton_attn.py: {', '.join(sorted(missing))} not found")
    return found


def vllm_threshold(min_grid: int, num_kv_heads: int, capture_sizes: list[int]) -> int:
    """TritonAttentionMetadataBuilder.__init__'s seq_threshold_3D with decode graphs on."""
    threshold = min_grid // num_kv_heads
    return min(capture_sizes, key=lambda x: abs(x - threshold))


def fill_metadata(seq_lens_cpu, seq_lens, dummy: bool = False) -> None:  # noqa: ANN001
    """The step's metadata build: host sequence lengths into the graph's static buffer
    (probed by triton_attn.toml as attn.metadata, as vLLM's builders are)."""
    seq_lens[: seq_lens_cpu.numel()].copy_(seq_lens_cpu, non_blocking=True)


def run(small: bool) -> None:
    import torch
    import triton_attn as this  # the module (probed), not __main__: its fill_metadata
    from vllm.v1.attention.ops.triton_unified_attention import unified_attention

    vendor_dir = Path(os.environ.get("MLATRACE_VENDOR", ".vendor-triton-attn"))
    consts = upstream_constants(vendor_dir)
    segments = consts["NUM_PAR_SOFTMAX_SEGMENTS"]
    dev = "cpu" if small else "cuda"
    dtype = torch.float16 if small else torch.bfloat16  # the interpreter has no bf16 math
    heads, kv_heads, head = (8, 2, 32) if small else (HEADS, KV_HEADS, HEAD)
    threshold = vllm_threshold(consts["MIN_LAUNCH_GRID_SIZE_2D"], kv_heads, CAPTURE_SIZES)
    batch = 24 if small else 32
    if small:
        threshold = 8  # a batch above it, at tiny shapes
    lengths = (64, 200) if small else (1024, 8192, 32768, 100000)
    replays = 2 if small else 20
    max_len = max(lengths) + PAGE
    pages = math.ceil(max_len / PAGE)
    torch.manual_seed(0)
    total = pages * batch + 8
    k_cache = torch.randn(total, PAGE, kv_heads, head, device=dev, dtype=dtype) * 0.3
    v_cache = torch.randn_like(k_cache)
    table = torch.randperm(total - 8, device=dev, dtype=torch.int32)[: pages * batch]
    table = table.view(batch, pages)
    q = torch.randn(batch, heads, head, device=dev, dtype=dtype)
    cu_q = torch.arange(batch + 1, device=dev, dtype=torch.int32)
    seq_lens = torch.zeros(batch, dtype=torch.int32, device=dev)
    pad = 1 << (head - 1).bit_length()
    scratch = (torch.empty(batch, heads, segments, pad, dtype=torch.float32, device=dev),
               torch.empty(batch, heads, segments, dtype=torch.float32, device=dev),
               torch.empty(batch, heads, segments, dtype=torch.float32, device=dev))
    scale = 1.0 / math.sqrt(head)
    # layer._k_scale / _v_scale expanded to (num_seqs, num_kv_heads), as TritonAttentionImpl does
    descale = torch.ones(1, dtype=torch.float32, device=dev).expand(batch, kv_heads)
    outs = {}

    def reference(length: int) -> torch.Tensor:
        """Sequence 0's attention in plain torch (fp32), from the same paged cache."""
        rows = table[0, : math.ceil(length / PAGE)].long()
        keys = k_cache[rows].reshape(-1, kv_heads, head)[:length].float()
        vals = v_cache[rows].reshape(-1, kv_heads, head)[:length].float()
        group = heads // kv_heads
        qf = q[0].float().view(kv_heads, group, head)
        scores = torch.einsum("hgd,lhd->hgl", qf, keys) * scale
        return torch.einsum("hgl,lhd->hgd", scores.softmax(-1), vals).reshape(heads, head)

    def forward(fn, name: str, seq_threshold: int, max_seqlen_k: int) -> None:
        fn(q, k_cache, v_cache, outs[name], cu_q, 1, seq_lens, max_seqlen_k, scale, True,
           (-1, -1), table, 0, None, descale, descale, seq_threshold_3D=seq_threshold,
           num_par_softmax_segments=segments, softmax_segm_output=scratch[0],
           softmax_segm_max=scratch[1], softmax_segm_expsum=scratch[2])

    variants = {"vllm": threshold, "3d": batch}
    unprobed = getattr(unified_attention, "__wrapped__", unified_attention)
    # the capture's dummy metadata, as build_for_cudagraph_capture (seq_lens 1)
    this.fill_metadata(torch.ones(batch, dtype=torch.int32), seq_lens, dummy=True)
    graphs = {}
    for name, seq_threshold in variants.items():
        outs[name] = torch.zeros_like(q)
        forward(unprobed, name, seq_threshold, 1)  # warm-up: compiles, records nothing
        if small:
            graphs[name] = None
            forward(unified_attention, name, seq_threshold, 1)  # no graphs on CPU
            continue
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            forward(unified_attention, name, seq_threshold, 1)
        graphs[name] = graph
    print(f"triton_attn threshold={threshold} (MIN_LAUNCH_GRID_SIZE_2D="
          f"{consts['MIN_LAUNCH_GRID_SIZE_2D']} // {kv_heads} kv heads, snapped to a capture "
          f"size) batch={batch} segments={segments}", flush=True)
    for length in lengths:
        this.fill_metadata(torch.full((batch,), length, dtype=torch.int32), seq_lens)
        line = [f"triton_attn len={length}"]
        for name, graph in graphs.items():
            if graph is None:
                forward(unprobed, name, variants[name], length)
                line.append(f"{name}=eager")
                continue
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(replays):
                graph.replay()
            end.record()
            end.synchronize()
            line.append(f"{name}_us={start.elapsed_time(end) * 1000 / replays:.1f}")
        ref = reference(length)
        for name in graphs:
            got = outs[name][0].float()
            err = ((got - ref).abs().max() / ref.abs().max().clamp_min(1e-6)).item()
            line.append(f"{name}_rel_err={err:.1e}")
        print(" ".join(line), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="cmd", required=True)
    st = sub.add_parser("stage")
    st.add_argument("src")
    st.add_argument("out")
    rn = sub.add_parser("run")
    rn.add_argument("--small", action="store_true")
    args = parser.parse_args()
    if args.cmd == "stage":
        stage(args.src, args.out)
    else:
        run(args.small)


if __name__ == "__main__":
    main()
