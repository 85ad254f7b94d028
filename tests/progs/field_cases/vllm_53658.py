"""vllm#53658 (FULL-graph dummy runs give every dummy request seq_len = num_tokens, past
max_model_len when a capture size exceeds it; bounded in vllm#53671): the installed vLLM's
engine (LLM, the tiny DeepSeek-V2 MLA model of tests/e2e_vllm, --max-model-len 16, 32 seqs,
block size 16: one block-table page a row) and its GPUModelRunner._dummy_run at the capture
sizes [8, 16, 32] (bad) or, MLATRACE_CASE_VARIANT=bounded, [8, 16] (the sizes bounded by
max_model_len, the configuration that avoids the bug).

What differs from a CUDA run: vLLM's CPU platform sets cudagraph_mode NONE, so the runner
captures no graph and its dispatcher refuses cudagraph_runtime_mode=FULL. The program calls
the real _dummy_run(num_tokens, force_attention=True), which takes the same branch as a FULL
capture's dummy run (`if force_attention or cudagraph_runtime_mode == CUDAGraphMode.FULL`:
optimistic_seq_lens_cpu[:num_reqs] = max_query_len) and builds the real attention metadata
(CPU MLA, MLACommonMetadataBuilder.build). On CUDA the 32-token capture then fails in
TRITON_ATTN's unified_attention (an unmasked block-table read past the row); here the CPU
runner's block-table rows hold 8 pages of 16 tokens, so the dummy lengths fit and nothing
fails: the trace keeps the dummy builds' seq_len_max beside max_model_len and the
block-table shape, the host half of the bug. The capture failure needs CUDA vLLM."""

import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")   # the runner in this process

import vllm_cpu_graph  # noqa: E402
from vllm import LLM, SamplingParams  # noqa: E402

SIZES = [8, 16] if os.environ.get("MLATRACE_CASE_VARIANT") == "bounded" else [8, 16, 32]

llm = LLM(model=str(vllm_cpu_graph.TINY_MODEL), dtype="bfloat16", max_model_len=16,
          max_num_seqs=32, max_num_batched_tokens=32, block_size=16, enforce_eager=True)
runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
for size in sorted(SIZES, reverse=True):       # the order capture_model walks the sizes
    runner._dummy_run(size, force_attention=True)
out = llm.generate(["a b c d"] * 4, SamplingParams(max_tokens=4, ignore_eos=True))
table = runner.input_batch.block_table.block_tables[0]
print("dummy sizes", SIZES, "block table", tuple(table.block_table.cpu.shape), "of",
      table.block_size, "tokens a page; generated", [len(o.outputs[0].token_ids) for o in out])
