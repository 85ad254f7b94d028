"""GPU check of the reference kernels: compiled Triton vs float64 at full size, on CUDA.

On a Hopper GPU with Triton 3.6, bf16 stage 1 runs the Gluon kernel (`gluon_mla`); the
checks below cover it there, and the Triton stage 1 everywhere else (fp32, other GPUs).

`python3 -m mlatrace.reference.gpu_check [--out DIR] [--quick]` checks, on fresh random
inputs with scattered page tables and NaN-poisoned outputs:
- `mla_gluon` (nhead 16 and 128, bf16 and fp32, every policy, lengths 1 .. 100K), eager
  (under torch.cuda.set_sync_debug_mode("error"): no host sync) and replayed from one
  CUDA graph captured at dummy length 1, plus the torch backend on CUDA inside a graph;
- `paged_attention_v1`: replays shorter than the captured max are right, longer are wrong.
Prints one line per check and a summary table last; exit 0 when every check passes.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

from mlatrace.exitcodes import ExitCode
from mlatrace.reference.kernel_config import DEFAULT
from mlatrace.reference.mla import mla_gluon, mla_reference
from mlatrace.reference.paged_attention import paged_attention_reference, paged_attention_v1

SM_SCALE = 1.0 / math.sqrt(576)
TOL = {torch.bfloat16: 1e-2, torch.float32: 1e-5}
LENGTH_SETS = ([1, 1, 1, 1], [64, 65, 63, 2], [4097, 16384, 1, 100_000],
               [100_000, 65_537, 8192, 100_000])
QUICK_LENGTH_SETS = ([1, 1, 1, 1], [4097, 16384, 1, 100_000])
POLICIES = (("legacy@1", "legacy", "one"), ("legacy@real", "legacy", "real"),
            ("bucketed@real", "bucketed", "real"), ("device", "device", "one"),
            ("fixed128", "fixed:128", "one"))
MAX_LEN = 100_000


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref).norm() / ref.norm()).item()


class MLABuffers:
    """Static buffers of one batch, like an engine's: graphs read them, checks refill them."""

    def __init__(self, batch: int, nhead: int, dtype: torch.dtype, max_len: int):
        num_slots = batch * (max_len + 8)
        self.kv_c = torch.randn(num_slots, 576, device="cuda").to(dtype)
        self.page_table = torch.randperm(num_slots, device="cuda")[: batch * (max_len + 8)]
        self.page_table = self.page_table.reshape(batch, -1).to(torch.int32)
        self.q_nope = torch.randn(batch, nhead, 512, device="cuda").to(dtype)
        self.q_pe = torch.randn(batch, nhead, 64, device="cuda").to(dtype)
        self.seq_info = torch.ones(batch, dtype=torch.int32, device="cuda")
        self.o = torch.empty(batch, nhead, 512, dtype=dtype, device="cuda")
        self.lse = None

    def refresh(self, lengths: list[int]) -> None:
        """New random queries (never zeros), the given lengths, a poisoned output."""
        self.q_nope.copy_(torch.randn_like(self.q_nope, dtype=torch.float32))
        self.q_pe.copy_(torch.randn_like(self.q_pe, dtype=torch.float32))
        self.seq_info.copy_(torch.tensor(lengths, dtype=torch.int32))
        self.o.fill_(float("nan"))

    def call(self, policy: str, hint: int, backend: str = "triton") -> None:
        _, self.lse = mla_gluon(self.q_nope, self.q_pe, self.kv_c, self.o, self.page_table,
                                self.seq_info, SM_SCALE, min_kv_seq_len=hint, policy=policy,
                                return_lse=True, backend=backend)

    def errors(self, lengths: list[int]) -> tuple[float, float]:
        ref, ref_lse = mla_reference(self.q_nope, self.q_pe, self.kv_c, self.page_table,
                                     lengths, SM_SCALE)
        if torch.isnan(self.o).any():
            return math.nan, math.nan
        lse_err = (self.lse.double() - ref_lse).abs().max().item()
        return rel_err(self.o, ref), lse_err


