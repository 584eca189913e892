#!/usr/bin/env python3
"""Reference side of specd-text's tests: tokenizers made with Python `tokenizers`, and what
transformers renders and decodes, for the Rust tests to compare against.

Usage:
  text_reference.py tokenizers OUT_DIR   write OUT_DIR/{fixture_bpe,byte_level,metaspace}/tokenizer.json
  text_reference.py chat IN.json OUT.json    render chats with transformers' apply_chat_template
  text_reference.py decode IN.json OUT.json  decode id lists with transformers

Nothing is downloaded. OUT_DIR is written through OUT_DIR.tmpPID and renamed, so concurrent
test binaries never see half a directory.
"""

import json
import os
import shutil
import sys

CJK_EMOJI_CORPUS = [
    "speculative decoding 推测解码 는 빠르다 😀 🚀 naïve café ∑ ≤ ≥ €",
    "the draft proposes 草稿提出 and the target verifies 目标验证 🎉 👍🏽",
    "日本語のテキスト with mixed scripts и кириллица ✓ ✗ → ←",
] * 10

LATIN_CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "hello world, speculative decoding proposes tokens and verifies them",
    "a target model scores a whole block in one forward pass",
] * 10


def byte_level(path):
    """A byte-level BPE whose ids split multi-byte characters (CJK, emoji) across tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers, decoders

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CJK_EMOJI_CORPUS, trainer=trainer)
    tok.save(path)


def metaspace(path):
    """Like Llama 2 / Mistral v0.1 as transformers converts them: Metaspace pre-tokenizer
    (prepend_scheme first), byte fallback, and the Replace/ByteFallback/Fuse/Strip decoder."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers, decoders, processors

    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    trainer = trainers.BpeTrainer(
        vocab_size=200, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False, initial_alphabet=[]
    )
    tok.train_from_iterator(LATIN_CORPUS, trainer=trainer)
    spec = json.loads(tok.to_str())
    # Byte tokens <0x00>..<0xFF> are ordinary vocabulary (ids 3..258), as in Llama's.
    vocab = spec["model"]["vocab"]
    shifted = {t: (i if i < 3 else i + 256) for t, i in vocab.items()}
    for b in range(256):
        shifted[f"<0x{b:02X}>"] = 3 + b
    spec["model"]["vocab"] = shifted
    spec["model"]["byte_fallback"] = True
    spec["decoder"] = {
        "type": "Sequence",
        "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0},
        ],
    }
    spec["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}},
    }
    with open(path, "w") as f:
        json.dump(spec, f, ensure_ascii=False)
    Tokenizer.from_file(path)  # fail here, not in Rust, if the spec is wrong


def fixture_bpe(path):
    """The tokenizer of the model fixtures (scripts/make_fixtures.py), without making models."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.path.insert(0, os.path.join(root, "scripts"))
    from make_fixtures import make_tokenizer

    make_tokenizer(path)


def make_tokenizers(out):
    tmp = f"{out}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    for name, make in [("byte_level", byte_level), ("metaspace", metaspace), ("fixture_bpe", fixture_bpe)]:
        os.makedirs(os.path.join(tmp, name))
        make(os.path.join(tmp, name, "tokenizer.json"))
    try:
        os.rename(tmp, out)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)  # another process won the race; same content
        if not os.path.isdir(out):
            raise


def fast_tokenizer(path, **special):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_file=path, clean_up_tokenization_spaces=False, **special)


def chat(job):
    """job: {tokenizer, cases: [{template, messages, tools, add_generation_prompt, bos_token,
    eos_token, variant}]} -> [{text} | {error} per case, plus {ids}
    (apply_chat_template(tokenize=True))]. `tools` (a list of {"type": "function", "function":
    {...}} dicts, or null) is passed as apply_chat_template's `tools`."""
    out = []
    for case in job["cases"]:
        with open(case["template"]) as f:
            source = f.read()
        if case.get("variant") == "no_block_trimming":
            import jinja2.sandbox

            env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=False, lstrip_blocks=False)
            out.append({"text": env.from_string(source).render(
                messages=case["messages"], add_generation_prompt=case["add_generation_prompt"],
                bos_token=case["bos_token"], eos_token=case["eos_token"], tools=case.get("tools"),
                documents=None)})
            continue
        tok = fast_tokenizer(job["tokenizer"], bos_token=case["bos_token"], eos_token=case["eos_token"])
        try:
            text = tok.apply_chat_template(
                case["messages"], tools=case.get("tools"), chat_template=source, tokenize=False,
                add_generation_prompt=case["add_generation_prompt"])
            ids = tok.apply_chat_template(
                case["messages"], tools=case.get("tools"), chat_template=source, tokenize=True,
                add_generation_prompt=case["add_generation_prompt"], return_dict=False)
            out.append({"text": text, "ids": [int(i) for i in ids]})
        except Exception as e:  # the template's raise_exception
            out.append({"error": str(e)})
    return out


def decode(job):
    """job: {tokenizer, sequences: [[ids]]} -> [text] (skip_special_tokens=True)."""
    tok = fast_tokenizer(job["tokenizer"])
    return [tok.decode(ids, skip_special_tokens=True) for ids in job["sequences"]]


def main():
    if sys.argv[1] == "tokenizers":
        make_tokenizers(sys.argv[2])
        return
    with open(sys.argv[2]) as f:
        job = json.load(f)
    result = {"chat": chat, "decode": decode}[sys.argv[1]](job)
    with open(sys.argv[3], "w") as f:
        json.dump(result, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
