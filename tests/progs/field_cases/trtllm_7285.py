"""TensorRT-LLM#7285: a decode graph per batch size (1, 8) whose MoE GEMM asks the autotuner
for its tactic while capturing. Bad: the warm-up autotunes only the max-token shape (128), so
each capture misses the cache and freezes the fallback tactic -1. MLATRACE_CASE_VARIANT=
tune_graph_sizes: the warm-up also autotunes the graphs' batch sizes (the fix), so each
capture freezes a profiled tactic."""

import os

import torch
from tensorrt_llm._torch.autotuner import AutoTuner, autotune
from tensorrt_llm._torch.pyexecutor.cuda_graph_runner import DecodingCUDAGraphRunner

from mlatrace.reference import graph

RUNNERS = ["trtllm_gen_moe"]
out = {}


def moe(inputs):
    hidden = inputs["input_ids"].float().unsqueeze(1).expand(-1, 64)
    _, tactic = AutoTuner.get().choose_one("trtllm::fused_moe", RUNNERS, None, [hidden])
    result = torch.zeros(hidden.shape[0])
    graph.launch(lambda: result.copy_(hidden.sum(1) + tactic))
    return result


sizes = (128, 1, 8) if os.environ.get("MLATRACE_CASE_VARIANT") == "tune_graph_sizes" else (128,)
with autotune():
    for n in sizes:
        moe({"input_ids": torch.ones(n, dtype=torch.int32)})
runners = {bs: DecodingCUDAGraphRunner(bs, "cpu", None) for bs in (1, 8)}
for runner in runners.values():
    runner.capture(moe)
for step in range(3):
    for bs, runner in runners.items():
        runner.run({"input_ids": torch.full((bs,), step, dtype=torch.int32)})
