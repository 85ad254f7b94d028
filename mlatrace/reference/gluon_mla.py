"""Stage 1 of the reference MLA decode for Hopper, in Gluon (warpgroup MMA, keys on M).

The portable Triton stage 1 (`triton_mla._mla_stage1_kernel`) puts the 16 heads on M, so
its q.k is a chain of 36 dependent mma.sync steps per warp and the SM idles on that
chain while the next tile's rows wait in flight. Here one
warpgroup computes S^T = K q^T (M = 64 keys, N = 16 heads, K = 576) and O^T += V^T P^T
(M = 512 latent columns, N = 16, K = 64 keys) with asynchronous warpgroup MMAs read from
shared memory, while the gathered KV rows of the next tile arrive by cp.async into a
ring of two shared buffers (164 KiB: one program per SM). The page-table entries of a
tile are read one tile ahead of its copies, so a copy never waits on its own index load.
Measured slower on the H200 (samples/GPU_NOTES.md): a third buffer (226 KiB, P in the
rope slot), two warpgroups per program, and one buffer with two programs per SM.

Same arguments, partition and outputs as the Triton stage 1 for bf16 caches (DOT_MODE
0): partial output + LSE per (batch, split, head block of 16), or `o` directly when the
launch has one split (DIRECT_OUTPUT) or the device partition has one active split. In
that last case the sequence fits one tile, and COL_SPLITS of the launch's otherwise idle
programs each write a share of the value columns (`_one_tile_columns`): a short decode's
P.V and epilogue are split over them, which makes a short decode faster than one split's.
Row offsets are 32-bit (the caller checks `triton_mla.offsets_fit_int32`). Gluon compiles
for NVIDIA only (no interpreter): CPU runs and other GPUs keep the Triton kernel
(`available()`).
"""

from __future__ import annotations

import torch
import triton

from mlatrace.reference import triton_partition

GLUON_TRITON = "3.6"
"""The Triton release this Gluon code is written and measured against (the H200's).
Gluon is experimental and renames its API between releases (3.9: `async_load`,
`gl.barrier`), so other releases keep the portable Triton kernel."""

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        async_copy,
        fence_async_shared,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
except ImportError:  # a Triton without Gluon: the Triton kernel serves every launch
    gluon = None

NUM_WARPS = 4
"""One warpgroup: two (each owning 8 heads, N = 8 MMAs) were slower at every length."""


def available(kv_c: torch.Tensor) -> bool:
    """Whether this stage 1 can serve a launch on `kv_c`: Triton GLUON_TRITON, an NVIDIA
    Hopper device (compute capability 9.x), bf16 caches (the dtype gpu_check covers; fp16
    and fp32 keep the Triton kernel)."""
    return (gluon is not None and triton.__version__.startswith(GLUON_TRITON + ".")
            and kv_c.is_cuda and torch.version.hip is None
            and kv_c.dtype == torch.bfloat16
            and torch.cuda.get_device_capability(kv_c.device)[0] == 9)


