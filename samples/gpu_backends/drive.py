"""Real upstream Triton decode attention captured in torch CUDA graphs, replayed at long lengths.

    python samples/gpu_backends/drive.py vllm --capture one|max|bucket [--decide own]
    python samples/gpu_backends/drive.py sglang [--batch B]

Run under `mlatrace run --probes samples/gpu_backends/steps.toml` with PYTHONPATH holding
.vendor/vllm or .vendor/sglang (staged by vendor.py from the wheels) and this folder.

vllm: vLLM 0.33's `decode_attention_fwd` (TRITON_MLA's kernel), its split count from
TritonMLAImpl's `_compute_num_kv_splits(max_seq_len, sm_count)` decided inside the capture:
`one` captures at max_seq_len=1 (1 split), `max` at max_model_len=131072 (what vLLM 0.33's
capture sees: 256 splits on 132 SMs), `bucket` captures one graph per split value at a length
of that bucket and replays each graph only at lengths of its bucket (the healthy design).
`--decide own`: the split count comes from the driver's own host code (the same formula,
unprobed), as an engine no pack knows decides it: no host.decision is recorded, and only
the captured grids, the SM count and the replay times tell the frozen split (MLT008).

sglang: SGLang 0.5.23's `decode_attention_fwd` with `num_kv_splits` computed on the device by
`get_num_kv_splits_triton` before each replay (as TritonAttnBackend.get_num_kv_splits does);
the captured grid uses the fixed `max_kv_splits` (16): at batch 1 that is 16 CTAs on the
GPU whatever the length; `--batch 16` fills it (256 CTAs).

Prints one line per (variant, length): us per replay (CUDA events, mean of the replays).
The vllm variants run no eager reference after the replays (an eager launch of the same
kernel would read, in the trace, as a split re-decided between replays); sglang compares the
replayed output with an eager call of the unprobed function (`__wrapped__`).
"""

from __future__ import annotations

import argparse
import math

import steps
import torch

HEADS, KV_LORA, ROPE, PAGE = 16, 512, 64, 16
LENGTHS = (1024, 8192, 32768, 100000)
MAX_MODEL_LEN = 131072
REPLAYS = 20


