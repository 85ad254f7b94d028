"""Three eager device-policy calls at 100K tokens, for Nsight Compute (GPU_NOTES.md run 5).

ncu --clock-control none -k regex:_mla_stage1 --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
    python3 samples/gpu_ncu_stage1.py
"""

import math

import torch

from mlatrace.bench import splits_bench as sb
from mlatrace.reference import mla

s = sb.make_sets(100_000, 16, "cuda", num_sets=1)[0]
for _ in range(3):
    mla.mla_gluon(s["q_nope"], s["q_pe"], s["kv_c"], s["o"], s["page_table"], s["seq_info"],
                  1 / math.sqrt(576), policy="device")
torch.cuda.synchronize()