if gluon is not None:

    @gluon.jit
    def _launch_dependents():
        """griddepcontrol.launch_dependents: a PDL-launched stage 2 may start now."""
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [],
                                  dtype=gl.int32, is_pure=False, pack=1)

    @gluon.jit
    def _issue_tile(latent_smem, rope_smem, kv_c, k_pe, slots, stride_kv, stride_kpe,
                    load_layout: gl.constexpr):
        """cp.async one tile's gathered rows (latent and rope parts) into a ring slot, as
        one commit group."""
        rows = gl.expand_dims(slots, 1)
        offs_d = gl.arange(0, 512, layout=gl.SliceLayout(0, load_layout))
        offs_r = gl.arange(0, 64, layout=gl.SliceLayout(0, load_layout))
        async_copy.async_copy_global_to_shared(
            latent_smem, kv_c + rows * stride_kv + gl.expand_dims(offs_d, 0))
        async_copy.async_copy_global_to_shared(
            rope_smem, k_pe + rows * stride_kpe + gl.expand_dims(offs_r, 0))
        async_copy.commit_group()

    @gluon.jit
    def _load_q(q_nope, q_pe, b, hblock, nhead, stride_qn_b, stride_qn_h, stride_qp_b,
                stride_qp_h, load_layout: gl.constexpr):
        """q of one head block into registers (rows past nhead are zeros)."""
        heads = hblock * 16 + gl.arange(0, 16, layout=gl.SliceLayout(1, load_layout))
        head_ok = gl.expand_dims(heads < nhead, 1)
        offs_d = gl.arange(0, 512, layout=gl.SliceLayout(0, load_layout))
        offs_r = gl.arange(0, 64, layout=gl.SliceLayout(0, load_layout))
        qn = gl.load(q_nope + b * stride_qn_b + gl.expand_dims(heads, 1) * stride_qn_h
                     + gl.expand_dims(offs_d, 0), mask=head_ok, other=0.0)
        qp = gl.load(q_pe + b * stride_qp_b + gl.expand_dims(heads, 1) * stride_qp_h
                     + gl.expand_dims(offs_r, 0), mask=head_ok, other=0.0)
        return qn, qp

    @gluon.jit
    def _mla_stage1_wgmma_kernel(
        q_nope, q_pe, kv_c, k_pe, page_table, seq_info, sm_scale,
        o, lse_out, partial_out, partial_lse,
        stride_qn_b, stride_qn_h, stride_qp_b, stride_qp_h, stride_kv, stride_kpe,
        stride_pt_b, stride_o_b, stride_o_h, stride_po_b, stride_po_s, stride_po_h,
        stride_pl_b, stride_pl_s, nhead,
        NUM_KV_SPLITS: gl.constexpr, BLOCK_N: gl.constexpr, DEVICE_PARTITION: gl.constexpr,
        MIN_TILES: gl.constexpr, DIRECT_OUTPUT: gl.constexpr, RETURN_LSE: gl.constexpr,
        PDL: gl.constexpr, COL_SPLITS: gl.constexpr = 1,
    ):
        """One (batch, split, head block of 16): online softmax over the split's KV range,
        a ring of two tiles (tile t+1's rows arrive while tile t is computed)."""
        BLOCK_H: gl.constexpr = 16
        TILE: gl.constexpr = 64  # KV rows per tile: M of the q.k warpgroup MMA (its minimum)
        b = gl.program_id(0)
        split = gl.program_id(1)
        hblock = gl.program_id(2)
        if PDL:
            _launch_dependents()

        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                      instr_shape=[16, 16, 16])
        load_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        row_layout: gl.constexpr = gl.SliceLayout(1, load_layout)
        dtype: gl.constexpr = kv_c.dtype.element_ty
        kvl = gl.allocate_shared_memory(
            dtype, [2, TILE, 512], gl.NVMMASharedLayout.get_default_for([TILE, 512], dtype))
        kvr = gl.allocate_shared_memory(
            dtype, [2, TILE, 64], gl.NVMMASharedLayout.get_default_for([TILE, 64], dtype))
        qn_smem = gl.allocate_shared_memory(
            dtype, [BLOCK_H, 512], gl.NVMMASharedLayout.get_default_for([BLOCK_H, 512], dtype))
        qp_smem = gl.allocate_shared_memory(
            dtype, [BLOCK_H, 64], gl.NVMMASharedLayout.get_default_for([BLOCK_H, 64], dtype))
        p_smem = gl.allocate_shared_memory(
            dtype, [TILE, BLOCK_H], gl.NVMMASharedLayout.get_default_for([TILE, BLOCK_H], dtype))

        seq_len = gl.load(seq_info + b)
        if DEVICE_PARTITION:
            active, chunk = triton_partition.device_partition(seq_len, NUM_KV_SPLITS,
                                                              BLOCK_N, MIN_TILES)
        else:
            active = NUM_KV_SPLITS
            chunk = (seq_len + NUM_KV_SPLITS - 1) // NUM_KV_SPLITS
        # One active split over at most one tile (a split may hold MIN_TILES partition
        # tiles of BLOCK_N rows: longer ones take the loop). `and` keeps the test a
        # constexpr False when COL_SPLITS is 1: Triton 3.6 fails to lower stores under an
        # `if` that folds to a constant false.
        if COL_SPLITS > 1 and ((active == 1) & (seq_len <= TILE)):
            if split < COL_SPLITS:
                v_smem = gl.allocate_shared_memory(
                    dtype, [TILE, 512 // COL_SPLITS],
                    gl.NVMMASharedLayout.get_default_for([TILE, 512 // COL_SPLITS], dtype))
                _one_tile_columns(q_nope, q_pe, kv_c, k_pe, page_table, o, lse_out, sm_scale,
                                  b, split, hblock, seq_len, nhead, stride_qn_b, stride_qn_h,
                                  stride_qp_b, stride_qp_h, stride_kv, stride_kpe,
                                  stride_pt_b, stride_o_b, stride_o_h, kvl.index(0),
                                  kvr.index(0), v_smem, qn_smem, qp_smem, p_smem,
                                  512 // COL_SPLITS, RETURN_LSE, load_layout, mma)
        elif split < active:
            start = split * chunk
            end = gl.minimum(start + chunk, seq_len)
            n_tiles = (end - start + TILE - 1) // TILE
            # Rows past `end` read row end-1 again (a written, finite row of this
            # sequence): their scores are set to -inf, so no copy needs a predicate.
            last = gl.maximum(end - 1, 0)
            pt_row = page_table + b * stride_pt_b
            offs_t = gl.arange(0, TILE, layout=row_layout)
            slots = gl.load(pt_row + gl.minimum(start + offs_t, last))
            # q only where there are rows (idle programs exit after seq_info), in flight
            # with the first tile's page-table entries: a little faster than loading it
            # first, while seq_info arrives.
            qn, qp = _load_q(q_nope, q_pe, b, hblock, nhead, stride_qn_b, stride_qn_h,
                             stride_qp_b, stride_qp_h, load_layout)
            _issue_tile(kvl.index(0), kvr.index(0), kv_c, k_pe, slots, stride_kv, stride_kpe,
                        load_layout)
            next_slots = gl.load(pt_row + gl.minimum(start + TILE + offs_t, last))
            qn_smem.store(qn)
            qp_smem.store(qp)

            qk_scale = sm_scale * 1.4426950408889634  # scores in log2 units: exp2 below
            m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=gl.SliceLayout(0, mma))
            l_i = gl.zeros([BLOCK_H], gl.float32, layout=gl.SliceLayout(0, mma))
            acc = gl.zeros([512, BLOCK_H], gl.float32, layout=mma)
            s_zero = gl.zeros([TILE, BLOCK_H], gl.float32, layout=mma)
            keys = gl.arange(0, TILE, layout=gl.SliceLayout(1, mma))
            for t in range(0, n_tiles):
                # Tile t+1 into the slot tile t-1 freed (an empty group past the end keeps
                # the count), then the page-table entries of tile t+2 (used next iteration).
                if t + 1 < n_tiles:
                    _issue_tile(kvl.index((t + 1) % 2), kvr.index((t + 1) % 2), kv_c, k_pe,
                                next_slots, stride_kv, stride_kpe, load_layout)
                else:
                    async_copy.commit_group()
                next_slots = gl.load(pt_row + gl.minimum(start + (t + 2) * TILE + offs_t, last))
                async_copy.wait_group(1)  # tile t's copies (this thread's) are done
                fence_async_shared()
                gl.thread_barrier()       # ... and every thread's

                buf = t % 2
                s = warpgroup_mma(kvl.index(buf), qn_smem.permute((1, 0)), s_zero,
                                  use_acc=False, is_async=True)
                s = warpgroup_mma(kvr.index(buf), qp_smem.permute((1, 0)), s, is_async=True)
                s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
                row_ok = gl.expand_dims(start + t * TILE + keys < end, 1)
                s = gl.where(row_ok, s * qk_scale, float("-inf"))
                m_new = gl.maximum(m_i, gl.max(s, 0))
                alpha = gl.exp2(m_i - m_new)
                p = gl.exp2(s - gl.expand_dims(m_new, 0))
                l_i = l_i * alpha + gl.sum(p, 0)
                acc = acc * gl.expand_dims(alpha, 0)
                m_i = m_new
                p_smem.store(p.to(dtype))
                fence_async_shared()
                gl.thread_barrier()
                acc = warpgroup_mma(kvl.index(buf).permute((1, 0)), p_smem, acc, is_async=True)
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
                gl.thread_barrier()  # every warp is done with slot `buf` before its reuse
            async_copy.wait_group(0)

            heads = hblock * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(0, mma))
            cols = gl.arange(0, 512, layout=gl.SliceLayout(1, mma))
            out, lse = _normalize(acc, m_i, l_i)
            # One split's result is the output: stage 1 writes `o` (stage 2 is skipped or
            # exits), else a partial and its LSE for stage 2.
            if DIRECT_OUTPUT:
                _store_output(o, lse_out, out, lse, b, heads, cols, stride_o_b, stride_o_h,
                              nhead, RETURN_LSE)
            elif DEVICE_PARTITION:
                if active == 1:
                    _store_output(o, lse_out, out, lse, b, heads, cols, stride_o_b,
                                  stride_o_h, nhead, RETURN_LSE)
                else:
                    _store_partial(partial_out, partial_lse, out, lse, b, split, heads, cols,
                                   stride_po_b, stride_po_s, stride_po_h, stride_pl_b,
                                   stride_pl_s, nhead)
            else:
                _store_partial(partial_out, partial_lse, out, lse, b, split, heads, cols,
                               stride_po_b, stride_po_s, stride_po_h, stride_pl_b, stride_pl_s,
                               nhead)

    @gluon.jit
    def _one_tile_columns(q_nope, q_pe, kv_c, k_pe, page_table, o, lse_out, sm_scale, b,
                          split, hblock, seq_len, nhead, stride_qn_b, stride_qn_h,
                          stride_qp_b, stride_qp_h, stride_kv, stride_kpe, stride_pt_b,
                          stride_o_b, stride_o_h, kvl, kvr, v_smem, qn_smem, qp_smem, p_smem,
                          COLS: gl.constexpr, RETURN_LSE: gl.constexpr,
                          load_layout: gl.constexpr, mma: gl.constexpr):
        """The whole sequence fits one tile (device partition, one active split): program
        `split` computes all 64 keys' scores but only value columns [split*COLS, +COLS)
        and writes them to `o`. The launch budget's idle programs share the P.V and the
        epilogue, so the dependent chain of a short decode is shorter than one split's."""
        TILE: gl.constexpr = 64
        offs_t = gl.arange(0, TILE, layout=gl.SliceLayout(1, load_layout))
        slots = gl.load(page_table + b * stride_pt_b
                        + gl.minimum(offs_t, gl.maximum(seq_len - 1, 0)))
        qn, qp = _load_q(q_nope, q_pe, b, hblock, nhead, stride_qn_b, stride_qn_h,
                         stride_qp_b, stride_qp_h, load_layout)
        rows = gl.expand_dims(slots, 1)
        offs_v = split * COLS + gl.arange(0, COLS, layout=gl.SliceLayout(0, load_layout))
        async_copy.async_copy_global_to_shared(v_smem, kv_c + rows * stride_kv
                                               + gl.expand_dims(offs_v, 0))
        _issue_tile(kvl, kvr, kv_c, k_pe, slots, stride_kv, stride_kpe, load_layout)
        qn_smem.store(qn)
        qp_smem.store(qp)
        async_copy.wait_group(0)
        fence_async_shared()
        gl.thread_barrier()

        s = warpgroup_mma(kvl, qn_smem.permute((1, 0)),
                          gl.zeros([TILE, 16], gl.float32, layout=mma), use_acc=False,
                          is_async=True)
        s = warpgroup_mma(kvr, qp_smem.permute((1, 0)), s, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
        keys = gl.arange(0, TILE, layout=gl.SliceLayout(1, mma))
        s = gl.where(gl.expand_dims(keys < seq_len, 1), s * (sm_scale * 1.4426950408889634),
                     float("-inf"))
        m = gl.max(s, 0)
        m = gl.where(m > float("-inf"), m, 0.0)  # an empty sequence: no NaN, l = 0
        p = gl.exp2(s - gl.expand_dims(m, 0))
        l_sum = gl.sum(p, 0)
        p_smem.store(p.to(kv_c.dtype.element_ty))
        fence_async_shared()
        gl.thread_barrier()
        acc = warpgroup_mma(v_smem.permute((1, 0)), p_smem,
                            gl.zeros([COLS, 16], gl.float32, layout=mma), use_acc=False,
                            is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))

        heads = hblock * 16 + gl.arange(0, 16, layout=gl.SliceLayout(0, mma))
        cols = split * COLS + gl.arange(0, COLS, layout=gl.SliceLayout(1, mma))
        out, lse = _normalize(acc, m, l_sum)
        _store_output(o, lse_out, out, lse, b, heads, cols, stride_o_b, stride_o_h, nhead,
                      RETURN_LSE)

    @gluon.jit
    def _normalize(acc, m, l_sum):
        """(out^T = acc / l per head, natural-log LSE): 0 and -inf for a head with no rows
        (l = 0); m is the running max in log2 units."""
        nonempty = l_sum > 0.0
        out = gl.where(gl.expand_dims(nonempty, 0),
                       acc / gl.expand_dims(gl.where(nonempty, l_sum, 1.0), 0), 0.0)
        lse = gl.where(nonempty,
                       (m + gl.log2(gl.where(nonempty, l_sum, 1.0))) * 0.6931471805599453,
                       float("-inf"))
        return out, lse

    @gluon.jit
    def _store_output(o, lse_out, out, lse, b, heads, cols, stride_o_b, stride_o_h, nhead,
                      RETURN_LSE: gl.constexpr):
        """out^T [512, 16] into o[b, heads, :] (16-bit), and the LSE when asked."""
        head_ok = heads < nhead
        gl.store(o + b * stride_o_b + gl.expand_dims(heads, 0) * stride_o_h
                 + gl.expand_dims(cols, 1), out.to(o.dtype.element_ty),
                 mask=gl.expand_dims(head_ok, 0) & gl.expand_dims(cols < 512, 1))
        if RETURN_LSE:
            gl.store(lse_out + b * nhead + heads, lse, mask=head_ok)

    @gluon.jit
    def _store_partial(partial_out, partial_lse, out, lse, b, split, heads, cols,
                       stride_po_b, stride_po_s, stride_po_h, stride_pl_b, stride_pl_s, nhead):
        """out^T [512, 16] and its LSE into the split's fp32 partial slots."""
        head_ok = heads < nhead
        gl.store(partial_out + b * stride_po_b + split * stride_po_s
                 + gl.expand_dims(heads, 0) * stride_po_h + gl.expand_dims(cols, 1), out,
                 mask=gl.expand_dims(head_ok, 0) & gl.expand_dims(cols < 512, 1))
        gl.store(partial_lse + b * stride_pl_b + split * stride_pl_s + heads, lse, mask=head_ok)
