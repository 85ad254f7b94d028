"""Build a tiny random-weight DeepSeek-V2 (MLA) model and tokenizer, offline.

Usage: python tests/e2e_vllm/make_tiny_model.py OUT_DIR

Run it with the vLLM venv's python (it needs torch, transformers, tokenizers).
Nothing comes from a hub: the weights are random (seeded) and the tokenizer is
a byte-level BPE trained here on text that ships with Python. The shapes are
the smallest that vLLM's CPU MLA backend accepts: kv_lora_rank 512 +
qk_rope_head_dim 64 = head size 576. Idempotent: a finished OUT_DIR (marked by
a stamp file holding the recipe) is reused.
"""

from __future__ import annotations

import json
import sys
import sysconfig
from pathlib import Path

RECIPE = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "moe_intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "q_lora_rank": None,
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 64,
    "v_head_dim": 64,
    "vocab_size": 1024,
    "max_position_embeddings": 2048,
    "first_k_dense_replace": 2,  # = num_hidden_layers: every layer dense, no MoE
    "n_routed_experts": 4,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "n_group": 1,
    "topk_group": 1,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}
STAMP = "mlatrace-tiny-model.json"
SPECIALS = ["<|bos|>", "<|eos|>", "<|pad|>"]


def corpus() -> list[str]:
    """Local training text for the tokenizer: docstrings of stdlib modules (no download)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    lines: list[str] = []
    for name in ["this.py", "textwrap.py", "argparse.py", "json/__init__.py", "typing.py",
                 "dataclasses.py", "pathlib.py", "subprocess.py", "logging/__init__.py"]:
        path = stdlib / name
        if path.exists():
            lines.extend(line.strip() for line in path.read_text(errors="replace").splitlines())
    lines.extend(f"The number {i} comes after {i - 1} and before {i + 1}." for i in range(1, 500))
    return [line for line in lines if line]


def build_tokenizer(out: Path) -> None:
    """Byte-level BPE with 1024 tokens, saved as a PreTrainedTokenizerFast."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=RECIPE["vocab_size"], special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|bos|>",
                                   eos_token="<|eos|>", pad_token="<|pad|>")
    fast.model_max_length = RECIPE["max_position_embeddings"]
    fast.save_pretrained(out)


def build_model(out: Path) -> None:
    """Random DeepseekV2ForCausalLM in bf16 with safetensors weights."""
    import torch
    from transformers import DeepseekV2Config, DeepseekV2ForCausalLM, PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast.from_pretrained(out)
    cfg = {k: v for k, v in RECIPE.items() if k != "torch_dtype"}
    config = DeepseekV2Config(**cfg, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                              pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    model = DeepseekV2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    # vLLM reads the dtype from config.json; make it explicit whatever the
    # transformers version writes.
    cfg_path = out / "config.json"
    data = json.loads(cfg_path.read_text())
    data["torch_dtype"] = "bfloat16"
    cfg_path.write_text(json.dumps(data, indent=2))


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(argv[1])
    stamp = out / STAMP
    if stamp.exists() and json.loads(stamp.read_text()) == RECIPE:
        print(f"make_tiny_model: reusing {out}")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    build_tokenizer(out)
    build_model(out)
    stamp.write_text(json.dumps(RECIPE))
    print(f"make_tiny_model: built {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