def check_mla(nhead: int, dtype: torch.dtype, length_sets, results: list[dict]) -> None:
    buffers = MLABuffers(4, nhead, dtype, MAX_LEN)
    tol = TOL[dtype]
    for name, policy, hint_kind in POLICIES:
        # eager, no host sync allowed
        for lengths in length_sets:
            buffers.refresh(lengths)
            hint = 1 if hint_kind == "one" else min(lengths)
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
            try:
                buffers.call(policy, hint)
            except RuntimeError as exc:  # a host sync inside mla_gluon: a failed check
                torch.cuda.set_sync_debug_mode("default")
                print(f"FAIL host sync in mla_gluon ({name}): {exc}", flush=True)
                record(results, "mla", name, nhead, dtype, "eager-sync", lengths, math.nan,
                       math.nan, tol)
                continue
            finally:
                torch.cuda.set_sync_debug_mode("default")
            torch.cuda.synchronize()
            record(results, "mla", name, nhead, dtype, "eager", lengths, *buffers.errors(lengths),
                   tol)
        if hint_kind == "real":
            continue  # a graph per real hint is the eager case again
        # one graph captured at dummy length 1, replayed at every length set
        buffers.refresh([1, 1, 1, 1])
        buffers.call(policy, 1)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            buffers.call(policy, 1)
        for lengths in length_sets:
            buffers.refresh(lengths)
            graph.replay()
            torch.cuda.synchronize()
            record(results, "mla", name, nhead, dtype, "graph@1", lengths,
                   *buffers.errors(lengths), tol)
        del graph


def check_mla_torch_backend_in_graph(results: list[dict]) -> None:
    """The torch stages are capturable too (no .item()): graph at 1, replay at 3000."""
    buffers = MLABuffers(2, 16, torch.bfloat16, 4096)
    for policy in ("legacy", "device"):
        buffers.refresh([1, 1])
        buffers.call(policy, 1, backend="torch")
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            buffers.call(policy, 1, backend="torch")
        for lengths in ([3000, 17], [1, 4096]):
            buffers.refresh(lengths)
            graph.replay()
            torch.cuda.synchronize()
            record(results, "mla-torch", policy, 16, torch.bfloat16, "graph@1", lengths,
                   *buffers.errors(lengths), 1e-2)


