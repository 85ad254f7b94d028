"""Run 18 lab: which keys-on-M stage-1 form is correct on the H200 (run 17: the register
prefetch form was wrong past one tile and hit an illegal address)?  One program per
(split), 16 heads, bf16, scattered page table, against a float32 torch reference.

  python3 samples/lab/kom_debug.py"""

import torch
import triton
import triton.language as tl


@triton.jit
def _kom(q_nope, q_pe, kv_c, k_pe, page_table, seq_len, sm_scale, out, lse,
         stride_kv, CHUNK: tl.constexpr, TILE_N: tl.constexpr, FORM: tl.constexpr,
         ROPE: tl.constexpr):
    """FORM 0: Triton-pipelined loads; 1: register prefetch (loop-carried next tile);
    2: load at the top of each iteration, no carry."""
    split = tl.program_id(0)
    heads = tl.arange(0, 16)
    offs_d = tl.arange(0, 512)
    offs_r = tl.arange(0, 64)
    qn = tl.load(q_nope + heads[:, None] * 512 + offs_d[None, :])
    qp = tl.load(q_pe + heads[:, None] * 64 + offs_r[None, :])
    start = split * CHUNK
    end = tl.minimum(start + CHUNK, seq_len)
    qk_scale = sm_scale * 1.4426950408889634
    m_i = tl.full([16], float("-inf"), tl.float32)
    l_i = tl.zeros([16], tl.float32)
    acc_t = tl.zeros([512, 16], tl.float32)
    qn_t = tl.trans(qn)
    qp_t = tl.trans(qp)
    first = start + tl.arange(0, TILE_N)
    slots = tl.load(page_table + first, mask=first < end, other=0).to(tl.int64)
    latent_next = tl.load(kv_c + slots[:, None] * stride_kv + offs_d[None, :],
                          mask=(first < end)[:, None], other=0.0)
    rope_next = tl.load(k_pe + slots[:, None] * stride_kv + offs_r[None, :],
                        mask=(first < end)[:, None], other=0.0)
    for start_n in range(start, end, TILE_N):
        offs_n = start_n + tl.arange(0, TILE_N)
        row_ok = offs_n < end
        if FORM == 1:
            latent = latent_next
            rope = rope_next
            ahead = offs_n + TILE_N
            s2 = tl.load(page_table + ahead, mask=ahead < end, other=0).to(tl.int64)
            latent_next = tl.load(kv_c + s2[:, None] * stride_kv + offs_d[None, :],
                                  mask=(ahead < end)[:, None], other=0.0)
            rope_next = tl.load(k_pe + s2[:, None] * stride_kv + offs_r[None, :],
                                mask=(ahead < end)[:, None], other=0.0)
        else:
            s1 = tl.load(page_table + offs_n, mask=row_ok, other=0).to(tl.int64)
            latent = tl.load(kv_c + s1[:, None] * stride_kv + offs_d[None, :],
                             mask=row_ok[:, None], other=0.0)
            rope = tl.load(k_pe + s1[:, None] * stride_kv + offs_r[None, :],
                           mask=row_ok[:, None], other=0.0)
        s_t = tl.dot(latent, qn_t)
        if ROPE:
            s_t += tl.dot(rope, qp_t)
        s_t = tl.where(row_ok[:, None], s_t * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s_t, 0))
        alpha = tl.exp2(m_i - m_new)
        p_t = tl.exp2(s_t - m_new[None, :])
        l_i = l_i * alpha + tl.sum(p_t, 0)
        acc_t = acc_t * alpha[None, :] + tl.dot(tl.trans(latent), p_t.to(latent.dtype))
        m_i = m_new
    o_t = acc_t / l_i[None, :]
    tl.store(out + split * 16 * 512 + heads[None, :] * 512 + offs_d[:, None], o_t)
    tl.store(lse + split * 16 + heads, m_i + tl.log2(l_i))


def reference(qn, qp, kv, pt, length, chunk, splits, scale, rope):
    outs = []
    for s in range(splits):
        rows = pt[s * chunk:min((s + 1) * chunk, length)].long()
        k = kv[rows].float()
        sc = qn.float() @ k[:, :512].T
        if rope:
            sc = sc + qp.float() @ k[:, 512:].T
        p = torch.softmax(sc * scale, dim=-1)
        outs.append(p @ k[:, :512])
    return torch.stack(outs)


def main() -> None:
    torch.manual_seed(0)
    dev = "cuda"
    for length, chunk in ((64, 64), (128, 128), (130, 130), (4097, 4097), (100_000, 768)):
        splits = triton.cdiv(length, chunk)
        qn = torch.randn(16, 512, device=dev, dtype=torch.bfloat16)
        qp = torch.randn(16, 64, device=dev, dtype=torch.bfloat16)
        kv = torch.randn(length + 7, 576, device=dev, dtype=torch.bfloat16)
        pt = torch.randperm(length + 7, device=dev)[:length].to(torch.int32)
        scale = 576 ** -0.5
        for rope in (True, False):
            ref = reference(qn, qp, kv, pt, length, chunk, splits, scale, rope)
            for form, warps, stages in ((0, 4, 2), (0, 8, 2), (1, 8, 1), (1, 4, 1), (2, 8, 1),
                                        (2, 4, 1), (2, 8, 2)):
                out = torch.full((splits, 16, 512), float("nan"), device=dev)
                lse = torch.empty(splits, 16, device=dev)
                try:
                    k = _kom[(splits,)](qn, qp, kv, kv[:, 512:], pt, length, scale, out, lse,
                                        kv.stride(0), CHUNK=chunk, TILE_N=64, FORM=form,
                                        ROPE=rope, num_warps=warps, num_stages=stages)
                    torch.cuda.synchronize()
                    err = ((out - ref).abs().max() / ref.abs().max()).item()
                    info = f"regs {k.n_regs} spills {k.n_spills} smem {k.metadata.shared // 1024}K"
                except Exception as exc:  # noqa: BLE001  (an illegal address ends the run)
                    print(f"len {length} rope {rope} form {form} w{warps} s{stages}: "
                          f"{type(exc).__name__} {str(exc)[:200]}", flush=True)
                    return
                print(f"len {length:6} rope {rope:d} form {form} w{warps} s{stages}: "
                      f"rel err {err:.2e}  {info}", flush=True)


if __name__ == "__main__":
    main()
