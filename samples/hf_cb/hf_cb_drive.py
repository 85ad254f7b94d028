"""HF transformers continuous batching (`model.generate_batch`) with CUDA graphs, on a small
random-weight Llama, as its users call it.

    python samples/hf_cb/hf_cb_drive.py [--requests 24] [--new-tokens 32]

transformers captures one `torch.cuda.CUDAGraph` per padded batch shape (the decode fast
path keys on the padded query-token count, the varlen path on query tokens and KV read)
and replays it for every later step of that shape. No mlatrace pack knows it: `mlatrace
run` sees its torch graph captures and replays, and graph use lists them. The script
prints one JSON line: the transformers version, the graphs transformers itself says it
set (its `Setting graph for key = ...` log lines) and the tokens generated, for comparing
with the trace. The model has random weights (no download): vocab 1024, hidden 512,
4 layers, 8 heads of 64.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import time

import torch
import transformers
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

GRAPH_SET = re.compile(r"Setting graph for key = (.*)")


class GraphLog(logging.Handler):
    """transformers' own record of the graphs it captures (continuous batching logs each)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.keys: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        match = GRAPH_SET.search(record.getMessage())
        if match:
            self.keys.append(match.group(1))


def continuous_batching_config(max_batch: int) -> object | None:
    """transformers >= 5: the continuous batching options have their own config."""
    try:
        from transformers import ContinuousBatchingConfig
    except ImportError:
        try:
            from transformers.generation.configuration_utils import ContinuousBatchingConfig
        except ImportError:
            return None
    return ContinuousBatchingConfig(use_cuda_graph=True, max_requests_per_batch=max_batch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    graphs = GraphLog()
    for name in ("ContinuousBatchingLogger", "transformers.generation.continuous_batching"):
        cb_logger = logging.getLogger(name)   # the first in transformers 5, the second in 4.5x
        cb_logger.setLevel(logging.INFO)
        cb_logger.addHandler(graphs)

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=1024, hidden_size=512, intermediate_size=1024,
                         num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=8,
                         head_dim=64, max_position_embeddings=4096)
    model = LlamaForCausalLM(config).to(args.device, torch.bfloat16).eval()
    gen = torch.Generator().manual_seed(1)
    lengths = torch.randint(16, 200, (args.requests,), generator=gen).tolist()
    prompts = [torch.randint(3, config.vocab_size, (n,), generator=gen).tolist() for n in lengths]
    cb = continuous_batching_config(args.max_batch)
    t0 = time.perf_counter()
    if cb is not None:
        generation = GenerationConfig(max_new_tokens=args.new_tokens, do_sample=False,
                                      eos_token_id=None, pad_token_id=0)
        outputs = model.generate_batch(inputs=prompts, generation_config=generation,
                                       continuous_batching_config=cb)
    else:   # transformers 4.5x: the options sit on the generation config
        generation = GenerationConfig(max_new_tokens=args.new_tokens, do_sample=False,
                                      eos_token_id=None, pad_token_id=0, use_cuda_graph=True,
                                      max_batch_tokens=512, num_blocks=2048, block_size=128)
        outputs = model.generate_batch(inputs=prompts, generation_config=generation)
    wall_s = time.perf_counter() - t0
    generated = sum(len(getattr(o, "generated_tokens", []) or []) for o in outputs.values())
    print(json.dumps({"transformers": transformers.__version__, "torch": torch.__version__,
                      "requests": len(outputs), "prompt_lengths": [min(lengths), max(lengths)],
                      "generated_tokens": generated, "graphs_set": len(graphs.keys),
                      "graph_keys": graphs.keys, "wall_s": round(wall_s, 2)}), flush=True)


if __name__ == "__main__":
    main()
