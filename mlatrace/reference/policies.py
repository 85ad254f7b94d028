"""KV-split policies of the reference MLA decode: how many splits the host launches.

Pure functions of host-side arguments only (never of device memory), because the
answer is what a CUDA graph freezes at capture. The `reference` probe pack records
`num_kv_splits`'s arguments and result as `kernel.split`.

- `legacy`: AITER's host formula before ROCm/aiter#4555. Captured at a dummy
  `min_kv_seq_len=1` it gives one split, and replay keeps that one-program grid at
  any length (seed 002).
- `bucketed`: the seed's vLLM proposal, chosen from the host hint. Right only when
  the hint is the real length (eager call, or one graph per bucket).
- `device`: a fixed launch budget independent of length; each stage-1 program
  derives its KV range from the runtime length on the device (see
  `device_partition`), so one capture is right at every length.

`kv_split_range` and `device_partition` are the integer definitions of which KV
positions a split owns; the torch and Triton kernels compute the same on device.
"""

from __future__ import annotations

from mlatrace import decisions
from mlatrace.decisions import cdiv

POLICIES = ("legacy", "bucketed", "device")

BLOCK_N = decisions.BLOCK_N
"""KV rows per inner-loop tile of stage 1 (AITER's BLOCK_N for this path)."""

HEAD_BLOCK = decisions.BLOCK_M
"""Query heads per stage-1 program (AITER's NUM_M_BLOCKS counts these)."""

LEGACY_PROGRAM_BUDGET = decisions.WORKGROUP_BUDGET
"""Workgroup budget of AITER's legacy formula: 256 // (batch*qlen*head_blocks)."""

DEVICE_PROGRAM_BUDGET = 132
"""Stage-1 programs the `device` policy launches per step: one per SM of a 132-SM H200,
where the double-buffered bf16 stage-1 kernel (165 KiB shared memory) runs one per SM;
at 100K that is 131 active splits of 12 tiles, one wave."""

DEVICE_MIN_TILES_PER_SPLIT = 1
"""Smallest chunk, in BLOCK_N tiles, the `device` partition gives one split."""

MAX_KV_SPLITS = 512
"""Upper bound on splits any policy returns (sizes the stage-2 workspace)."""

BUCKETS = decisions.BUCKETS
"""(largest min_kv_seq_len, splits) of the seed's bucketed policy; above the last: 128."""
BUCKET_ABOVE = decisions.TOP_BUCKET_SPLITS

__all__ = ["cdiv", "POLICIES", "num_kv_splits", "legacy", "bucketed", "device"]


def head_blocks(nhead: int) -> int:
    """Stage-1 head blocks per (batch, query) row."""
    return decisions.head_blocks(nhead)


def legacy(batch: int, qlen: int, nhead: int, min_kv_seq_len: int, block_n: int = BLOCK_N) -> int:
    """AITER's legacy host choice (`decisions.legacy_splits`): 1 when the hint is below a tile."""
    return decisions.legacy_splits(min_kv_seq_len, batch=batch, qlen=qlen, nhead=nhead,
                                   block_n=block_n)


def bucketed(min_kv_seq_len: int) -> int:
    """The seed's five buckets (`decisions.bucketed_splits`), from the host hint."""
    return decisions.bucketed_splits(min_kv_seq_len)


def device(batch: int, qlen: int, nhead: int, min_kv_seq_len: int = 0,
           block_n: int = BLOCK_N, budget: int = DEVICE_PROGRAM_BUDGET) -> int:
    """Fixed launch budget, independent of length: the device picks the active splits.

    `min_kv_seq_len` and `block_n` are accepted for a uniform signature and ignored on
    purpose: the grid must not depend on anything that differs between capture and replay.
    """
    del min_kv_seq_len, block_n
    per_row = budget // (batch * qlen * head_blocks(nhead))
    return max(1, min(MAX_KV_SPLITS, per_row))


def num_kv_splits(policy: str, batch: int, qlen: int, nhead: int, min_kv_seq_len: int,
                  block_n: int = BLOCK_N, device_budget: int = DEVICE_PROGRAM_BUDGET) -> int:
    """Host-side NUM_KV_SPLITS for `policy`; the value a CUDA graph captures.

    `policy` may also be "fixed:N" (always N splits, legacy partition), used by the
    benchmark's fixed-128 column and its best-split sweep.
    """
    if policy == "legacy":
        return legacy(batch, qlen, nhead, min_kv_seq_len, block_n)
    if policy == "bucketed":
        return bucketed(min_kv_seq_len)
    if policy == "device":
        return device(batch, qlen, nhead, min_kv_seq_len, block_n, device_budget)
    if policy.startswith("fixed:"):
        splits = int(policy.split(":", 1)[1])
        if not 1 <= splits <= MAX_KV_SPLITS:
            raise ValueError(f"fixed split count must be in 1..{MAX_KV_SPLITS}: {policy!r}")
        return splits
    raise ValueError(f"unknown split policy {policy!r}; expected one of {POLICIES} or 'fixed:N'")


def uses_device_partition(policy: str) -> bool:
    """Whether the kernels derive the active split count on the device (only `device`)."""
    return policy == "device"


def kv_split_range(seq_len: int, split: int, num_splits: int) -> tuple[int, int]:
    """AITER's static partition: split s owns [s*chunk, min((s+1)*chunk, seq_len)).

    chunk = cdiv(seq_len, num_splits) is computed from the runtime length, so one split
    over 100K tokens is correct, just a one-program grid.
    """
    chunk = cdiv(seq_len, num_splits)
    start = min(split * chunk, seq_len)
    return start, min(start + chunk, seq_len)


def device_partition(seq_len: int, num_splits: int, block_n: int = BLOCK_N,
                     min_tiles: int = DEVICE_MIN_TILES_PER_SPLIT) -> tuple[int, int]:
    """(active splits, chunk) of the `device` policy for one sequence.

    Chunks are whole tiles (at least `min_tiles`), and the active count is the number of
    non-empty chunks: splits at or beyond it exit at once and stage 2 never reads them.
    One active split means stage 1 writes the output directly and stage 2 exits.
    """
    tiles = max(1, cdiv(seq_len, block_n))
    tiles_per_split = max(min_tiles, cdiv(tiles, min(num_splits, tiles)))
    chunk = tiles_per_split * block_n
    return cdiv(tiles, tiles_per_split), chunk


def device_split_range(seq_len: int, split: int, num_splits: int, block_n: int = BLOCK_N,
                       min_tiles: int = DEVICE_MIN_TILES_PER_SPLIT) -> tuple[int, int]:
    """KV positions [start, end) of `split` under the `device` partition (empty if inactive)."""
    active, chunk = device_partition(seq_len, num_splits, block_n, min_tiles)
    if split >= active:
        return seq_len, seq_len
    start = split * chunk
    return start, min(start + chunk, seq_len)
