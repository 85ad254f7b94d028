"""gpuopt-runtime (PyPI, pure Python) decoding a small random-weight Llama through its own
CUDA-graph pool, as its README uses it: `CUDAGraphPool().generate_greedy(model, inputs,
new_tokens)`.

    python samples/pypi_engine/gpuopt_drive.py

The pool captures one `torch.cuda.CUDAGraph` of a whole greedy decode step per key (batch,
power-of-two cache capacity of prompt + new tokens, generation capacity) over a
transformers `StaticCache` with SDPA attention, and replays it new_tokens - 1 times per
request. No mlatrace pack knows it: `mlatrace run` sees its torch graph captures, kernel
nodes, replay GPU times and syncs. Prompts of 900 and 1000 tokens share the 1024-slot
graph; 3500, 15000, 60000 and 120000 tokens get 4096 to 131072 slots, so replay times
across graphs span well over 4x while each graph's own replays stay flat (attention reads
the whole static cache whatever the prompt length). The model has random weights (no
download): vocab 1024, hidden 1024, 4 layers, 32 heads of 128 (KV heads 32).
"""

from __future__ import annotations

import json
import time

import torch
from gpuopt import CUDAGraphPool
from transformers import LlamaConfig, LlamaForCausalLM

PROMPTS = (900, 1000, 3500, 15000, 60000, 120000)
NEW_TOKENS = 16


def main() -> None:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=1024, hidden_size=1024, intermediate_size=2048,
                         num_hidden_layers=4, num_attention_heads=32, num_key_value_heads=32,
                         head_dim=128, max_position_embeddings=131072)
    config._attn_implementation = "sdpa"
    model = LlamaForCausalLM(config).to("cuda", torch.bfloat16).eval()
    pool = CUDAGraphPool(max_entries=8)
    for prompt in PROMPTS:
        ids = torch.randint(0, config.vocab_size, (1, prompt), device="cuda")
        t0 = time.perf_counter()
        result = pool.generate_greedy(model, {"input_ids": ids}, NEW_TOKENS)
        print(json.dumps({"prompt": prompt, "cache_capacity": result.key.cache_capacity,
                          "backend": result.backend, "cache_hit": result.cache_hit,
                          "validated": result.validated, "fallback": result.fallback_reason,
                          "decode_ms": round(result.decode_ms, 3),
                          "decode_us_per_step": round(result.decode_ms * 1e3 / (NEW_TOKENS - 1), 1),
                          "wall_s": round(time.perf_counter() - t0, 2)}), flush=True)
    print(json.dumps({"pool": pool.stats()}), flush=True)


if __name__ == "__main__":
    main()
