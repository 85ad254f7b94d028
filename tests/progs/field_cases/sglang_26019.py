"""sglang#26019: the triton backend's decode graph (batch 8), captured at the fill length
and replayed at 4096..4101 tokens. Healthy (0.5.23): get_num_kv_splits runs before every
replay. MLATRACE_CASE_VARIANT=skip_replay_splits: the replay path skips it. A batch of 16
runs eagerly in between (no graph for it): its splits are not the graph's."""

import torch
from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
from sglang.srt.model_executor.runner.decode_cuda_graph_runner import (
    DecodeCudaGraphRunner,
    ForwardBatch,
)

BS = 8
backend = TritonAttnBackend(max_bs=BS)
runner = DecodeCudaGraphRunner(backend, max_bs=BS)
runner.capture_one_shape(BS, backend.forward_decode)
for step in range(6):
    lens = torch.full((BS,), 4096 + step, dtype=torch.int32)
    out = runner.execute(ForwardBatch(BS, lens, lens.clone(), int(lens.sum())))
    if step == 2:   # a batch of 16 runs eagerly: its own splits, not the graph's
        big = torch.full((16,), 4096, dtype=torch.int32)
        backend.init_forward_metadata(ForwardBatch(16, big, big.clone(), int(big.sum())))
print("splits", backend.cuda_graph_num_kv_splits.tolist(), "out", out[0].item())
