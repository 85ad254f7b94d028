"""Where does a traced eager Triton launch spend its time? (H200 diagnostic, GPU_RUNS.md)

Run from the repo root on a CUDA machine: PYTHONPATH=$PWD python3 samples/gpu_prof_launch.py
"""

import cProfile
import pstats
import statistics
import tempfile
import time

import torch
import triton
import triton.language as tl

from mlatrace import probe, record
from mlatrace.probe.packs import shipped_pack_dir


@triton.jit
def _split_kv_stage1_kernel(x_ptr, o_ptr, n, NUM_KV_SPLITS: tl.constexpr):
    pid = tl.program_id(0)
    tl.store(o_ptr + pid, tl.load(x_ptr + pid) * NUM_KV_SPLITS)


x = torch.ones(64, device="cuda")
o = torch.zeros(64, device="cuda")


def loop(n: int) -> None:
    for _ in range(n):
        _split_kv_stage1_kernel[(8,)](x, o, 64, NUM_KV_SPLITS=4)
    torch.cuda.synchronize()


def median_us(n: int = 2000, repeats: int = 7) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter_ns()
        loop(n)
        samples.append((time.perf_counter_ns() - start) / n / 1e3)
    return statistics.median(samples)


if __name__ == "__main__":
    loop(10)
    print("untraced us/launch", median_us())
    probe.install([shipped_pack_dir() / "triton_launch.toml"])
    loop(10)
    print("probe, no recorder", median_us())
    record.start(tempfile.mkdtemp())
    loop(10)
    print("probe + recorder", median_us())
    cProfile.run("loop(2000)", "/tmp/mlatrace-launch.prof")
    pstats.Stats("/tmp/mlatrace-launch.prof").sort_stats("tottime").print_stats(25)
    record.stop()
