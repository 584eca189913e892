#!/usr/bin/env python3
"""A Python client of specd's public API: generates stubs from proto/ with grpcio-tools,
streams one generation and prints it as JSON. Used by the tests to show that a client in
another language gets exactly what `specd generate` gets."""

import argparse
import importlib
import json
import os
import sys
import tempfile

from grpc_tools import protoc


def stubs(proto_root: str, out_dir: str):
    args = [
        "grpc_tools.protoc",
        f"-I{proto_root}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        "specd/v1/generation.proto",
    ]
    if protoc.main(args) != 0:
        sys.exit("protoc failed on specd/v1/generation.proto")
    sys.path.insert(0, out_dir)
    return (
        importlib.import_module("specd.v1.generation_pb2"),
        importlib.import_module("specd.v1.generation_pb2_grpc"),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--endpoint", required=True, help="host:port of the coordinator")
    parser.add_argument("--proto-root", default=os.path.join(os.path.dirname(__file__), "..", "proto"))
    parser.add_argument("--token-ids", required=True, help="comma-separated prompt ids")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seed", type=int, required=True)
    args = parser.parse_args()

    import grpc

    with tempfile.TemporaryDirectory() as out_dir:
        pb, pb_grpc = stubs(args.proto_root, out_dir)
        request = pb.GenerateRequest(
            token_ids=pb.TokenIds(ids=[int(t) for t in args.token_ids.split(",")]),
            sampling=pb.SamplingParams(temperature=args.temperature, seed=args.seed),
            stopping=pb.StoppingCriteria(max_new_tokens=args.max_new_tokens),
        )
        with grpc.insecure_channel(args.endpoint) as channel:
            stub = pb_grpc.GenerationStub(channel)
            token_ids, finish = [], 0
            for message in stub.GenerateStream(request):
                token_ids.extend(message.token_ids)
                finish = message.finish_reason or finish
        print(json.dumps({"token_ids": token_ids, "finish_reason": pb.FinishReason.Name(finish)}))


if __name__ == "__main__":
    main()
