#!/usr/bin/env python3
"""Write the fuzz targets' seed corpora under fuzz/seeds/ (committed; rerun after a change to
the messages, then commit what changed).

Usage: fuzz_seeds.py   (from the repository root; needs grpcio-tools, which `make test` installs)

The seeds are realistic inputs, so that each run starts from the code's main paths rather than
finding JSON or protobuf framing by chance: request bodies as OpenAI clients send them, gRPC
requests as specd's clients send them, and round messages shaped as the nodes send them, for
the small model the targets validate against (a vocabulary of 50, a context of 64).
"""

import json
import os
import random
import sys
import tempfile

from grpc_tools import protoc

VOCAB = 50
ROOT = "fuzz/seeds"


def compile_messages():
    out = tempfile.mkdtemp(prefix="specd-fuzz-pb2-")
    protos = ["specd/v1/generation.proto", "specd/v1/nodes.proto"]
    if protoc.main(["protoc", "-Iproto", f"--python_out={out}", *[f"proto/{p}" for p in protos]]) != 0:
        sys.exit("protoc failed")
    sys.path.insert(0, out)
    from specd.v1 import generation_pb2, nodes_pb2

    return generation_pb2, nodes_pb2


def write(target, name, data):
    os.makedirs(os.path.join(ROOT, target), exist_ok=True)
    with open(os.path.join(ROOT, target, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def varint(n):
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def http_bodies():
    bodies = {
        "completion": {"model": "m", "prompt": "Hello", "max_tokens": 16, "temperature": 0.7},
        "completion_token_ids": {"model": "m", "prompt": [1, 2, 3], "max_tokens": 4, "seed": 7, "speculation": {"gamma": 4}},
        "completion_stream": {
            "model": "m", "prompt": ["a", "b"], "stream": True, "stream_options": {"include_usage": True},
            "stop": ["\n", "END"], "top_p": 0.9, "top_k": 40,
        },
        "completion_stream_usage": {
            "model": "m", "prompt": "a", "stream": True, "stream_options": {"include_usage": True},
            "stop": ["\n", "END"], "logprobs": 2,
        },
        "completion_odd_types": {
            "model": "m", "prompt": [[1, 2], [3]], "max_tokens": 1e3, "temperature": "hot", "seed": -1,
            "min_p": 0.05, "repetition_penalty": 1.1, "ignore_eos": True, "stop": "x",
        },
        "completion_unsupported": {"model": "m", "prompt": "x", "best_of": 3, "suffix": "y", "echo": True},
        "chat": {
            "model": "m",
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
            "max_completion_tokens": 32, "presence_penalty": 0.5, "frequency_penalty": -0.5,
        },
        "chat_max_tokens_disagree": {
            "model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5, "max_completion_tokens": 6,
        },
        "chat_top_logprobs": {
            "model": "m", "messages": [{"role": "user", "content": "Hi"}], "logprobs": True, "top_logprobs": 50,
        },
        "chat_neutral_fields": {
            "model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
            "logit_bias": None, "echo": False, "tools": [], "tool_choice": "none", "response_format": {"type": "text"},
            "user": "u1", "n": 1, "logprobs": False, "parallel_tool_calls": True,
        },
        "chat_stream_image": {
            "model": "m", "stream": True, "top_logprobs": 0,
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}, {"role": "assistant"}],
        },
    }
    for name, body in bodies.items():
        write("http_body", name + ".json", json.dumps(body))


def grpc_requests(g):
    sampling = g.SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.01, repetition_penalty=1.1,
                                presence_penalty=0.2, frequency_penalty=0.1, seed=42)
    requests = {
        "token_ids": g.GenerateRequest(request_id="r1", token_ids=g.TokenIds(ids=[1, 2, 3, 4]), sampling=sampling,
                                       stopping=g.StoppingCriteria(max_new_tokens=16, stop_token_ids=[0, 9]),
                                       speculation=g.Speculation(gamma=4)),
        "text_stop_strings": g.GenerateRequest(text="Once upon a time", stopping=g.StoppingCriteria(
            max_new_tokens=8, stop_strings=["\n", "The end"], ignore_eos=True), speculation=g.Speculation(dense=True)),
        "greedy_defaults": g.GenerateRequest(token_ids=g.TokenIds(ids=[5]), sampling=g.SamplingParams(temperature=0.0)),
        "edges": g.GenerateRequest(token_ids=g.TokenIds(ids=list(range(60))), sampling=g.SamplingParams(
            temperature=float("nan"), top_p=0.0, top_k=-1), stopping=g.StoppingCriteria(max_new_tokens=0),
            speculation=g.Speculation(gamma=1 << 20)),
    }
    for name, request in requests.items():
        write("grpc_request", name + ".pb", request.SerializeToString())
    laws = {
        "law": g.NextTokenLawRequest(prompt_token_ids=[1, 2, 3], generated_token_ids=[4, 5], sampling=sampling),
        "law_out_of_vocab": g.NextTokenLawRequest(prompt_token_ids=[1, VOCAB], sampling=g.SamplingParams(top_p=2.0)),
    }
    for name, request in laws.items():
        write("grpc_request", name + ".pb", request.SerializeToString())


