"""Host-side decision functions the analyser knows: what a backend decides from host values.

The one home of these formulas (stdlib only, so the analysis never imports torch), beside
the stages that share them: the probe side's decision handler
(`mlatrace.probe.handlers.decision`) evaluates them in the traced process, the reference
path's policies (`mlatrace.reference.policies`) are built on them, and the rules use them.
A finding uses them to say what a frozen decision would have been at the replay lengths,
and `valid_range` turns one decided value into the range of inputs for which it holds.

Formulas, each from the source named:

- AITER legacy (`mla_gluon` before ROCm/aiter#4555):
  `max(1, min(256 // (batch*qlen*cdiv(nhead, 16)), cdiv(min_kv_seq_len, BLOCK_N)))`.
- AITER after ROCm/aiter#4555 (first released in aiter v0.1.20; checked at ROCm/aiter
  @e4048607 `aiter/ops/triton/gluon/mla_gluon.py`): bh16 regimes (nhead <= 96) use the fixed
  budget `max(1, 256 // (batch*qlen*cdiv(nhead, 16)))`, independent of min_kv_seq_len; bh64
  (nhead 64 or 128, batch a multiple of 64) picks `max(1, next_pow2(cdiv(256, base_grid)))`
  with `base_grid = xcds * cdiv(nhead, 64) * qlen * (batch // xcds)` and still asserts
  `min_kv_seq_len > splits * (3*64 + splits)`.
- The bucketed ladder (seed 002's vLLM proposal): <=64 -> 1, <=4K -> 16, <=16K -> 48,
  <=64K -> 64, else 128, from `min_kv_seq_len`.
- vLLM TRITON_MLA (vllm 0.33.0 `vllm/v1/attention/backends/mla/triton_mla.py`
  `_compute_num_kv_splits`): `min(next_pow2(max(1, max_seq_len // 512)), 2 * sm_count)`.
- FA3's split heuristic (flash-attention `hopper/heuristics.h` `num_splits_heuristic`, the
  decode branch: no split when the tiles nearly fill the SMs or there are <= 4 KV blocks;
  otherwise the smallest split count within 85% of the best wave efficiency), capped by
  `max_num_splits` when vLLM passes one (`flash_attn_max_num_splits_for_cuda_graph`,
  default 32 in vllm 0.33.0 `vllm/config/attention.py`; 16 before vllm#25495).
- FlashInfer's CUDA-graph padded batch size (flashinfer-python 0.7.4,
  `include/flashinfer/attention/scheduler.cuh` `PrefillSplitQOKVIndptr`, which the
  tensor-core decode path shares): `max(max_batch_size_if_split, total_num_tiles_q)` with
  `max_batch_size_if_split = 2 * SMs // num_kv_heads`. Under CUDA graphs total_num_tiles_q
  is bounded from the row count, `cdiv(total_rows * group, cta_tile_q) + batch - 1`, the
  same at every re-plan of one graph; before flashinfer#641 it was the sum of
  `cdiv(qo_len * group, cta_tile_q)` over the requests, which moves with the query-length
  distribution.
- vLLM TRITON_ATTN (vllm 0.33.0 `vllm/v1/attention/ops/triton_unified_attention.py`
  `unified_attention`; threshold from `vllm/v1/attention/backends/triton_attn.py`): the 3D
  (split-KV) kernel with `num_par_softmax_segments` segments when the Q blocks
  `num_seqs * cdiv(max_seqlen_q, BLOCK_Q)` are at most `seq_threshold_3D` (there
  `128 // num_kv_heads`, snapped to the nearest capture size) and the scratch holds the query
  tokens, else the 2D kernel: one KV split, whatever the KV length (vllm#48076).
- SGLang's triton backend (sglang 0.5.23 `triton_backend.py` `get_num_kv_splits`): the
  per-sequence split counts written on device hold for the seq lens they were computed from
  (valid for that `seq_len_max` only); `static_kv_splits` fills `max_kv_splits`, any length.
- TensorRT-LLM's T5 relative-position bias (`modeling_t5.py` `T5RelativePositionBias.forward`):
  built for one (query, key) length, it holds for that length only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

WORKGROUP_BUDGET = 256
"""Workgroup budget of AITER's legacy formula: 256 // (batch*qlen*head_blocks)."""
BLOCK_M = 16
"""Query heads per AITER stage-1 program (NUM_M_BLOCKS = cdiv(heads, 16))."""
BLOCK_N = 64
"""KV rows per stage-1 tile when a trace does not say."""

