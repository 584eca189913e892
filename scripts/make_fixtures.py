#!/usr/bin/env python3
"""Write tiny random Hugging Face checkpoints and reference logits for the model tests.

Usage: make_fixtures.py OUT_DIR

`llama_bytes` has a byte-level tokenizer that can write any text (for the output-constraint
tests); the others share a letters-only tokenizer of 96 tokens.

Every fixture is made here from random weights with a fixed seed: nothing is downloaded.
Each checkpoint directory holds what a real one does (config.json, model.safetensors or a
sharded model.safetensors.index.json, tokenizer.json, generation_config.json) plus
`reference.json`: fixed token ids and the float32 logits transformers computes for them,
the logits of the model cast to bfloat16 (weights and every activation in bf16, as
transformers runs a bf16 checkpoint), and a tokenizer round trip (text -> ids) for the Rust `tokenizers` crate to reproduce.

Everything goes to a per-process OUT_DIR.tmpPID first and is renamed at the end, so an
interrupted run never leaves a half-made cache behind and concurrent test binaries do not
collide.
"""

import json
import zlib
import os
import shutil
import sys

import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers, trainers, decoders

VOCAB = 96
CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "speculative decoding proposes tokens with a draft model and verifies them",
    "a target model scores a whole block in one forward pass",
    "rollback keeps the key value cache consistent with the accepted prefix",
] * 20
TOKEN_IDS = [1, 17, 5, 42, 9, 88, 3, 64, 12, 77, 30, 2, 50, 61]
TEXT = "the draft proposes and the target verifies"


def make_tokenizer(path):
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=[],
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    tok.save(path)
    return tok


# A tokenizer that can write any text: every byte is a token (the byte-level alphabet), with
# merges learnt from JSON, for the output-constraint tests (a JSON schema needs `{`, `"`,
# digits, which the letters-only tokenizer above lacks).
BYTES_VOCAB = 384
JSON_CORPUS = [
    '{"name": "Ada", "age": 36, "tags": ["math", "code"], "ok": true}',
    '{"city": "Paris", "population": 2102650, "capital": true, "rivers": ["Seine"]}',
    '[{"id": 1, "value": -2.5}, {"id": 2, "value": null}]',
    "the quick brown fox jumps over the lazy dog 0123456789",
] * 20


def make_bytes_tokenizer(path):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=BYTES_VOCAB,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(JSON_CORPUS, trainer=trainer)
    tok.save(path)
    return tok


def write_fixture(root, name, config, eos, shard=False, tok=None, tok_file="tokenizer.json"):
    torch.manual_seed(zlib.crc32(name.encode()))
    d = os.path.join(root, name)
    os.makedirs(d)
    model = transformers.AutoModelForCausalLM.from_config(config)
    model = model.to(torch.float32).eval()
    # Random init is small; widen it so logits differ clearly between positions.
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
        for n, p in model.named_parameters():
            if n.endswith("norm.weight") or "layernorm" in n:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    kwargs = {"max_shard_size": "20KB"} if shard else {}
    model.save_pretrained(d, safe_serialization=True, **kwargs)
    gen = {"bos_token_id": 1, "eos_token_id": eos}
    with open(os.path.join(d, "generation_config.json"), "w") as f:
        json.dump(gen, f)
    shutil.copy(os.path.join(root, tok_file), os.path.join(d, "tokenizer.json"))
    ids = torch.tensor([TOKEN_IDS])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].to(torch.float32)
        bf16_logits = model.to(torch.bfloat16)(input_ids=ids).logits[0].to(torch.float32)
    ref = {
        "tokens": TOKEN_IDS,
        "logits": logits.tolist(),
        "bf16_logits": bf16_logits.tolist(),
        "text": TEXT,
        "text_ids": tok.encode(TEXT).ids,
        "eos": eos if isinstance(eos, list) else [eos],
        "transformers": transformers.__version__,
        "torch": torch.__version__,
    }
    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump(ref, f)


