"""The device policy's partition as a Triton device function, for every kernel that needs it:
the Triton stage 1 and stage 2 (`triton_mla`) and the Gluon stage 1 (`gluon_mla`).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def device_partition(seq_len, NUM_KV_SPLITS: tl.constexpr, BLOCK_N: tl.constexpr,
                     MIN_TILES: tl.constexpr):
    """(active splits, chunk) of the device policy; same integers as policies.device_partition."""
    tiles = tl.maximum(tl.cdiv(seq_len, BLOCK_N), 1)
    tiles_per_split = tl.maximum(tl.cdiv(tiles, tl.minimum(tiles, NUM_KV_SPLITS)), MIN_TILES)
    return tl.cdiv(tiles, tiles_per_split), tiles_per_split * BLOCK_N
