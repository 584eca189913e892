#!/usr/bin/env python3
"""Does a model carry text over from its prompt? The question prompt-lookup drafting
(`--proposer ngram`) rests on.

For functions of the Python standard library, feeds `BLOCK`, a line "# The same function,
unchanged:", then `BLOCK` again, and reports the model's mean loss (nats/token) on the first
copy and on the second, and how often its argmax is the next token of the second copy. A
model that copies predicts the second copy almost perfectly (loss well under 1 nat, argmax
right nearly always); one that does not scores both copies alike, and greedy prompt lookup
then gains only from the output repeating itself (BENCHMARKS.md, issue #27).

usage: copy_probe.py MODEL_DIR [MODEL_DIR ...] [--blocks N] [--card CARD_JSON]

With --card, the (one) model's figures are also written into a shipped pair's card.json
under "copy_probe" (`specd models demo --ship-to` leaves it null).
"""

import argparse
import ast
import glob
import json
import sysconfig

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

HEADER = "\n\n\n# The same function, unchanged:\n\n"


def blocks(count):
    """Top-level functions of 3 to 24 lines from the standard library, in path order."""
    found = []
    for path in sorted(glob.glob(sysconfig.get_paths()["stdlib"] + "/*.py")):
        with open(path, encoding="utf-8", errors="ignore") as f:
            source = f.read()
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        lines = source.splitlines()
        for node in tree.body:
            if isinstance(node, ast.FunctionDef):
                text = "\n".join(lines[node.lineno - 1 : node.end_lineno])
                if 3 <= text.count("\n") <= 24 and len(text) <= 640:
                    found.append(text)
                    break  # one per module: a spread of styles
        if len(found) == count:
            break
    return found


def probe(model_dir, texts):
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    first = second = hits = n_first = n_second = 0
    with torch.no_grad():
        for text in texts:
            # Encoded piece by piece so that the second copy is token for token the first.
            alone = tokenizer(text, add_special_tokens=False)["input_ids"]
            head = alone + tokenizer(HEADER, add_special_tokens=False)["input_ids"]
            ids = head + alone
            logits = model(torch.tensor([ids])).logits[0, :-1]
            targets = torch.tensor(ids[1:])
            loss = torch.nn.functional.cross_entropy(logits, targets, reduction="none")
            # The same tokens of each copy: all but its first, which nothing before predicts
            # in the first copy.
            body = slice(0, len(alone) - 1)
            copy = slice(len(head), None)
            first += loss[body].sum().item()
            n_first += loss[body].numel()
            second += loss[copy].sum().item()
            n_second += loss[copy].numel()
            hits += (logits[copy].argmax(-1) == targets[copy]).sum().item()
    return {
        "model": model_dir,
        "first_copy_nats": round(first / max(n_first, 1), 3),
        "second_copy_nats": round(second / max(n_second, 1), 3),
        "second_copy_argmax_hits": round(hits / max(n_second, 1), 3),
        "second_copy_tokens": n_second,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+", help="Hugging Face checkpoint directories")
    parser.add_argument("--blocks", type=int, default=40, help="functions to copy (default 40)")
    parser.add_argument("--card", help="a shipped pair's card.json to record the figures in")
    args = parser.parse_args()
    if args.card and len(args.models) != 1:
        parser.error("--card records one model's figures: give one MODEL_DIR")
    texts = blocks(args.blocks)
    for model_dir in args.models:
        figures = probe(model_dir, texts)
        print(json.dumps(figures))
        if args.card:
            with open(args.card, encoding="utf-8") as f:
                card = json.load(f)
            figures["blocks"] = len(texts)
            figures["model"] = "target"
            card["copy_probe"] = figures
            with open(args.card, "w", encoding="utf-8") as f:
                f.write(json.dumps(card, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
