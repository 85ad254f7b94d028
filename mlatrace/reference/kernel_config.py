"""Kernel configuration of the reference MLA decode, as data (like `triton.Config`).

`mla_gluon(..., config=MlaConfig(...))` takes one frozen `MlaConfig`; the stage launches
read nothing else, so a tuning sweep builds the configs it times and never saves or
restores module state. `DEFAULT` is what ships (and what `samples/bench` measures).
No torch or Triton import here: the torch stages and the bench read these too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mlatrace.reference import policies

PDL_MODES = ("off", "device", "all")
SAFE_WARPS = 4
SAFE_STAGES = 2
"""The portable stage 1's config for float32 caches (tf32x3 tiles need the shared memory)
and its fallback when a Triton version does not fit the chosen config in shared memory."""


@dataclass(frozen=True)
class Stage1Config:
    """Stage 1 (split attention): which kernel, and the portable Triton kernel's meta-parameters.

    - gluon: bf16 caches on a Hopper GPU under the Triton release `gluon_mla` is written
      for, with element offsets that fit in int32, run the Gluon warpgroup-MMA kernel
      (keys on M, cp.async ring): it is faster at every length there. Off: always Triton.
    - tile_n: KV rows per inner-loop tile of the Triton kernel (divides policies.BLOCK_N).
    - num_warps, num_stages: the Triton kernel's; 8 warps / 3 stages with the prefetch
      keeps two KV buffers (one program per SM) and was the fastest measured.
    - prefetch: load the next tile's page-table entries one iteration ahead, so the KV
      loads never wait on their indices.
    - offsets_32: 32-bit KV row offsets when every element offset fits in int32 (caches
      past 2**31 elements always take 64-bit); fewer instructions per tile.
    - column_splits: device partition on the Gluon kernel, a sequence within one tile:
      up to this many of the launch's idle programs (a power of 2) each write a share of
      the 512 value columns of `o`, taking P.V and the epilogue off a short decode's
      dependent chain; 1 turns it off.
    - fallback: retry with SAFE_WARPS/SAFE_STAGES when the config does not fit (off:
      raise, so a tuning sweep never times the fallback under another config's name).
    """

    gluon: bool = True
    tile_n: int = 64
    num_warps: int = 8
    num_stages: int = 3
    prefetch: bool = True
    offsets_32: bool = True
    column_splits: int = 4
    fallback: bool = True

    def __post_init__(self) -> None:
        if self.tile_n <= 0 or policies.BLOCK_N % self.tile_n:
            raise ValueError(f"tile_n must divide BLOCK_N={policies.BLOCK_N}: {self.tile_n}")
        if self.column_splits < 1:
            raise ValueError(f"column_splits must be >= 1: {self.column_splits}")


@dataclass(frozen=True)
class Stage2Config:
    """Stage 2 (LSE-weighted merge of the splits).

    - max_block_s: most splits one load reduces (BLOCK_S = next power of 2 of the splits,
      capped here): one round trip to memory for every policy's split count.
    - block_dv: output columns per program (512 // block_dv programs per head): many
      small programs keep the merge one short latency-bound step.
    - small_s, mid_s: split tiers: when at most small_s (else mid_s) splits are active, a
      runtime branch loads a [small_s | mid_s, block_dv] tile instead of the wide one (the
      device partition launches 256 splits' worth and a short sequence uses a few); 0
      turns a tier off.
    - one_split_no_wait: device partition with PDL: with one active split stage 1 wrote
      `o`, so stage 2 exits without gdc_wait and its graph node ends before stage 1's.
      Work launched after stage 2 still starts after stage 1 completes
      (tests/test_pdl_order.py).
    """

    num_warps: int = 4
    max_block_s: int = 512
    block_dv: int = 32
    small_s: int = 16
    mid_s: int = 64
    one_split_no_wait: bool = True

    def __post_init__(self) -> None:
        if self.block_dv <= 0 or 512 % self.block_dv:
            raise ValueError(f"block_dv must divide 512: {self.block_dv}")
        if self.max_block_s < 1:
            raise ValueError(f"max_block_s must be >= 1: {self.max_block_s}")


@dataclass(frozen=True)
class MlaConfig:
    """The whole decode's configuration: both stages, PDL, and the device policy's launch.

    - pdl: launch stage 2 as a programmatic dependent launch (Hopper, CUDA only), so its
      launch and its seq_info read overlap stage 1: "device" for the device partition
      only, "all" for every policy, "off".
    - device_budget: stage-1 programs the `device` policy launches per step
      (policies.DEVICE_PROGRAM_BUDGET: one per SM of an H200).
    - min_tiles: smallest chunk, in BLOCK_N tiles, the device partition gives one split.
    """

    stage1: Stage1Config = field(default_factory=Stage1Config)
    stage2: Stage2Config = field(default_factory=Stage2Config)
    pdl: str = "device"
    device_budget: int = policies.DEVICE_PROGRAM_BUDGET
    min_tiles: int = policies.DEVICE_MIN_TILES_PER_SPLIT

    def __post_init__(self) -> None:
        if self.pdl not in PDL_MODES:
            raise ValueError(f"pdl must be one of {PDL_MODES}: {self.pdl!r}")
        if self.device_budget < 1 or self.min_tiles < 1:
            raise ValueError("device_budget and min_tiles must be >= 1")


DEFAULT = MlaConfig()