def _cache(max_len: int, batch: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    pages = math.ceil(max_len / PAGE)
    total = pages * batch + 8
    kv = torch.randn(total, PAGE, 1, KV_LORA + ROPE, device=device, dtype=torch.bfloat16) * 0.3
    table = torch.randperm(total - 8, device=device, dtype=torch.int32)[: pages * batch]
    return kv, table.view(batch, pages)


def _time(graph: torch.cuda.CUDAGraph, n: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000 / n


def run_vllm(capture: str, decide: str = "host") -> None:
    from vllm.v1.attention.ops.triton_decode_attention import decode_attention_fwd

    dev, batch = "cuda", 1
    sm = torch.cuda.get_device_properties(0).multi_processor_count
    kv, table = _cache(MAX_MODEL_LEN + 512, batch, dev)
    one = torch.tensor(1.0, dtype=torch.float32, device=dev)  # layer k/v scales (bf16 cache)
    q = torch.randn(batch, HEADS, KV_LORA + ROPE, device=dev, dtype=torch.bfloat16)
    seq_lens = torch.zeros(batch, dtype=torch.int32, device=dev)
    scale = 1.0 / math.sqrt(KV_LORA + ROPE)

    def forward(max_seq_len: int) -> torch.Tensor:
        if decide == "own":  # an engine's own host code: nothing records the decision
            splits = steps.upstream_num_kv_splits(max_seq_len, sm)
        else:
            splits = steps.vllm_num_kv_splits(max_seq_len, sm)  # inside forward_mqa
        o = torch.zeros(batch, HEADS, KV_LORA, dtype=q.dtype, device=dev)
        lse = torch.zeros(batch, HEADS, dtype=q.dtype, device=dev)
        logits = torch.empty(batch, HEADS, splits, KV_LORA + 1, dtype=torch.float32, device=dev)
        decode_attention_fwd(q, kv, kv[..., :KV_LORA], o, lse, table, seq_lens, logits, splits,
                             scale, PAGE, k_scale=one, v_scale=one, is_mla=True)
        return o

    def graph_at(length: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        steps.fill_metadata(torch.tensor([length], dtype=torch.int32), seq_lens, dummy=True)
        forward(length)  # warm-up compiles the kernels for this split count
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = forward(length)
        return graph, out

    graphs: dict[int, tuple] = {}
    fixed = {"one": 1, "max": MAX_MODEL_LEN}.get(capture)
    for length in LENGTHS:
        for real in (length, length - 200):  # two lengths of one bucket
            if fixed is not None:
                key = fixed
            else:
                key = next((k for k in graphs if steps.upstream_num_kv_splits(k, sm)
                            == steps.upstream_num_kv_splits(real, sm)), real)
            if key not in graphs:
                graphs[key] = graph_at(key)
            graph, out = graphs[key]
            steps.fill_metadata(torch.tensor([real], dtype=torch.int32), seq_lens)
            us = _time(graph, REPLAYS)
            print(f"vllm capture={capture} decide={decide} len={real} splits="
                  f"{steps.upstream_num_kv_splits(key, sm)} us={us:.1f}", flush=True)


def run_sglang(batch: int = 1) -> None:
    from sglang.kernels.ops.attention.decode_attention import decode_attention_fwd
    from sglang.kernels.ops.attention.metadata import get_num_kv_splits_triton

    dev, max_kv_splits = "cuda", 16
    sm = torch.cuda.get_device_properties(0).multi_processor_count
    max_len = max(LENGTHS) + 512
    kv = torch.randn(max_len * batch + 64, 1, KV_LORA + ROPE, device=dev,
                     dtype=torch.bfloat16) * 0.3
    kv_indices = torch.randperm(max_len * batch, device=dev, dtype=torch.int64)
    kv_indptr = torch.zeros(batch + 1, dtype=torch.int32, device=dev)
    q = torch.randn(batch, HEADS, KV_LORA + ROPE, device=dev, dtype=torch.bfloat16)
    o = torch.zeros(batch, HEADS, KV_LORA, dtype=q.dtype, device=dev)
    logits = torch.empty(batch, HEADS, max_kv_splits, KV_LORA, dtype=torch.float32, device=dev)
    lse = torch.empty(batch, HEADS, max_kv_splits, dtype=torch.float32, device=dev)
    num_kv_splits = torch.empty(batch, dtype=torch.int32, device=dev)
    seq_lens = torch.zeros(batch, dtype=torch.int32, device=dev)
    scale = 1.0 / math.sqrt(KV_LORA + ROPE)

    def prepare(length: int, dummy: bool = False) -> None:
        steps.fill_metadata(torch.tensor([length] * batch, dtype=torch.int32), seq_lens,
                            dummy=dummy)
        kv_indptr[1:].copy_(torch.cumsum(seq_lens, 0))
        get_num_kv_splits_triton[(1,)](num_kv_splits, seq_lens, batch, 1, HEADS, 1,
                                       max_kv_splits, sm, MAX_NUM_SEQ=256)

    def forward() -> None:
        decode_attention_fwd(q, kv, kv[..., :KV_LORA], o, kv_indptr, kv_indices, logits, lse,
                             num_kv_splits, max_kv_splits, scale, 1.0, 1.0, has_mla=True)

    def reference() -> None:
        unprobed = getattr(decode_attention_fwd, "__wrapped__", decode_attention_fwd)
        unprobed(q, kv, kv[..., :KV_LORA], o, kv_indptr, kv_indices, logits, lse,
                 num_kv_splits, max_kv_splits, scale, 1.0, 1.0, has_mla=True)

    prepare(1, dummy=True)
    forward()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        forward()
    for length in LENGTHS:
        prepare(length)
        us = _time(graph, REPLAYS)
        got = o.clone()
        reference()
        err = ((got.float() - o.float()).abs().max() / o.float().abs().max()).item()
        print(f"sglang batch={batch} len={length} max_kv_splits={max_kv_splits} us={us:.1f} "
              f"rel_err_vs_eager={err:.2e}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("backend", choices=("vllm", "sglang"))
    parser.add_argument("--capture", choices=("one", "max", "bucket"), default="bucket")
    parser.add_argument("--decide", choices=("host", "own"), default="host",
                        help="vllm: split count from the probed step (host) or unprobed (own)")
    parser.add_argument("--batch", type=int, default=1, help="sglang: requests per step")
    args = parser.parse_args()
    if args.backend == "vllm":
        run_vllm(args.capture, args.decide)
    else:
        run_sglang(args.batch)


if __name__ == "__main__":
    main()
