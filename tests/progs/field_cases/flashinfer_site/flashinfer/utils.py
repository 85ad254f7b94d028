"""Stand-in of flashinfer-python 0.7.4 flashinfer/utils.py: the two helpers vLLM's
FLASHINFER_MLA backend imports (sizes of trtllm-gen's multi-CTA KV counter buffer)."""

from __future__ import annotations

SMS = 132


def get_device_sm_count(device) -> int:
    return SMS


def get_trtllm_gen_multi_ctas_kv_counter_bytes(batch_size: int, num_qo_heads: int,
                                               sm_count: int) -> int:
    return -(-max(batch_size * num_qo_heads, sm_count) // 8) * 8 * 4
