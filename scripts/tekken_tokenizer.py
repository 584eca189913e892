#!/usr/bin/env python3
"""Write a real byte-level BPE vocabulary of Llama 3's size as a Hugging Face tokenizer.json,
for the constraint mask benchmark (`grammar/benches/mask.rs`, SPECD_MASK_VOCAB).

Usage: tekken_tokenizer.py OUT_DIR

No model hub is reachable from the build machines, but PyPI is: the `mistral-common` wheel
ships Mistral's tekken vocabulary (tiktoken-style, 150 000 ranked byte strings). Its first
128 255 tokens, in rank order, plus `<eos>` make a vocabulary of V = 128 256, written with
GPT-2's byte-to-unicode mapping as a ByteLevel BPE (no merges: the mask benchmark reads each
token's bytes, it never encodes text). Not part of `make test`.
"""

import base64
import glob
import json
import os
import subprocess
import sys
import tempfile
import zipfile

VOCAB = 128_256
WHEEL_FILE = "mistral_common/data/tekken_240911.json"


def bytes_to_unicode():
    """GPT-2's reversible map from bytes to printable characters (what ByteLevel uses)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars)}


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "mistral-common", "-d", tmp], check=True
        )
        wheel = glob.glob(os.path.join(tmp, "mistral_common-*.whl"))[0]
        with zipfile.ZipFile(wheel) as z:
            tekken = json.loads(z.read(WHEEL_FILE))
    to_unicode = bytes_to_unicode()
    vocab = {}
    for entry in tekken["vocab"][: VOCAB - 1]:
        text = "".join(to_unicode[b] for b in base64.b64decode(entry["token_bytes"]))
        vocab[text] = entry["rank"]
    assert len(vocab) == VOCAB - 1, len(vocab)
    eos = {"id": VOCAB - 1, "content": "<eos>", "single_word": False, "lstrip": False, "rstrip": False,
           "normalized": False, "special": True}
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [eos],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    }
    path = os.path.join(out, "tokenizer.json")
    with open(path, "w") as f:
        json.dump(tokenizer, f, ensure_ascii=False)
    print(f"{path}: {VOCAB} tokens (mistral-common's tekken vocabulary, first {VOCAB - 1} by rank, and <eos>)")


if __name__ == "__main__":
    main()