BUCKETS: tuple[tuple[int, int], ...] = ((64, 1), (4096, 16), (16384, 48), (65536, 64))
"""(largest min_kv_seq_len, splits) of the bucketed policy; above the last: TOP_BUCKET_SPLITS."""
TOP_BUCKET_SPLITS = 128

TRITON_MLA_MIN_WORK_PER_SPLIT = 512
TRITON_MLA_OCCUPANCY = 2

FA3_MAX_SPLITS = 128        # FA3's own bound when no num_splits is passed
FA3_BLOCK_N = 128           # KV tile of the FA3 decode kernels (hdim 64-128)
FA3_CUDA_GRAPH_CAP = 32     # vllm 0.33.0 flash_attn_max_num_splits_for_cuda_graph default
DEFAULT_SMS = 132           # H200 / H100 SXM


def cdiv(a: int, b: int) -> int:
    """Ceiling division for non-negative ints."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (1 for n <= 1), as triton.next_power_of_2."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def head_blocks(nhead: int | None, qlen: int | None = 1) -> int:
    """NUM_M_BLOCKS of the AITER wrapper: query heads tiled by BLOCK_M."""
    return max(1, cdiv(max(1, nhead or 1), BLOCK_M))


def legacy_splits(min_kv_seq_len: int, *, batch: int = 1, qlen: int = 1, nhead: int = 16,
                  block_n: int = BLOCK_N) -> int:
    """AITER mla_gluon's legacy host formula (collapses to 1 below one tile)."""
    budget = WORKGROUP_BUDGET // max(1, batch * max(1, qlen) * head_blocks(nhead, qlen))
    return max(1, min(budget, cdiv(max(1, min_kv_seq_len), block_n)))


