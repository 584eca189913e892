#!/usr/bin/env python3
"""Writes a random-weight Hugging Face checkpoint shaped like Qwen3-0.6B, for CPU speed
comparisons against llama.cpp (convert it with `scripts/llama_cpp_bench.sh convert OUT_DIR`).

OUT_DIR gets config.json, generation_config.json and model.safetensors (Qwen3ForCausalLM,
bfloat16, transformers' own init with initializer_range 0.02, fixed seed) plus the demo target's
tokenizer files. The shape defaults to Qwen3-0.6B's: hidden 1024, intermediate 3072, 28 layers,
16 query heads, 8 key/value heads, head_dim 128, vocab 151936, tied embeddings, rope_theta 1e6,
max_position_embeddings 4096, rms_norm_eps 1e-6 (~0.6 B parameters, ~1.2 GB on disk).

The demo tokenizer has only 4096 tokens while the model's vocabulary is 151936: intended. Ids
beyond the tokenizer never come from text; the benches feed token ids. bos/eos are the demo
tokenizer's (from its config.json).

Usage: make_random_qwen3.py OUT_DIR [--tokenizer-dir models/demo/target] [--hidden 1024]
       [--layers 28] [--intermediate 3072] [--heads 16] [--kv-heads 8] [--head-dim 128]
       [--vocab 151936] [--seed 7]
"""
import argparse
import json
import os
import shutil

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir")
    parser.add_argument("--tokenizer-dir", default="models/demo/target",
                        help="where the tokenizer files are copied from (default: %(default)s)")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--intermediate", type=int, default=3072)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()

    bos = eos = None
    tok_config = os.path.join(args.tokenizer_dir, "config.json")
    if os.path.isfile(tok_config):
        with open(tok_config) as f:
            demo = json.load(f)
        bos, eos = demo.get("bos_token_id"), demo.get("eos_token_id")

    config = Qwen3Config(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.head_dim,
        hidden_act="silu",
        max_position_embeddings=4096,
        initializer_range=0.02,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        attention_bias=False,
        use_sliding_window=False,
        bos_token_id=bos,
        eos_token_id=eos,
        dtype=torch.bfloat16,
    )
    torch.manual_seed(args.seed)
    # Built (and initialised) directly in bfloat16: no float32 copy of the ~0.6 B parameters.
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        model = Qwen3ForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    model.eval()
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())

    os.makedirs(args.out_dir, exist_ok=True)
    model.save_pretrained(args.out_dir, safe_serialization=True)
    copied = []
    for name in TOKENIZER_FILES:
        source = os.path.join(args.tokenizer_dir, name)
        if os.path.isfile(source):
            shutil.copy(source, os.path.join(args.out_dir, name))
            copied.append(name)
    params = sum(p.numel() for p in model.parameters())
    print(f"{args.out_dir}: random Qwen3, {params:,} parameters ({params / 1e6:.1f} M, tied embeddings), "
          f"bfloat16; tokenizer files: {', '.join(copied)}")


if __name__ == "__main__":
    main()
