#!/usr/bin/env python3
"""Writes the two V = 32 000 table models of BENCHMARKS.md's coordinator-overhead runs.

Each is one row used at every position: logit(rank r) = -1.2 ln r + U(0, noise), noise 0.5
for the target and 1.5 for the draft, softmaxed. Usage: make_overhead_models.py OUT_DIR [VOCAB]
(VOCAB: another vocabulary size, e.g. 128256 for the sampling-threads runs).
"""
import json
import math
import random
import sys

VOCAB = 32_000


def row(noise: float, seed: int, vocab: int) -> list:
    rng = random.Random(seed)
    logits = [-1.2 * math.log(r) + rng.uniform(0.0, noise) for r in range(1, vocab + 1)]
    top = max(logits)
    weights = [math.exp(x - top) for x in logits]
    total = sum(weights)
    return [w / total for w in weights]


def main() -> None:
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    out = sys.argv[1]
    vocab = int(sys.argv[2]) if len(sys.argv) == 3 else VOCAB
    if vocab < 2:
        sys.exit(f"VOCAB {vocab} must be at least 2")
    for name, noise, seed in (("target", 0.5, 1), ("draft", 1.5, 2)):
        with open(f"{out}/{name}.json", "w") as f:
            json.dump({"vocab_size": vocab, "default": row(noise, seed, vocab)}, f)


if __name__ == "__main__":
    main()