def fixed_budget_splits(*, batch: int = 1, qlen: int = 1, nhead: int = 16) -> int:
    """AITER mla_gluon's bh16 split count after ROCm/aiter#4555: the same at every length."""
    return max(1, WORKGROUP_BUDGET // max(1, batch * max(1, qlen) * head_blocks(nhead, qlen)))


GLUON_BH64_BLOCK = 64
GLUON_XCDS = 8  # MI350 / MI355X


def gluon_bh64_splits(batch: int, nhead: int, qlen: int = 1, xcds: int = GLUON_XCDS) -> int:
    """AITER mla_gluon's bh64 split count (nhead 64/128): fills ~256 workgroups."""
    base = xcds * cdiv(nhead, GLUON_BH64_BLOCK) * max(1, qlen) * (batch // xcds)
    return max(1, next_pow2(cdiv(WORKGROUP_BUDGET, max(1, base))))


def gluon_bh64_min_kv_seq_len(splits: int) -> int:
    """The bound bh64 asserts: min_kv_seq_len must exceed splits * (3*BLOCK_N + splits)."""
    return splits * (3 * GLUON_BH64_BLOCK + splits)


def bucketed_splits(min_kv_seq_len: int) -> int:
    """The bucket ladder: <=64 -> 1, <=4K -> 16, <=16K -> 48, <=64K -> 64, else 128."""
    for upper, splits in BUCKETS:
        if min_kv_seq_len <= upper:
            return splits
    return TOP_BUCKET_SPLITS


def bucketed_range(splits: int) -> tuple[int, int | None] | None:
    """The min_kv_seq_len range [lo, hi] (hi None: unbounded) that picks `splits`."""
    lower = 0
    for upper, value in BUCKETS:
        if value == splits:
            return lower, upper
        lower = upper + 1
    return (lower, None) if splits == TOP_BUCKET_SPLITS else None


def triton_mla_splits(max_seq_len: int, sm_count: int = DEFAULT_SMS) -> int:
    """vLLM TRITON_MLA's `_compute_num_kv_splits(max_seq_len, sm_count)`."""
    ideal = next_pow2(max(1, max_seq_len // TRITON_MLA_MIN_WORK_PER_SPLIT))
    return min(ideal, sm_count * TRITON_MLA_OCCUPANCY)


def triton_mla_range(splits: int, sm_count: int = DEFAULT_SMS) -> tuple[int, int | None] | None:
    """The max_seq_len range [lo, hi] (hi None: unbounded) for which TRITON_MLA picks `splits`."""
    cap = sm_count * TRITON_MLA_OCCUPANCY
    work = TRITON_MLA_MIN_WORK_PER_SPLIT
    if splits == 1:
        return 0, 2 * work - 1
    if splits < 1 or splits & (splits - 1) or splits > cap:
        if splits == cap:  # a cap that is not a power of two
            return (next_pow2(cap) // 2 + 1) * work, None
        return None
    lower = (splits // 2 + 1) * work  # next_pow2(x) == splits  <=>  splits/2 < x <= splits
    return lower, (None if splits == cap else (splits + 1) * work - 1)


def fa3_splits(seq_len_max: int, *, num_reqs: int = 1, num_heads_kv: int = 8,
               max_num_splits: int = 0, num_sms: int = DEFAULT_SMS,
               block_n: int = FA3_BLOCK_N) -> int:
    """FA3's decode split count for one batch: the heuristic, capped by max_num_splits (> 0)."""
    total_mblocks = max(1, num_reqs) * max(1, num_heads_kv)  # one M block per (req, kv head)
    n_blocks = cdiv(max(1, seq_len_max), block_n)
    bound = max_num_splits if max_num_splits > 0 else FA3_MAX_SPLITS
    if total_mblocks >= 0.8 * num_sms or n_blocks <= 4:
        return 1
    bound = min(bound, num_sms, n_blocks)
    efficiency: list[float] = []
    for splits in range(1, bound + 1):
        waves = total_mblocks * splits / num_sms
        efficiency.append(waves / cdiv(total_mblocks * splits, num_sms))
    best = max(efficiency)
    for splits, eff in enumerate(efficiency, start=1):
        eligible = splits == 1 or cdiv(n_blocks, splits) != cdiv(n_blocks, splits - 1)
        if eligible and eff >= 0.85 * best:
            return splits
    return 1


FLASHINFER_BLOCKS_PER_SM = 2  # PrefillPlanImpl's num_blocks_per_sm


def flashinfer_split_budget(num_kv_heads: int, num_sms: int = DEFAULT_SMS) -> int:
    """FlashInfer's max_batch_size_if_split: the CTAs of two per SM, per KV head."""
    return (FLASHINFER_BLOCKS_PER_SM * num_sms) // max(1, num_kv_heads)


def flashinfer_tiles_q(qo_lens: list[int], *, group: int, cta_tile_q: int, bounded: bool) -> int:
    """Query tiles of a FlashInfer plan: bounded from the row count (CUDA graphs since
    flashinfer#641) or counted request by request (before it, and outside graphs)."""
    if bounded:
        return cdiv(sum(qo_lens) * group, cta_tile_q) + len(qo_lens) - 1
    return sum(cdiv(q * group, cta_tile_q) for q in qo_lens)


def flashinfer_graph_padded_batch_size(qo_lens: list[int], *, num_kv_heads: int, group: int,
                                       cta_tile_q: int, bounded: bool = True,
                                       num_sms: int = DEFAULT_SMS) -> int:
    """plan_info[0] of a CUDA-graph FlashInfer plan: the grid x its capture freezes."""
    return max(flashinfer_split_budget(num_kv_heads, num_sms),
               flashinfer_tiles_q(qo_lens, group=group, cta_tile_q=cta_tile_q, bounded=bounded))


TRITON_ATTN_MAX_3D_QUERY_LEN = 8  # vllm 0.33.0 triton_unified_attention.MAX_3D_QUERY_LEN


def triton_attn_splits(num_reqs: int, *, max_query_len: int = 1, seq_threshold_3d: int | None,
                       segments: int | None, block_q: int = 1, scratch_rows: int | None = None,
                       num_tokens: int | None = None, causal: bool = True) -> int:
    """TRITON_ATTN's KV splits: `segments` when unified_attention takes the 3D kernel, else 1."""
    if seq_threshold_3d is None or segments is None:
        return 1
    if max_query_len > 1 and (max_query_len > TRITON_ATTN_MAX_3D_QUERY_LEN or not causal):
        return 1
    if num_reqs * cdiv(max(1, max_query_len), max(1, block_q)) > seq_threshold_3d:
        return 1
    if scratch_rows is not None and num_tokens is not None and scratch_rows < num_tokens:
        return 1
    return segments


# -- decisions by name ---------------------------------------------------------------

SPLIT_SUFFIXES = ("num_kv_splits", "num_splits")
CAP_SUFFIXES = ("max_num_splits", "max_kv_splits")
PREFILL_SUFFIXES = ("num_prefills", "num_prefill_tokens")


def is_split_decision(name: str) -> bool:
    """A split-count decision (MLT001's special case when it is 1); caps are not."""
    return name.endswith(SPLIT_SUFFIXES) and not name.endswith(CAP_SUFFIXES)


def is_cap_decision(name: str) -> bool:
    return name.endswith(CAP_SUFFIXES)


def _int(inputs: dict, name: str, default: int | None = None) -> int | None:
    value = inputs.get(name, default)
    return value if isinstance(value, int) and not isinstance(value, bool) else default


@dataclass(frozen=True)
class KnownDecision:
    """A decision whose formula is public: its value from inputs, and where a value holds."""

    formula: str
    compute: Callable[[dict], int | None]
    valid: Callable[[Any, dict], dict[str, list] | None]


def _triton_mla_compute(inputs: dict) -> int | None:
    length = _int(inputs, "seq_len_max")
    return None if length is None else triton_mla_splits(length, _int(inputs, "sm_count", DEFAULT_SMS))


def _triton_mla_valid(value: Any, inputs: dict) -> dict[str, list] | None:
    if not isinstance(value, int):
        return None
    bounds = triton_mla_range(value, _int(inputs, "sm_count", DEFAULT_SMS))
    return None if bounds is None else {"seq_len_max": list(bounds)}


def _bucketed_compute(inputs: dict) -> int | None:
    length = _int(inputs, "seq_len_min")
    return None if length is None else bucketed_splits(length)


def _bucketed_valid(value: Any, inputs: dict) -> dict[str, list] | None:
    bounds = bucketed_range(value) if isinstance(value, int) else None
    return None if bounds is None else {"seq_len_min": list(bounds)}


def _legacy_compute(inputs: dict) -> int | None:
    length = _int(inputs, "seq_len_min")
    if length is None:
        return None
    return legacy_splits(length, batch=_int(inputs, "num_reqs", 1), qlen=_int(inputs, "max_query_len", 1),
                         nhead=_int(inputs, "nhead", 16), block_n=_int(inputs, "block_n", BLOCK_N))


def _fa3_compute(inputs: dict) -> int | None:
    length = _int(inputs, "seq_len_max")
    if length is None:
        return None
    return fa3_splits(length, num_reqs=_int(inputs, "num_reqs", 1),
                      num_heads_kv=_int(inputs, "num_heads_kv", 8),
                      max_num_splits=_int(inputs, "max_num_splits", 0),
                      num_sms=_int(inputs, "sm_count", DEFAULT_SMS))


def _no_range(value: Any, inputs: dict) -> None:
    return None


def _triton_attn_block_q(inputs: dict) -> int:
    """unified_attention's BLOCK_Q: BLOCK_M (16, or next_pow2 of the group) // group."""
    heads, kv_heads = _int(inputs, "nhead"), _int(inputs, "num_kv_heads")
    if not heads or not kv_heads:
        return 1
    group = max(1, heads // kv_heads)
    return max(1, (16 if group <= 16 else next_pow2(group)) // group)


def _triton_attn_compute(inputs: dict) -> int | None:
    num_reqs = _int(inputs, "num_reqs")
    if num_reqs is None:
        return None
    return triton_attn_splits(num_reqs, max_query_len=_int(inputs, "max_query_len", 1),
                              seq_threshold_3d=_int(inputs, "seq_threshold_3D"),
                              segments=_int(inputs, "num_par_softmax_segments"),
                              block_q=_int(inputs, "block_q") or _triton_attn_block_q(inputs),
                              scratch_rows=_int(inputs, "scratch_rows"),
                              num_tokens=_int(inputs, "num_tokens"),
                              causal=inputs.get("causal", True) is not False)


def _triton_attn_valid(value: Any, inputs: dict) -> dict[str, list] | None:
    """The 3D kernel's segments adapt to each sequence's KV length inside the kernel, so the
    value holds for every batch up to the threshold. The 2D kernel's one split holds for no
    KV length in particular: no range, and MLT001 judges it against the replayed lengths."""
    threshold = _int(inputs, "seq_threshold_3D")
    if not isinstance(value, int) or value <= 1 or threshold is None:
        return None
    block_q = _int(inputs, "block_q") or _triton_attn_block_q(inputs)
    rows = threshold // cdiv(max(1, _int(inputs, "max_query_len", 1) or 1), block_q)
    return {"num_reqs": [0, rows]}


def _kv_splits_lengths_valid(value: Any, inputs: dict) -> dict[str, list] | None:
    """SGLang's per-sequence split counts hold for the lengths they were computed from only;
    static splits (``fill_(max_kv_splits)``) hold for any length."""
    if value is True:
        return {"seq_len_max": [0, None]}
    length = _int(inputs, "seq_len_max")
    return None if value is not False or length is None else {"seq_len_max": [length, length]}


def _exact_length_valid(value: Any, inputs: dict) -> dict[str, list] | None:
    """A value built for one length (TensorRT-LLM's T5 relative-position bias) holds there only."""
    length = _int(inputs, "seq_len_max")
    return None if length is None else {"seq_len_max": [length, length]}


KNOWN: dict[str, KnownDecision] = {
    "vllm.triton_mla.num_kv_splits": KnownDecision(
        "min(next_pow2(max_seq_len // 512), 2 x SMs) (vLLM TRITON_MLA _compute_num_kv_splits)",
        _triton_mla_compute, _triton_mla_valid),
    "aiter.mla.num_kv_splits": KnownDecision(
        "max(1, min(256 // (batch*qlen*head_blocks), cdiv(min_kv_seq_len, BLOCK_N))) (AITER legacy)",
        _legacy_compute, _no_range),
    "vllm.rocm_aiter_mla.num_kv_splits": KnownDecision(
        "bucket ladder of min_kv_seq_len (<=64: 1, <=4K: 16, <=16K: 48, <=64K: 64, else 128)",
        _bucketed_compute, _bucketed_valid),
    "vllm.flash_attn.num_splits": KnownDecision(
        "FA3 num_splits_heuristic (hopper/heuristics.h), capped by max_num_splits",
        _fa3_compute, _no_range),
    "vllm.triton_attn.num_kv_splits": KnownDecision(
        "num_par_softmax_segments if num_seqs * cdiv(max_seqlen_q, BLOCK_Q) <= seq_threshold_3D "
        "else 1 (vLLM TRITON_ATTN unified_attention: 3D or 2D kernel)",
        _triton_attn_compute, _triton_attn_valid),
    "sglang.triton.kv_splits_static": KnownDecision(
        "get_num_kv_splits writes per-sequence split counts on device from the seq lens it is "
        "given (static_kv_splits: max_kv_splits for every sequence) (SGLang TritonAttnBackend)",
        lambda inputs: None, _kv_splits_lengths_valid),
    "trtllm.t5.relative_position_bias": KnownDecision(
        "T5RelativePositionBias.forward(query_length, key_length): the (heads, q, k) bias of the "
        "lengths given (TensorRT-LLM modeling_t5.py)", lambda inputs: None, _exact_length_valid),
}

CAP_HEURISTICS: dict[str, str] = {"vllm.flash_attn.max_num_splits": "vllm.flash_attn.num_splits"}
"""A cap decision -> the split decision whose heuristic it bounds (MLT002)."""


def known(name: str) -> KnownDecision | None:
    return KNOWN.get(name)


def value_at(name: str, inputs: dict, **replay: int) -> int | None:
    """The decision's value with some inputs replaced by replay values, if its formula is known."""
    entry = KNOWN.get(name)
    if entry is None:
        return None
    return entry.compute({**inputs, **replay})


def valid_range(name: str, value: Any, inputs: dict, recorded: Any = None) -> dict[str, list] | None:
    """The recorded `valid` ranges, else the ranges a known formula gives for this value."""
    if isinstance(recorded, dict) and recorded:
        return recorded
    entry = KNOWN.get(name)
    return entry.valid(value, inputs) if entry else None