def main():
    out = sys.argv[1]
    tmp = f"{out}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    tok = make_tokenizer(os.path.join(tmp, "tokenizer.json"))
    common = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        max_position_embeddings=64,
        bos_token_id=1,
        eos_token_id=2,
    )
    fixtures = [
        (
            "llama_gqa_untied",
            transformers.LlamaConfig(
                **common,
                num_attention_heads=4,
                num_key_value_heads=2,
                rms_norm_eps=1e-5,
                tie_word_embeddings=False,
                rope_theta=500000.0,
                rope_scaling={
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 16,
                },
            ),
            [2, 3],
            False,
        ),
        (
            "llama_tied",
            transformers.LlamaConfig(
                **common,
                num_attention_heads=4,
                num_key_value_heads=4,
                rms_norm_eps=1e-6,
                tie_word_embeddings=True,
                rope_theta=10000.0,
            ),
            2,
            False,
        ),
        (
            "qwen2",
            transformers.Qwen2Config(
                **common,
                num_attention_heads=4,
                num_key_value_heads=2,
                rms_norm_eps=1e-6,
                tie_word_embeddings=True,
                rope_theta=1000000.0,
            ),
            2,
            False,
        ),
        (
            "mistral_sharded",
            transformers.MistralConfig(
                **common,
                num_attention_heads=4,
                num_key_value_heads=1,
                rms_norm_eps=1e-5,
                tie_word_embeddings=False,
                rope_theta=10000.0,
                sliding_window=None,
            ),
            2,
            True,
        ),
        (
            "mistral_window",
            transformers.MistralConfig(
                **common,
                num_attention_heads=4,
                num_key_value_heads=2,
                rms_norm_eps=1e-5,
                tie_word_embeddings=False,
                rope_theta=10000.0,
                sliding_window=5,
            ),
            2,
            False,
        ),
        (
            "qwen3_tied_yarn",
            transformers.Qwen3Config(
                **common,
                num_attention_heads=4,
                num_key_value_heads=2,
                head_dim=12,
                rms_norm_eps=1e-6,
                tie_word_embeddings=True,
                rope_parameters={
                    "rope_type": "yarn",
                    "rope_theta": 10000.0,
                    "factor": 4.0,
                    "original_max_position_embeddings": 16,
                },
            ),
            2,
            False,
        ),
        (
            "qwen3_untied",
            transformers.Qwen3Config(
                **common,
                num_attention_heads=4,
                num_key_value_heads=4,
                head_dim=8,
                rms_norm_eps=1e-6,
                tie_word_embeddings=False,
                attention_bias=True,
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            ),
            2,
            False,
        ),
        (
            # Windowed layers 0 and 2 around a global layer 1; the window (4) is shorter than
            # the reference tokens, and each kind has its own RoPE.
            "gemma3",
            transformers.Gemma3TextConfig(
                **{**common, "num_hidden_layers": 3},
                num_attention_heads=4,
                num_key_value_heads=2,
                head_dim=16,
                rms_norm_eps=1e-6,
                tie_word_embeddings=True,
                query_pre_attn_scalar=24,
                sliding_window=4,
                layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                final_logit_softcapping=5.0,
                pad_token_id=0,
                rope_parameters={
                    "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000.0},
                    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                },
            ),
            2,
            False,
        ),
        (
            # The Gemma 3 target's draft in the whole-system tests: one windowed layer and
            # one global, transformers' default RoPE bases.
            "gemma3_draft",
            transformers.Gemma3TextConfig(
                **{**common, "num_hidden_layers": 2},
                num_attention_heads=2,
                num_key_value_heads=1,
                head_dim=16,
                query_pre_attn_scalar=16,
                sliding_window=6,
                layer_types=["sliding_attention", "full_attention"],
                pad_token_id=0,
            ),
            2,
            False,
        ),
        (
            # A 4B-27B-style checkpoint: the text model inside Gemma3ForConditionalGeneration,
            # beside a (tiny) vision tower the loader skips.
            "gemma3_multimodal",
            transformers.Gemma3Config(
                text_config=transformers.Gemma3TextConfig(
                    **{**common, "num_hidden_layers": 2},
                    num_attention_heads=4,
                    num_key_value_heads=2,
                    head_dim=16,
                    query_pre_attn_scalar=16,
                    sliding_window=4,
                    layer_types=["sliding_attention", "full_attention"],
                    pad_token_id=0,
                    rope_parameters={
                        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
                        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                    },
                ),
                vision_config={
                    "model_type": "siglip_vision_model",
                    "hidden_size": 16,
                    "intermediate_size": 32,
                    "num_hidden_layers": 1,
                    "num_attention_heads": 2,
                    "image_size": 28,
                    "patch_size": 14,
                },
                mm_tokens_per_image=4,
                eos_token_id=2,
                bos_token_id=1,
            ),
            2,
            False,
        ),
    ]
    for name, cfg, eos, shard in fixtures:
        write_fixture(tmp, name, cfg, eos, shard=shard, tok=tok)
    bytes_tok = make_bytes_tokenizer(os.path.join(tmp, "tokenizer_bytes.json"))
    bytes_config = transformers.LlamaConfig(
        **dict(common, vocab_size=BYTES_VOCAB, bos_token_id=0, eos_token_id=1, max_position_embeddings=256),
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    )
    write_fixture(tmp, "llama_bytes", bytes_config, 1, tok=bytes_tok, tok_file="tokenizer_bytes.json")
    # Its draft: another random model on the same tokenizer, one layer.
    bytes_draft = transformers.LlamaConfig(**dict(bytes_config.to_dict(), num_hidden_layers=1))
    write_fixture(tmp, "llama_bytes_draft", bytes_draft, 1, tok=bytes_tok, tok_file="tokenizer_bytes.json")
    # Defaults transformers gives configs that leave a key out, for the loader to match.
    defaults = {"mistral_sliding_window": transformers.MistralConfig().sliding_window}
    with open(os.path.join(tmp, "defaults.json"), "w") as f:
        json.dump(defaults, f)
    with open(os.path.join(tmp, "VERSION"), "w") as f:
        f.write(f"transformers {transformers.__version__} torch {torch.__version__}\n")
    try:
        os.rename(tmp, out)
    except OSError:
        # Another test binary finished first: its cache is as good as ours.
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
