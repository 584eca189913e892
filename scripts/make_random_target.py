#!/usr/bin/env python3
"""Writes a larger random-weight Llama target next to the demo pair's draft, for the load
benchmark of BENCHMARKS.md (issue #10): `specd bench --embedded --demo-dir OUT --concurrency 8`.

OUT/target gets a Hugging Face checkpoint with random weights (transformers' own init, fixed
seed) and the demo target's tokenizer and generation config, so text prompts work; OUT/draft
is a link to the demo draft. The draft knows nothing of this target, so α is low and the
adaptive policy decides whether drafting pays at all.

Usage: make_random_target.py DEMO_DIR OUT_DIR [--hidden 1024] [--layers 12]
       [--intermediate 2816] [--heads 16] [--seed 7]
"""
import argparse
import json
import os
import shutil

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("demo_dir")
    parser.add_argument("out_dir")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--intermediate", type=int, default=2816)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()

    demo_target = os.path.join(args.demo_dir, "target")
    with open(os.path.join(demo_target, "config.json")) as f:
        demo = json.load(f)
    config = LlamaConfig(
        vocab_size=demo["vocab_size"],
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.heads,
        max_position_embeddings=demo["max_position_embeddings"],
        bos_token_id=demo.get("bos_token_id"),
        eos_token_id=demo.get("eos_token_id"),
        tie_word_embeddings=False,
    )
    torch.manual_seed(args.seed)
    model = LlamaForCausalLM(config)
    target = os.path.join(args.out_dir, "target")
    os.makedirs(target, exist_ok=True)
    model.save_pretrained(target, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        source = os.path.join(demo_target, name)
        if os.path.isfile(source):
            shutil.copy(source, os.path.join(target, name))
    draft = os.path.join(args.out_dir, "draft")
    if not os.path.lexists(draft):
        os.symlink(os.path.abspath(os.path.join(args.demo_dir, "draft")), draft)
    params = sum(p.numel() for p in model.parameters())
    print(f"{target}: random Llama, {params / 1e6:.1f} M parameters; draft -> {os.readlink(draft)}")


if __name__ == "__main__":
    main()