def check_pa(dtype: torch.dtype, results: list[dict], max_tokens: int = 32768) -> None:
    """GQA 32/8, head 128, block 16: eager at the real max, then one graph captured at
    max_tokens // 4 replayed shorter (right) and longer (wrong past the captured max)."""
    num_heads, num_kv_heads, head_size, block_size = 32, 8, 128, 16
    blocks_per_seq = max_tokens // block_size + 1
    num_seqs = 3
    num_blocks = num_seqs * blocks_per_seq + 5
    shape = (num_blocks, num_kv_heads, block_size, head_size)
    key_cache = torch.randn(shape, device="cuda").to(dtype)
    value_cache = torch.randn(shape, device="cuda").to(dtype)
    tables = torch.randperm(num_blocks, device="cuda")[: num_seqs * blocks_per_seq]
    tables = tables.reshape(num_seqs, -1).to(torch.int32)
    query = torch.randn(num_seqs, num_heads, head_size, device="cuda").to(dtype)
    seq_lens = torch.tensor([64, 64, 64], dtype=torch.int32, device="cuda")
    out = torch.empty_like(query)
    scale = 1.0 / math.sqrt(head_size)

    def call(max_seq_len: int) -> None:
        paged_attention_v1(out, query, key_cache, value_cache, num_kv_heads, scale, tables,
                           seq_lens, block_size, max_seq_len, backend="triton")

    tol = TOL[dtype]
    eager_sets = ([1, max_tokens // 32 + 1, max_tokens], [17, max_tokens - 1, max_tokens // 8])
    for lengths in eager_sets:                                           # eager at the real max
        seq_lens.copy_(torch.tensor(lengths, dtype=torch.int32))
        out.fill_(float("nan"))
        call(max(lengths))
        torch.cuda.synchronize()
        ref = paged_attention_reference(query, key_cache, value_cache, num_kv_heads, scale,
                                        tables, lengths, block_size)
        errs = [rel_err(out[i], ref[i]) for i in range(num_seqs)]
        record(results, "pa_v1", "eager", num_heads, dtype, "eager", lengths, max(errs), 0.0, tol)
    captured_max = max_tokens // 4
    call(captured_max)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call(captured_max)
    replay_sets = (([1, captured_max, captured_max * 5 // 8], True),
                   ([2 * captured_max, captured_max, 1], False))
    for lengths, expect_right in replay_sets:
        seq_lens.copy_(torch.tensor(lengths, dtype=torch.int32))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref = paged_attention_reference(query, key_cache, value_cache, num_kv_heads, scale,
                                        tables, lengths, block_size)
        errs = [rel_err(out[i], ref[i]) for i in range(num_seqs)]
        ok = all((e < tol) == (n <= captured_max) for e, n in zip(errs, lengths, strict=True))
        results.append(dict(kernel="pa_v1", policy=f"graph@{captured_max}", nhead=num_heads,
                            dtype=str(dtype).replace("torch.", ""), mode="graph", lengths=lengths,
                            err=max(errs), lse_err=0.0, ok=ok,
                            note="longer than captured must be wrong" if not expect_right
                            else "shorter than captured must be right",
                            per_seq=[round(e, 6) for e in errs]))
        print(_line(results[-1]), flush=True)


def record(results: list[dict], kernel: str, policy: str, nhead: int, dtype: torch.dtype,
           mode: str, lengths: list[int], err: float, lse_err: float, tol: float) -> None:
    ok = err == err and err < tol and lse_err < 1e-3
    results.append(dict(kernel=kernel, policy=policy, nhead=nhead,
                        dtype=str(dtype).replace("torch.", ""), mode=mode, lengths=list(lengths),
                        err=err, lse_err=lse_err, ok=ok))
    print(_line(results[-1]), flush=True)


def _line(r: dict) -> str:
    return (f"{'ok  ' if r['ok'] else 'FAIL'} {r['kernel']:9} {r['policy']:14} h{r['nhead']:<4}"
            f" {r['dtype']:9} {r['mode']:8} {str(r['lengths']):32} err {r['err']:.2e}"
            f" lse {r['lse_err']:.1e}")


def compile_report() -> int:
    """Compile the kernels for sm_90 without a GPU (Triton's bundled ptxas) and print their
    registers, spill stack, shared memory and global-load mix: what fits per SM, costs
    no device time. Real launches get 16-byte divisibility hints for pointers and strides
    that are multiples of 16; the same hints are given here."""
    import collections
    import inspect
    import os
    import re
    import subprocess
    import tempfile

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from mlatrace.reference import gluon_mla, triton_mla, triton_pa

    not_aligned = {"stride_pt_b", "stride_bt_s", "max_num_blocks", "nhead"}
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                             "cuobjdump")

    def build(fn, types: dict, const: dict, warps: int, stages: int, source=ASTSource):
        const = {**{p.name: p.default for p in fn.params
                    if p.is_constexpr and p.name not in const
                    and p.default is not inspect.Parameter.empty},
                 **const}
        sig, attrs = {}, {}
        for i, name in enumerate(fn.arg_names):
            if name in const:
                sig[name] = "constexpr"
                continue
            sig[name] = types.get(name, "i32")
            if sig[name].startswith("*") or (sig[name] == "i32" and name not in not_aligned):
                attrs[(i,)] = [["tt.divisibility", 16]]
        src = source(fn, sig, attrs=attrs,
                     constexprs={(fn.arg_names.index(k),): v for k, v in const.items()})
        return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                              options=dict(num_warps=warps, num_stages=stages))

    def describe(kernel) -> str:
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(kernel.asm["cubin"])
            f.flush()
            usage = subprocess.run([cuobjdump, "--dump-resource-usage", f.name],
                                   capture_output=True, text=True).stdout
        regs = re.search(r"REG:(\d+) STACK:(\d+)", usage)
        ops = collections.Counter(re.findall(r"\b(ld\.global[.\w]*|cp\.async\.cg[.\w]*)",
                                             kernel.asm["ptx"]))
        return (f"regs {regs.group(1) if regs else '?'} stack {regs.group(2) if regs else '?'}"
                f" smem {kernel.metadata.shared // 1024} KiB  "
                + " ".join(f"{k}:{v}" for k, v in sorted(ops.items())))

    def stage1(dtype: str, warps: int, stages: int, dot_mode: int):
        types = {n: f"*{dtype}" for n in ("q_nope", "q_pe", "kv_c", "k_pe", "o")}
        types.update(page_table="*i32", seq_info="*i32", lse_out="*fp32", partial_out="*fp32",
                     partial_lse="*fp32", sm_scale="fp32")
        const = dict(NUM_KV_SPLITS=132, BLOCK_N=64, BLOCK_H=16, D_LATENT=512, D_ROPE=64,
                     DEVICE_PARTITION=True, MIN_TILES=1, DIRECT_OUTPUT=False, RETURN_LSE=False,
                     DOT_MODE=dot_mode,
                     TILE_N=64 if dot_mode == 2 else min(DEFAULT.stage1.tile_n, 64),
                     PREFETCH=DEFAULT.stage1.prefetch and dot_mode != 2, PDL=True,
                     OFFSETS_32=True)
        return build(triton_mla._mla_stage1_kernel, types, const, warps, stages)

    rows = []
    for warps, stages in ((8, 5), (4, 5), (8, 3), (4, 2)):
        rows.append((f"stage 1 bf16 w{warps} s{stages}", lambda w=warps, s=stages: stage1(
            "bf16", w, s, 0)))
    rows.append(("stage 1 fp32 tf32x3 w4 s2", lambda: stage1("fp32", 4, 2, 2)))
    if gluon_mla.gluon is not None and triton.__version__.startswith(gluon_mla.GLUON_TRITON + "."):
        from triton.experimental.gluon._runtime import GluonASTSource

        types = {n: "*bf16" for n in ("q_nope", "q_pe", "kv_c", "k_pe", "o")}
        types.update(page_table="*i32", seq_info="*i32", lse_out="*fp32", partial_out="*fp32",
                     partial_lse="*fp32", sm_scale="fp32")
        rows.append(("stage 1 bf16 Gluon (H200 path)", lambda: build(
            gluon_mla._mla_stage1_wgmma_kernel, types,
            dict(NUM_KV_SPLITS=132, BLOCK_N=64, DEVICE_PARTITION=True, MIN_TILES=1,
                 DIRECT_OUTPUT=False, RETURN_LSE=False, PDL=True,
                 COL_SPLITS=triton_mla.column_splits(132, DEFAULT.stage1.column_splits)),
            gluon_mla.NUM_WARPS, 1, source=GluonASTSource)))
    rows.append(("stage 2", lambda: build(
        triton_mla._mla_stage2_kernel,
        dict(partial_out="*fp32", partial_lse="*fp32", seq_info="*i32", o="*bf16",
             lse_out="*fp32"),
        dict(NUM_KV_SPLITS=132, BLOCK_N=64, BLOCK_S=256, BLOCK_DV=32, DEVICE_PARTITION=True,
             MIN_TILES=1, RETURN_LSE=False), 4, 1)))
    rows.append(("PA v1 bf16 group 4 head 128", lambda: build(
        triton_pa._paged_attention_v1_kernel,
        {**{n: "*bf16" for n in ("out", "query", "key_cache", "value_cache")},
         "block_tables": "*i32", "seq_lens": "*i32", "scale": "fp32", "v_scale": "fp32"},
        dict(GROUP=4, BLOCK_G=16, BLOCK_SIZE=16, HEAD_SIZE=128, DOT_MODE=0), 4, 2)))
    for name, make in rows:
        try:
            print(f"{name:30} {describe(make())}", flush=True)
        except Exception as exc:  # report and go on: one config may not compile
            print(f"{name:30} FAILED {type(exc).__name__}: {str(exc)[-600:]}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="write gpu_check.json here")
    parser.add_argument("--quick", action="store_true", help="fewer lengths, bf16 only")
    parser.add_argument("--compile-report", action="store_true",
                        help="no GPU needed: compile for sm_90 and print registers/smem")
    args = parser.parse_args(argv)
    if args.compile_report:
        return compile_report()
    if not torch.cuda.is_available():
        print("gpu_check needs a CUDA GPU", file=sys.stderr)
        return ExitCode.UNUSABLE
    torch.manual_seed(0)
    start = time.time()
    results: list[dict] = []
    dtypes = (torch.bfloat16,) if args.quick else (torch.bfloat16, torch.float32)
    length_sets = QUICK_LENGTH_SETS if args.quick else LENGTH_SETS
    for dtype in dtypes:
        for nhead in (16, 128):
            check_mla(nhead, dtype, length_sets, results)
    check_mla_torch_backend_in_graph(results)
    for dtype in dtypes:
        check_pa(dtype, results)
    failed = [r for r in results if not r["ok"]]
    print(f"\n{torch.cuda.get_device_name(0)}: {len(results)} checks, {len(failed)} failed,"
          f" {time.time() - start:.0f} s")
    worst: dict[tuple, float] = {}
    for r in results:
        key = (r["kernel"], r["policy"], r["dtype"], r["mode"])
        worst[key] = max(worst.get(key, 0.0), r["err"] if r["err"] == r["err"] else math.inf)
    print(f"{'kernel':9} {'policy':14} {'dtype':9} {'mode':8} worst rel err")
    for (kernel, policy, dtype, mode), err in sorted(worst.items()):
        print(f"{kernel:9} {policy:14} {dtype:9} {mode:8} {err:.2e}")
    for r in failed:
        print("FAILED:", _line(r))
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "gpu_check.json").write_text(json.dumps(results, indent=1))
    return ExitCode.FAILED if failed else ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
