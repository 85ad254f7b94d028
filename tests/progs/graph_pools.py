"""Three torch CUDA graphs (GPU): two with their own private pools, the third in the
first one's pool; only the first is replayed, then the process lives on `HOLD` seconds.

Traced by tests/test_graph_use_pools.py::test_two_real_captures_one_replayed_on_gpu.
Each capture's body and capture_end run with torch.cuda.set_sync_debug_mode("error"): a
synchronising read in capture_end's probe would raise (a probe.error in the trace).
"""

from __future__ import annotations

import sys
import time

import torch

HOLD = float(sys.argv[1]) if len(sys.argv) > 1 else 1.5
REPLAYS = 5


def body(x: torch.Tensor, w: torch.Tensor, scale: float) -> torch.Tensor:
    y = (x @ w) * scale                # 4 MiB each: new blocks of the capture's pool
    return torch.cat([y, y + 1.0])     # 8 MiB


def main() -> int:
    x = torch.randn(1024, 1024, device="cuda")
    w = torch.randn(1024, 1024, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):    # warm-up (cuBLAS) on the capture stream
        for _ in range(2):
            body(x, w, 1.0)
    torch.cuda.synchronize()
    graphs, outs = [], []
    for scale, pool in ((1.0, None), (2.0, None), (3.0, "first")):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream):
            if pool is None:
                graph.capture_begin()
            else:
                graph.capture_begin(pool=graphs[0].pool())
            torch.cuda.set_sync_debug_mode("error")   # the body and capture_end (its probe)
            try:
                outs.append(body(x, w, scale))
                graph.capture_end()
            finally:
                torch.cuda.set_sync_debug_mode(0)
        graphs.append(graph)
    torch.cuda.synchronize()
    for _ in range(REPLAYS):
        graphs[0].replay()
    torch.cuda.synchronize()
    print(f"reserved {torch.cuda.memory_reserved()} bytes; holding {HOLD} s", flush=True)
    time.sleep(HOLD)   # the graphs never replayed keep their memory meanwhile
    return 0


if __name__ == "__main__":
    sys.exit(main())
