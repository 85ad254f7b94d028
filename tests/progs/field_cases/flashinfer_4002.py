"""flashinfer#4002: FA2 tensor-core decode under CUDA graphs with split-KV disabled (SGLang's
deterministic inference), batch 2, 32 query / 2 KV heads on 132 SMs. The plan pads grid x to
the split-KV bound (132) while it initializes 2 scheduler entries; the captured grid reads the
other 130 uninitialized. MLATRACE_CASE_VARIANT=exact_grid: grid x = the initialized entries."""

import torch
from flashinfer.decode import BatchDecodeWithPagedKVCacheWrapper

from mlatrace.reference.graph import HostGraph

BS, QO, KV, PAGE = 2, 32, 2, 16
wrapper = BatchDecodeWithPagedKVCacheWrapper(
    torch.zeros(1024), use_cuda_graph=True, use_tensor_cores=True,
    paged_kv_indptr_buffer=torch.zeros(BS + 1, dtype=torch.int32),
    paged_kv_indices_buffer=torch.zeros(4096, dtype=torch.int32),
    paged_kv_last_page_len_buffer=torch.zeros(BS, dtype=torch.int32))


def plan(length: int) -> None:
    pages = -(-length // PAGE)
    wrapper.plan(torch.arange(0, (BS + 1) * pages, pages, dtype=torch.int32)[: BS + 1],
                 torch.arange(BS * pages, dtype=torch.int32),
                 torch.full((BS,), (length - 1) % PAGE + 1, dtype=torch.int32), QO, KV, 128, PAGE,
                 seq_lens=[length] * BS, disable_split_kv=True)


q = torch.zeros(BS, QO, 128)
plan(1)
graph = HostGraph()
graph.capture_begin()
out = wrapper.run(q, None)
graph.capture_end()
for length in (1024, 1025, 1026):
    plan(length)
    graph.replay()
print("CTAs", out.numel(), "uninitialized entries read", int((out < 0).sum()))