def node_messages(n):
    rng = random.Random(25)

    def sparse_position(support):
        weights = [rng.random() + 0.01 for _ in support]
        total = sum(weights)
        return n.ProposedPosition(token_id=support[0], support=support, q=[w / total for w in weights])

    def dense_q():
        weights = [rng.random() for _ in range(VOCAB)]
        total = sum(weights)
        return [w / total for w in weights]

    def scored(support):
        p = [rng.random() / (2 * len(support)) for _ in support]
        sample = next(t for t in range(VOCAB) if t not in support)
        return n.ScoredPosition(p_on_support=p, complement_mass=1.0 - sum(p), complement_sample=sample)

    supports = [[3, 7, 11], [0, 1], [42]]
    proposed = n.ProposeResponse(positions=[sparse_position(s) for s in supports], draft_ns=1000, forward_passes=3,
                                 batched_sequences=3)
    reply = n.VerifyResponse(positions=[scored(s) for s in supports], bonus_token_id=5, verify_ns=99, batch_size=1)
    pair = lambda a, b: b"\x00" + varint(len(a)) + a + b
    write("node_messages", "round_sparse.bin", pair(proposed.SerializeToString(), reply.SerializeToString()))
    # Rejections whose residual is drawn inside the support (p > q there), then from the
    # complement: exact binary fractions, so p on the support plus the complement mass is 1.
    # A fuzzer rarely finds these itself: changing one p breaks that sum.
    rejecting = n.ProposeResponse(positions=[
        n.ProposedPosition(token_id=3, support=[3, 7, 11], q=[0.625, 0.25, 0.125]),
        n.ProposedPosition(token_id=0, support=[0, 1], q=[0.75, 0.25]),
    ])
    rejected = n.VerifyResponse(positions=[
        n.ScoredPosition(p_on_support=[0.125, 0.5, 0.25], complement_mass=0.125, complement_sample=20),
        n.ScoredPosition(p_on_support=[0.0625, 0.0625], complement_mass=0.875, complement_sample=30),
    ], bonus_token_id=9)
    for seed in range(4):
        rejected.verify_ns = seed
        name = f"round_sparse_rejected_{seed}.bin"
        write("node_messages", name, pair(rejecting.SerializeToString(), rejected.SerializeToString()))
    dense = n.ProposeResponse(positions=[n.ProposedPosition(token_id=t, dense_q=dense_q()) for t in (4, 8)])
    rows = n.VerifyResponse(dense_p=[n.DenseRow(probs=dense_q()) for _ in range(3)], verify_ns=7)
    write("node_messages", "round_dense.bin", pair(dense.SerializeToString(), rows.SerializeToString()))
    proposals = {
        "propose_sparse": n.ProposeRequest(session_id="s", round=3, rollback_to=4, pending_token_ids=[9], gamma=4,
                                           truncation=n.Truncation(epsilon=1e-4, max_entries=8), optimistic=True,
                                           push_depth=2, trace_context={"traceparent": "00-x"}),
        "propose_dense": n.ProposeRequest(session_id="s", round=1 << 31, gamma=2, dense=True),
    }
    for name, request in proposals.items():
        write("node_messages", name + ".bin", b"\x01" + request.SerializeToString())
    verifies = {
        "verify_sparse": n.VerifyRequest(session_id="s", round=2, rollback_to=3, pending_token_ids=[4, 5],
                                         candidate_token_ids=[3, 0, 42],
                                         supports=[n.Support(token_ids=s) for s in supports]),
        "verify_dense": n.VerifyRequest(session_id="s", round=2, pending_token_ids=[6], candidate_token_ids=[8, 9],
                                        dense=True),
    }
    for name, request in verifies.items():
        write("node_messages", name + ".bin", b"\x02" + request.SerializeToString())


def main():
    generation_pb2, nodes_pb2 = compile_messages()
    http_bodies()
    grpc_requests(generation_pb2)
    node_messages(nodes_pb2)


if __name__ == "__main__":
    main()
