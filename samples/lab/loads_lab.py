"""Session 4 lab (run 26): how fast can stage 1's loads alone go? The stage-1 gather loop
(page-table entry per row, 1152-byte KV rows, unmasked clamped loads, 32-bit offsets) at
100K tokens on 132 programs, with the attention math replaced by (A) an elementwise sum
of the tiles, no MMA, or (B) only the P.V MMA with a constant P. If (A) reaches ~3.5
TB/s, the memory side allows the 85% goal and stage 1's math is what is in the way; if
it stops near stage 1's 2.7 TB/s, the load pattern itself is the limit.

  python3 samples/lab/loads_lab.py"""

import torch
import triton
import triton.language as tl


@triton.jit
def _loads(kv_c, page_table, out, seq_len, CHUNK: tl.constexpr, TILE_N: tl.constexpr,
           MODE: tl.constexpr):
    split = tl.program_id(0)
    start = split * CHUNK
    end = tl.minimum(start + CHUNK, seq_len)
    last = tl.maximum(end - 1, 0)
    offs_d = tl.arange(0, 512)
    offs_r = tl.arange(0, 64)
    if MODE == 0:
        acc = tl.zeros([TILE_N, 512], tl.float32)
    else:
        acc = tl.zeros([16, 512], tl.float32)
        p = tl.full([16, TILE_N], 0.001, tl.bfloat16)
    acc_r = tl.zeros([TILE_N, 64], tl.float32)
    for start_n in range(start, end, TILE_N):
        slots = tl.load(page_table + tl.minimum(start_n + tl.arange(0, TILE_N), last))
        latent = tl.load(kv_c + slots[:, None] * 576 + offs_d[None, :])
        rope = tl.load(kv_c + 512 + slots[:, None] * 576 + offs_r[None, :])
        if MODE == 0:
            acc += latent.to(tl.float32)
        else:
            acc += tl.dot(p, latent)
        acc_r += rope.to(tl.float32)
    total = tl.sum(tl.sum(acc, 1), 0) + tl.sum(tl.sum(acc_r, 1), 0)
    tl.store(out + split, total)


def time_us(kv, table, out, length, chunk, tile, mode, warps, stages) -> float:
    """Best of 3 x 100 back-to-back launches, us per call."""
    grid = (triton.cdiv(length, chunk),)

    def run() -> None:
        _loads[grid](kv, table, out, length, CHUNK=chunk, TILE_N=tile, MODE=mode,
                     num_warps=warps, num_stages=stages)

    run()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(True), torch.cuda.Event(True)
    best = 1e9
    for _ in range(3):
        start.record()
        for _ in range(100):
            run()
        stop.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(stop) * 10)
    return best


def main() -> None:
    length, rows_total = 100_000, 100_007
    kv = torch.randn(rows_total, 576, device="cuda", dtype=torch.bfloat16)
    pt = torch.randperm(rows_total, device="cuda")[:length].to(torch.int32)
    ident = torch.arange(length, device="cuda", dtype=torch.int32)
    out = torch.empty(512, device="cuda")
    nbytes = length * 576 * 2
    for mode, name in ((0, "sum"), (1, "pv")):
        for tile, warps, stages, programs in ((64, 8, 1, 132), (64, 8, 2, 132), (64, 8, 3, 132),
                                             (64, 4, 3, 132), (32, 4, 3, 264), (32, 4, 4, 264),
                                             (32, 8, 3, 132), (64, 8, 3, 264)):
            chunk = triton.cdiv(triton.cdiv(length, programs), tile) * tile
            for table, tname in ((pt, "scattered"), (ident, "identity")):
                try:
                    us = time_us(kv, table, out, length, chunk, tile, mode, warps, stages)
                except Exception as exc:  # noqa: BLE001 (a config that does not fit)
                    print(f"{name} tile {tile} warps {warps} stages {stages}: "
                          f"{type(exc).__name__} {str(exc)[:120]}", flush=True)
                    continue
                print(f"{name:3} tile {tile:2} warps {warps} stages {stages} programs "
                      f"{triton.cdiv(length, chunk):3} {tname:9}: {us:6.1f} us "
                      f"{nbytes / us / 1e6:5.2f} TB/s", flush=True)


if __name__ == "__main__":
    main()
