"""`mlatrace bench splits`: MLA decode latency by KV length and split policy, from CUDA graphs.

For each KV length, each policy's `mla_gluon` call is captured in a torch.cuda.CUDAGraph
the way a serving engine would capture it, then replayed at the real length:

- legacy@1: AITER's legacy host policy captured at vLLM's dummy `min_kv_seq_len=1`
  (one split frozen: seed 002's bug);
- fixed128: the seed's first workaround, 128 splits whatever the length;
- bucketed: the seed's buckets, captured with the real length as hint (one graph per bucket);
- device: fixed launch budget, active splits chosen on the device (captured once).

A best-split sweep (fixed S in 1, 2, 4, ..., 256) gives the best tuned split per length,
and a large device-to-device copy gives the measured read ceiling from the same run.
Each graph holds one call per rotated input set (enough sets to overflow L2), replays are
timed with CUDA events behind a sleep kernel (so launch gaps stay out), and the median
replay is divided by the calls in it. Writes splits.md, splits.json and splits.png to --out.

Run: `mlatrace bench splits --out DIR [--quick]` or `python3 -m mlatrace.bench.splits_bench --out DIR`.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from mlatrace.bench.splits_report import Results, markdown, row_line, write_json, write_outputs
from mlatrace.exitcodes import ExitCode

if TYPE_CHECKING:
    from mlatrace.reference.kernel_config import MlaConfig

LENGTHS = (1, 64, 512, 1024, 4096, 8192, 16384, 32768, 65536, 100_000)
QUICK_LENGTHS = (1, 4096, 100_000)
SWEEP = (1, 2, 4, 8, 16, 32, 64, 128, 256)
QUICK_SWEEP = (1, 16, 128, 256)
COLUMNS = {  # name: (policy, capture hint from the real length)
    "legacy@1": ("legacy", lambda n: 1),
    "fixed128": ("fixed:128", lambda n: n),
    "bucketed": ("bucketed", lambda n: n),
    "device": ("device", lambda n: 1),
}
NHEAD = 16                      # Kimi-K3 TP8-like small-head decode
ROTATION_BYTES = 200 << 20      # rotate input sets until this much data (> L2) is touched
MAX_SETS = 16
KV_ROW_BYTES = 576 * 2          # bf16 latent + rope per token


def _stage1(kernel: str, budget: int, tile_n: int = 64, warps: int = 8, stages: int = 3,
            prefetch: bool = True):
    """A device-policy config for the stage-1 sweep; a config that does not fit is an
    error there (no fallback), so no row times another config under its name."""
    from mlatrace.reference.kernel_config import MlaConfig, Stage1Config

    return MlaConfig(device_budget=budget, stage1=Stage1Config(
        gluon=kernel == "gluon", tile_n=tile_n, num_warps=warps, num_stages=stages,
        prefetch=prefetch, fallback=False))


def tune_configs() -> tuple:
    """Stage 1 of the device policy: the Gluon kernel (Hopper, bf16) at two launch budgets,
    and the portable Triton kernel by budget, inner tile, warps, stages and prefetch."""
    return (_stage1("gluon", 132), _stage1("gluon", 264),
            _stage1("triton", 132, 64, 8, 3, True), _stage1("triton", 132, 64, 16, 3, True),
            _stage1("triton", 264, 64, 4, 2, False), _stage1("triton", 264, 32, 4, 3, True))


TUNE_PDL_LENGTHS = (1, 512, 4096, 100_000)
TUNE_TIER_LENGTHS = (512, 2048)
TUNE_TIERS = (("tiers 16/64", 16, 64), ("no tiers", 0, 0), ("tiers 8/32", 8, 32))
TUNE_STAGE2 = ((512, 16), (512, 32), (64, 16), (64, 64))   # (max_block_s, block_dv), stage 2
TUNE_MIN_TILES = (1, 2, 4)
TUNE_MIN_TILES_LENGTHS = (1024, 4096, 16384)


@dataclass
class Config:
    lengths: tuple[int, ...]
    sweep: tuple[int, ...]
    min_replays: int
    max_replays: int
    seconds_per_point: float
    tune: bool
    nhead: int = NHEAD
    device: str = "cuda"
    sets: int | None = None       # rotation sets per graph; None: enough to overflow L2


# ----------------------------------------------------------------------------------------
# inputs and timing
# ----------------------------------------------------------------------------------------


def make_sets(length: int, nhead: int, device: str, num_sets: int | None = None) -> list[dict]:
    """Random bf16 inputs with a scattered (permuted) page table, one dict per rotation set."""
    import torch

    set_bytes = (length + 64) * KV_ROW_BYTES + nhead * 576 * 2 * 2
    if num_sets is None:
        num_sets = max(2, min(MAX_SETS, math.ceil(ROTATION_BYTES / set_bytes)))
    sets = []
    for _ in range(num_sets):
        num_slots = length + 64
        sets.append(dict(
            q_nope=torch.randn(1, nhead, 512, device=device).to(torch.bfloat16),
            q_pe=torch.randn(1, nhead, 64, device=device).to(torch.bfloat16),
            kv_c=torch.randn(num_slots, 576, device=device).to(torch.bfloat16),
            page_table=torch.randperm(num_slots, device=device)[:length + 1]
            .to(torch.int32).reshape(1, -1),
            seq_info=torch.tensor([length], dtype=torch.int32, device=device),
            o=torch.empty(1, nhead, 512, dtype=torch.bfloat16, device=device),
        ))
    return sets


def mla_calls(sets: list[dict], policy: str, hint: int, backend: str,
              config: MlaConfig | None = None) -> list[Callable[[], None]]:
    """One zero-argument `mla_gluon` call per input set (what one graph holds), under
    `config` (None: the shipped kernel_config.DEFAULT)."""
    from mlatrace.reference.mla import mla_gluon

    scale = 1.0 / math.sqrt(576)

    def call(s: dict) -> Callable[[], None]:
        return lambda: mla_gluon(s["q_nope"], s["q_pe"], s["kv_c"], s["o"], s["page_table"],
                                 s["seq_info"], scale, min_kv_seq_len=hint, policy=policy,
                                 backend=backend, config=config)
    return [call(s) for s in sets]


class Timer:
    """Captures calls into one CUDA graph and times its replays (CPU: plain calls, wall clock)."""

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.cuda = cfg.device == "cuda"

    def per_call_us(self, calls: list[Callable[[], None]]) -> dict:
        import torch

        for c in calls:                       # compile and warm up outside the capture
            c()
        if not self.cuda:
            start = time.perf_counter()
            for _ in range(self.cfg.min_replays):
                for c in calls:
                    c()
            us = (time.perf_counter() - start) / self.cfg.min_replays / len(calls) * 1e6
            return dict(us=us, p10=us, p90=us, replays=self.cfg.min_replays, calls=len(calls))
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for c in calls:
                c()
        graph.replay()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(3):
            graph.replay()
        torch.cuda.synchronize()
        estimate = max((time.perf_counter() - t0) / 3, 1e-6)
        replays = int(min(self.cfg.max_replays,
                          max(self.cfg.min_replays, self.cfg.seconds_per_point / estimate)))
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
        # Keep the GPU busy while the host enqueues, so host launch gaps are not timed.
        sleep_s = min(0.05, replays * 40e-6)
        if hasattr(torch.cuda, "_sleep"):
            torch.cuda._sleep(int(sleep_s * 2e9))
        for i in range(replays):
            starts[i].record()
            graph.replay()
            ends[i].record()
        torch.cuda.synchronize()
        times = sorted(s.elapsed_time(e) * 1000 / len(calls) for s, e in zip(starts, ends, strict=True))
        del graph
        return dict(us=statistics.median(times), p10=times[len(times) // 10],
                    p90=times[(len(times) * 9) // 10], replays=replays, calls=len(calls))


def read_ceiling(device: str) -> float:
    """Bytes read plus written per second of a large device-to-device copy (median of 20)."""
    import torch

    if device != "cuda":
        return 0.0
    nbytes = 1 << 30
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    times = []
    for _ in range(20):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1000)
    del src, dst
    return 2 * nbytes / statistics.median(times)


def gather_ceiling(device: str, rows: int = 100_000) -> tuple[float, float]:
    """Bytes read plus written per second of `index_select` of `rows` permuted 1152-byte
    rows (the KV layout at page size 1), and of a contiguous copy of the same bytes (the
    scattering penalty of the memory system at this size; medians of 20)."""
    import torch

    if device != "cuda":
        return 0.0, 0.0
    src = torch.randn(rows + 64, 576, device=device).to(torch.bfloat16)
    idx = torch.randperm(rows + 64, device=device)[:rows]
    dst = torch.empty(rows, 576, dtype=torch.bfloat16, device=device)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device=device)

    def timed(fn: Callable[[], object]) -> float:
        for _ in range(3):
            fn()
        times = []
        for _ in range(20):
            flush.zero_()                      # evict src from L2
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1000)
        return 2 * rows * KV_ROW_BYTES / statistics.median(times)

    scattered = timed(lambda: torch.index_select(src, 0, idx, out=dst))
    contiguous = timed(lambda: dst.copy_(src[:rows]))
    return scattered, contiguous


def mla_bytes(length: int, nhead: int) -> int:
    """Fewest bytes one call must move: KV rows + page-table entries read, q read, o written."""
    return length * (KV_ROW_BYTES + 4) + nhead * 576 * 2 + nhead * 512 * 2


# ----------------------------------------------------------------------------------------
# the benchmark
# ----------------------------------------------------------------------------------------


def run_bench(cfg: Config, out: Path | None = None, log: Callable[[str], None] = print) -> Results:
    """All measurements; writes splits.json after every length when `out` is given."""
    import torch

    backend = "triton" if cfg.device == "cuda" else "torch"
    res = Results(config={k: v for k, v in asdict(cfg).items()})
    if cfg.device == "cuda":
        props = torch.cuda.get_device_properties(0)
        res.gpu = dict(name=props.name, sms=props.multi_processor_count,
                       l2_bytes=getattr(props, "L2_cache_size", None),
                       torch=torch.__version__, triton=_triton_version())
    res.read_ceiling_bytes_per_s = read_ceiling(cfg.device)
    log(f"read ceiling (1 GiB copy, read+write): {res.read_ceiling_bytes_per_s / 1e12:.2f} TB/s")
    try:
        res.gather_ceiling_bytes_per_s, res.contiguous_copy_bytes_per_s = gather_ceiling(cfg.device)
    except Exception as exc:  # a diagnostic only
        log(f"scattered-row ceiling failed: {type(exc).__name__}: {exc}")
    log(f"scattered-row ceiling (index_select of 100K permuted 1152-byte rows, read+write):"
        f" {res.gather_ceiling_bytes_per_s / 1e12:.2f} TB/s; contiguous copy of the same"
        f" bytes {res.contiguous_copy_bytes_per_s / 1e12:.2f} TB/s")
    timer = Timer(cfg)
    for length in cfg.lengths:
        torch.manual_seed(length)
        sets = make_sets(length, cfg.nhead, cfg.device, cfg.sets)
        row: dict = dict(length=length, sets=len(sets), columns={}, sweep={})
        for name, (policy, hint_of) in COLUMNS.items():
            row["columns"][name] = timer.per_call_us(mla_calls(sets, policy, hint_of(length),
                                                               backend))
        for splits in cfg.sweep:
            row["sweep"][splits] = timer.per_call_us(mla_calls(sets, f"fixed:{splits}", length,
                                                               backend))
        best_splits = min(row["sweep"], key=lambda s: row["sweep"][s]["us"])
        row["best_splits"] = best_splits
        row["best_us"] = row["sweep"][best_splits]["us"]
        row["one_split_us"] = row["sweep"].get(1, row["columns"]["legacy@1"])["us"]
        row["device_over_best"] = row["columns"]["device"]["us"] / row["best_us"]
        row["device_over_one_split"] = row["columns"]["device"]["us"] / row["one_split_us"]
        row["bytes"] = mla_bytes(length, cfg.nhead)
        row["device_bytes_per_s"] = row["bytes"] / (row["columns"]["device"]["us"] * 1e-6)
        row["best_bytes_per_s"] = row["bytes"] / (row["best_us"] * 1e-6)
        res.rows.append(row)
        log(row_line(row, res.read_ceiling_bytes_per_s))
        del sets
        if out is not None:
            write_json(out, res)
    if cfg.tune and cfg.device == "cuda":
        try:
            tune(cfg, timer, res, log)
        except Exception as exc:  # diagnostics only: keep the table and plot
            log(f"tuning stopped: {type(exc).__name__}: {exc}")
        if out is not None:
            write_json(out, res)
    if cfg.device == "cuda":
        res.stages_100k = stage_breakdown(cfg, timer, max(cfg.lengths), log)
    return res


def tune_stage1_configs(cfg: Config, timer: Timer, res: Results, log: Callable[[str], None],
                        sets: list[dict], length: int) -> None:
    """The device policy on `sets` by stage-1 config (`tune_configs`) into res.tuning,
    every config error an entry."""
    from mlatrace.reference import gluon_mla

    for config in tune_configs():
        s1 = config.stage1
        kernel = "gluon" if s1.gluon else "triton"
        if s1.gluon and not gluon_mla.available(sets[0]["kv_c"]):
            continue                     # the Gluon kernel does not serve this machine
        try:
            t = timer.per_call_us(mla_calls(sets, "device", 1, "triton", config))
        except Exception as exc:  # a config that does not compile: record and go on
            t = dict(us=float("nan"), error=f"{type(exc).__name__}: {exc}"[:300])
        entry = dict(length=length, kernel=kernel, budget=config.device_budget,
                     tile_n=s1.tile_n, warps=s1.num_warps, stages=s1.num_stages,
                     prefetch=s1.prefetch, **t,
                     bytes_per_s=mla_bytes(length, cfg.nhead) / (t["us"] * 1e-6))
        res.tuning.append(entry)
        log(f"tune {length}: {kernel} budget {config.device_budget:4d} tile {s1.tile_n:3d}"
            f" warps {s1.num_warps} stages {s1.num_stages} prefetch {int(s1.prefetch)}:"
            f" {t['us']:9.1f} us  {entry['bytes_per_s'] / 1e12:5.2f} TB/s {t.get('error', '')}")


def tune(cfg: Config, timer: Timer, res: Results, log: Callable[[str], None]) -> None:
    """Device policy at the longest length by stage-1 config (launch budget, inner tile,
    warps, stages, page-table prefetch) and by stage-2 tile; stage 2 as a programmatic
    dependent launch or not at a few lengths; stage 2's split tiers at short lengths; its
    smallest chunk (min tiles per split) at mid lengths. Each row names its own config:
    nothing is changed in place, so every other row runs the shipped one."""
    import torch

    from mlatrace.reference.kernel_config import DEFAULT, Stage2Config

    length = max(cfg.lengths)
    sets = make_sets(length, cfg.nhead, cfg.device)
    tune_stage1_configs(cfg, timer, res, log, sets, length)
    for block_s, block_dv in TUNE_STAGE2:
        config = replace(DEFAULT, stage2=replace(DEFAULT.stage2, max_block_s=block_s,
                                                 block_dv=block_dv))
        t = timer.per_call_us(mla_calls(sets, "device", 1, "triton", config))
        res.stage2_tuning.append(dict(length=length, block_s=block_s, block_dv=block_dv, **t))
        log(f"stage 2 {length}: max_block_s {block_s:3d} block_dv {block_dv:3d}:"
            f" {t['us']:8.1f} us")
    del sets
    for length in TUNE_PDL_LENGTHS:
        # PDL off / on for the device policy, and for the best fixed split (sweep).
        sets = make_sets(length, cfg.nhead, cfg.device)
        for mode in ("off", "all"):
            config = replace(DEFAULT, pdl=mode)
            t = timer.per_call_us(mla_calls(sets, "device", 1, "triton", config))
            # the best split of the main table at this length (all of the sweep if none)
            candidates = [r["best_splits"] for r in res.rows if r["length"] == length]
            best = min((timer.per_call_us(mla_calls(sets, f"fixed:{n}", length, "triton",
                                                    config))["us"], n)
                       for n in (candidates or cfg.sweep))
            res.pdl.append(dict(length=length, pdl=mode, **t, best_fixed_us=best[0],
                                best_fixed_splits=best[1]))
            log(f"pdl {length}: {mode}: device {t['us']:8.1f} us, best fixed {best[0]:.1f} us"
                f" (S={best[1]})")
        del sets
    # Short lengths: stage 2's split tiers (a narrow merge tile when few splits are
    # active) against none.
    for length in TUNE_TIER_LENGTHS:
        sets = make_sets(length, cfg.nhead, cfg.device)
        for label, small_s, mid_s in TUNE_TIERS:
            config = replace(DEFAULT, stage2=Stage2Config(small_s=small_s, mid_s=mid_s))
            t = timer.per_call_us(mla_calls(sets, "device", 1, "triton", config))
            res.short.append(dict(length=length, label=label, small_s=small_s,
                                  mid_s=mid_s, **t))
            log(f"stage 2 tiers {length}: {label}: {t['us']:8.1f} us")
        del sets
    # The kernel without scattering: the same 100K rows through an identity page table.
    length = max(cfg.lengths)
    sets = make_sets(length, cfg.nhead, cfg.device)
    for st in sets:
        st["page_table"] = torch.arange(st["page_table"].shape[1], dtype=torch.int32,
                                        device=cfg.device).reshape(1, -1)
    t = timer.per_call_us(mla_calls(sets, "device", 1, "triton"))
    res.contiguous = dict(length=length, **t,
                          bytes_per_s=mla_bytes(length, cfg.nhead) / (t["us"] * 1e-6))
    log(f"device at {length}, contiguous pages: {t['us']:.1f} us"
        f" ({res.contiguous['bytes_per_s'] / 1e12:.2f} TB/s)")
    del sets
    for length in TUNE_MIN_TILES_LENGTHS:
        sets = make_sets(length, cfg.nhead, cfg.device)
        for min_tiles in TUNE_MIN_TILES:
            config = replace(DEFAULT, min_tiles=min_tiles)
            t = timer.per_call_us(mla_calls(sets, "device", 1, "triton", config))
            res.min_tiles.append(dict(length=length, min_tiles=min_tiles, **t))
            log(f"min tiles {length}: {min_tiles}: {t['us']:8.1f} us")
        del sets


def stage_breakdown(cfg: Config, timer: Timer, length: int, log: Callable[[str], None]) -> dict:
    """Stage 1 alone and stage 2 alone of the device policy at `length` (graph-timed)."""
    import torch

    from mlatrace.reference import mla, policies
    from mlatrace.reference.kernel_config import DEFAULT
    from mlatrace.reference.layout import D_LATENT

    sets = make_sets(length, cfg.nhead, cfg.device)
    splits = policies.num_kv_splits("device", 1, 1, cfg.nhead, 1,
                                    device_budget=DEFAULT.device_budget)
    block_dv = DEFAULT.stage2.block_dv
    grid1 = (1, splits, policies.head_blocks(cfg.nhead))
    grid2 = (1, cfg.nhead, D_LATENT // block_dv)
    scale = 1.0 / math.sqrt(576)
    stage1, stage2 = [], []
    for s in sets:
        part = torch.empty(1, splits, cfg.nhead, 512, dtype=torch.float32, device=cfg.device)
        lse = torch.full((1, splits, cfg.nhead), float("-inf"), device=cfg.device)
        k_pe = s["kv_c"][:, 512:]
        common = dict(NUM_KV_SPLITS=splits, BLOCK_N=mla.BLOCK_N, DEVICE_PARTITION=True,
                      MIN_TILES_PER_SPLIT=DEFAULT.min_tiles, backend="triton")
        stage1.append(lambda s=s, part=part, lse=lse, k_pe=k_pe, common=common: mla.launch_stage1(
            mla.STAGE1_NAME, grid1, q_nope=s["q_nope"], q_pe=s["q_pe"], kv_c=s["kv_c"],
            k_pe=k_pe, page_table=s["page_table"], seq_info=s["seq_info"], sm_scale=scale,
            o=s["o"], lse_out=None, partial_out=part, partial_lse=lse, BLOCK_H=mla.HEAD_BLOCK,
            **common))
        stage2.append(lambda s=s, part=part, lse=lse, common=common: mla.launch_stage2(
            mla.STAGE2_NAME, grid2, partial_out=part, partial_lse=lse, seq_info=s["seq_info"],
            o=s["o"], lse_out=None, BLOCK_S=mla.stage2_block_s(splits), BLOCK_DV=block_dv,
            **common))
    t1 = timer.per_call_us(stage1)
    t2 = timer.per_call_us(stage2)
    nbytes = mla_bytes(length, cfg.nhead)
    result = dict(length=length, splits=splits, stage1_us=t1["us"], stage2_us=t2["us"],
                  stage1_bytes_per_s=nbytes / (t1["us"] * 1e-6))
    log(f"device at {length}: stage 1 {t1['us']:.1f} us ({result['stage1_bytes_per_s'] / 1e12:.2f}"
        f" TB/s), stage 2 {t2['us']:.1f} us")
    return result


def _triton_version() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return triton.__version__


def main(out: str, quick: bool) -> int:
    """CLI entry: 0 on success, 2 without a CUDA GPU."""
    try:
        import torch
    except ImportError:
        print("mlatrace bench splits needs torch and triton (pip install 'mlatrace[reference]')",
              file=sys.stderr)
        return ExitCode.UNUSABLE
    if not torch.cuda.is_available():
        print("mlatrace bench splits needs a CUDA GPU", file=sys.stderr)
        return ExitCode.UNUSABLE
    cfg = Config(lengths=QUICK_LENGTHS if quick else LENGTHS,
                 sweep=QUICK_SWEEP if quick else SWEEP,
                 min_replays=5 if quick else 20, max_replays=30 if quick else 200,
                 seconds_per_point=0.05 if quick else 0.25, tune=not quick)
    out_dir = Path(out)
    res = run_bench(cfg, out_dir)
    write_outputs(out_dir, res)
    print(markdown(res))
    print(f"wrote {out_dir / 'splits.md'}, {out_dir / 'splits.json'}, {out_dir / 'splits.png'}")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench-splits")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    sys.exit(main(args.out, args.quick))
