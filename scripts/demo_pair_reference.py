#!/usr/bin/env python3
"""Load one model of specd's demo pair with transformers and print what it computes.

Usage: demo_pair_reference.py MODEL_DIR TEXT

Prints JSON: {"architecture", "ids" (the tokenizer's encoding of TEXT through
AutoTokenizer), "decoded" (those ids decoded again), "logits" (float32, one row per
position)}. specd's tests compare these with its own tokenizer and forward pass.
"""

import json
import sys

import torch
import transformers


def main():
    model_dir, text = sys.argv[1], sys.argv[2]
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]
    print(json.dumps({
        "architecture": type(model).__name__,
        "ids": ids,
        "decoded": tokenizer.decode(ids),
        "logits": logits.tolist(),
    }))


if __name__ == "__main__":
    main()
