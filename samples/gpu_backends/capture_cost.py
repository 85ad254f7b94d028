"""What recording kernel nodes costs per capture: N CUDA-graph captures of K kernel nodes.

    python samples/gpu_backends/capture_cost.py --graphs 70 --ops 300

Each graph is one `torch.cuda.graph` capture of `ops` multiply-adds on a small tensor
(2 x ops kernel nodes, about a vLLM decode graph's 600), kept alive as an engine keeps its
graphs. Prints one JSON line: the median and mean wall time of a capture (the `with
torch.cuda.graph` block, torch's own synchronize included). Run it untraced, under
`mlatrace run --no-graph-nodes` and under `mlatrace run` (kernel nodes on, the default)
and compare; the trace's `graph.nodes` records also carry `dump_ns`, the node dump alone.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--graphs", type=int, default=70)
    parser.add_argument("--ops", type=int, default=300)
    args = parser.parse_args()
    x = torch.randn(4096, device="cuda")

    def body() -> torch.Tensor:
        y = x
        for _ in range(args.ops):
            y = y * 1.0001 + 0.5   # two kernel nodes
        return y

    body()
    torch.cuda.synchronize()
    kept, ms = [], []
    for _ in range(args.graphs):
        graph = torch.cuda.CUDAGraph()
        t0 = time.perf_counter()
        with torch.cuda.graph(graph):
            body()
        ms.append((time.perf_counter() - t0) * 1e3)
        kept.append(graph)
    kept[-1].replay()
    torch.cuda.synchronize()
    print(json.dumps({"bench": "capture_cost", "graphs": args.graphs, "nodes": 2 * args.ops,
                      "capture_ms_median": round(statistics.median(ms), 3),
                      "capture_ms_mean": round(statistics.mean(ms), 3)}), flush=True)


if __name__ == "__main__":
    main()
