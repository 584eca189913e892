#!/usr/bin/env python3
"""Talk to a specd role knowing nothing but its address, as a gRPC tool does: list its
services with grpcio's own reflection client (grpcio-reflection, which speaks the v1alpha
protocol), build the request and reply classes from the descriptors the server sends, and call
one method of SERVICE. Prints one JSON object. (Every role's reflection describes the whole
specd.v1 package, so the service to call is named on the command line.)

- coordinator (specd.v1.Generation): Generate on prompt token ids, 4 new tokens, greedy;
- target (specd.v1.TargetService) and draft (specd.v1.DraftService): Info.

Used by specd/tests/reflection.rs; also a way to poke a running role by hand:
    python scripts/reflection_client.py 127.0.0.1:50051 specd.v1.Generation
"""

import json
import sys

import grpc
from google.protobuf import descriptor_pool, json_format, message_factory
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

CALLS = {
    "specd.v1.Generation": (
        "Generate",
        {"tokenIds": {"ids": [1, 2]}, "sampling": {"temperature": 0.0}, "stopping": {"maxNewTokens": 4}},
    ),
    "specd.v1.TargetService": ("Info", {}),
    "specd.v1.DraftService": ("Info", {}),
}


def main() -> None:
    if len(sys.argv) != 3 or sys.argv[2] not in CALLS:
        sys.exit(f"usage: reflection_client.py HOST:PORT SERVICE (one of {', '.join(CALLS)})")
    channel = grpc.insecure_channel(sys.argv[1])
    database = ProtoReflectionDescriptorDatabase(channel)
    services = sorted(database.get_services())
    pool = descriptor_pool.DescriptorPool(database)
    service_name = sys.argv[2]
    if service_name not in services:
        sys.exit(f"{service_name} is not among the services reflection lists: {services}")
    method_name, request_json = CALLS[service_name]
    method = pool.FindServiceByName(service_name).FindMethodByName(method_name)
    request_class = message_factory.GetMessageClass(method.input_type)
    reply_class = message_factory.GetMessageClass(method.output_type)
    call = channel.unary_unary(
        f"/{service_name}/{method_name}",
        request_serializer=request_class.SerializeToString,
        response_deserializer=reply_class.FromString,
    )
    reply = call(json_format.ParseDict(request_json, request_class()), timeout=30)
    print(
        json.dumps(
            {
                "services": services,
                "called": f"{service_name}/{method_name}",
                "reply": json_format.MessageToDict(reply, preserving_proto_field_name=True),
            }
        )
    )


if __name__ == "__main__":
    main()
