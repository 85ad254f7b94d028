"""Split policies the findings quote: what a host policy would have chosen at the real length.

Pure, stdlib-only copies of the two host formulas (design.md, seed 002) so that the
analysis never imports the reference path (which may pull in torch).
"""

from __future__ import annotations

WORKGROUP_BUDGET = 256
BLOCK_M = 16  # query heads per program in the AITER-style stage 1 (NUM_M_BLOCKS = cdiv(heads, 16))

# (upper bound of min_kv_seq_len inclusive, splits) from seed 002's final bucketed policy
BUCKETS: tuple[tuple[int, int], ...] = ((64, 1), (4096, 16), (16384, 48), (65536, 64))
TOP_BUCKET_SPLITS = 128


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def head_blocks(nhead: int | None, qlen: int | None = 1) -> int:
    """NUM_M_BLOCKS of the AITER wrapper: query rows (heads x qlen) tiled by BLOCK_M."""
    return max(1, cdiv(max(1, nhead or 1), BLOCK_M))


def legacy_splits(min_kv_seq_len: int, *, batch: int = 1, qlen: int = 1, nhead: int = 16,
                  block_n: int = 64) -> int:
    """AITER mla_gluon's host formula: max(1, min(256 // (b*q*m_blocks), cdiv(len, BLOCK_N)))."""
    budget = WORKGROUP_BUDGET // max(1, batch * max(1, qlen) * head_blocks(nhead, qlen))
    return max(1, min(budget, cdiv(max(1, min_kv_seq_len), block_n)))


def bucketed_splits(min_kv_seq_len: int) -> int:
    """Seed 002's bucket ladder: <=64 -> 1, <=4K -> 16, <=16K -> 48, <=64K -> 64, else 128."""
    for upper, splits in BUCKETS:
        if min_kv_seq_len <= upper:
            return splits
    return TOP_BUCKET_SPLITS
