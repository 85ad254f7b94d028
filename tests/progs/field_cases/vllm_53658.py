"""vllm#53658: FULL capture sizes [8, 16, 32] with --max-model-len 16 (block size 16: one page
a row). The capture at 32 tokens gives its dummy request seq_len 32 > max_model_len and
fails. MLATRACE_CASE_VARIANT=clamp: the dummy lengths are bounded (vllm#53671); the graphs
capture and serve decode steps."""

import sys

from vllm.v1.worker.gpu_model_runner import GPUModelRunner

runner = GPUModelRunner(max_model_len=16, max_num_reqs=32)
try:
    runner.capture_model([8, 16, 32])
except RuntimeError as error:
    print("capture failed:", error)
    sys.exit(1)
for step in range(4):
    runner.execute_model(8, 9 + step)
