"""Read-only queries against memd: capacity and health."""

import grpc
from google.protobuf.json_format import MessageToDict
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protos import memd_pb2, memd_pb2_grpc


def memd_capacity(address: str, timeout: float = 5.0) -> dict:
    with grpc.insecure_channel(address) as channel:
        reply = memd_pb2_grpc.MemdStub(channel).Capacity(memd_pb2.CapacityRequest(), timeout=timeout)
    return MessageToDict(reply, always_print_fields_with_no_presence=True, preserving_proto_field_name=True)


def health_status(address: str, service: str = "", timeout: float = 5.0) -> str:
    """SERVING / NOT_SERVING / ..., or UNAVAILABLE when nothing answers."""
    try:
        with grpc.insecure_channel(address) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
    except grpc.RpcError as exc:
        return exc.code().name
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
