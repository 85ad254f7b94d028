"""Stand-in of flashinfer-python 0.7.4 flashinfer/mla/_core.py
trtllm_batch_decode_with_kv_cache_mla(query, kv_cache, workspace_buffer, qk_nope_head_dim,
kv_lora_rank, qk_rope_head_dim, block_tables, seq_lens, max_seq_len, ..., backend="auto"):
with backend "auto" the AutoTuner picks the trtllm-gen or the CuTe DSL runner for the
batch, profiled at one KV length (flashinfer#4390: the best one depends on the KV length);
an explicit backend asks nothing. Toy costs and kernel, launched through the HostGraph."""

from __future__ import annotations

import torch

from flashinfer.autotuner import AutoTuner, TunableRunner
from mlatrace.reference import graph


class TrtllmGenMLARunner(TunableRunner):
    def cost(self, kv_len: int) -> float:
        return 5.0 + kv_len / 1000          # fast at short contexts

    def __call__(self, inputs, tactic=-1):
        graph.launch(_decode, inputs[3], inputs[2], 1.0)


class CuteDslMLARunner(TunableRunner):
    def cost(self, kv_len: int) -> float:
        return 20.0 + kv_len / 4000         # fast at long contexts

    def __call__(self, inputs, tactic=-1):
        graph.launch(_decode, inputs[3], inputs[2], 2.0)


def _decode(out, seq_lens, which):
    out[:, 0] = seq_lens.float()
    out[:, 1] = which


def trtllm_batch_decode_with_kv_cache_mla(query, kv_cache, workspace_buffer, qk_nope_head_dim,
                                         kv_lora_rank, qk_rope_head_dim, block_tables, seq_lens,
                                         max_seq_len, sparse_mla_top_k=0, out=None,
                                         bmm1_scale=1.0, bmm2_scale=1.0, sinks=None,
                                         skip_softmax_threshold_scale_factor=None,
                                         enable_pdl=None, backend="auto", **kwargs):
    out = torch.zeros(query.shape[0], 2) if out is None else out
    inputs = [query, block_tables, seq_lens, out]
    runners = [TrtllmGenMLARunner(), CuteDslMLARunner()]
    if backend != "auto":
        runner, tactic = runners[("trtllm-gen", "cute-dsl").index(backend)], -1
    else:
        runner, tactic = AutoTuner.get().choose_one(
            "trtllm_batch_decode_mla", runners, {"profile_seq_len": max_seq_len}, inputs)
    runner(inputs, tactic=tactic)
    return out
