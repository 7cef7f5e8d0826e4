"""Admin calls to memd: capacity and health (read-only), and flushing its prefix cache."""

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from client.messages import proto_to_dict, serving_status_name
from protos import memd_pb2, memd_pb2_grpc


def memd_capacity(address: str, timeout: float = 5.0) -> dict:
    """memd's CapacityResponse as a dict (pools, sizing, sessions); raises grpc.RpcError on failure."""
    with grpc.insecure_channel(address) as channel:
        reply = memd_pb2_grpc.MemdStub(channel).Capacity(memd_pb2.CapacityRequest(), timeout=timeout)
    return proto_to_dict(reply)


def flush_cache(address: str, timeout: float = 5.0) -> dict:
    """Drop memd's whole prefix cache: {"target_freed", "draft_freed"} in tokens. Raises grpc.RpcError,
    FAILED_PRECONDITION while any request is running (the cache is only flushed when memd is idle)."""
    with grpc.insecure_channel(address) as channel:
        reply = memd_pb2_grpc.MemdStub(channel).FlushCache(memd_pb2.FlushCacheRequest(), timeout=timeout)
    return proto_to_dict(reply)


def health_status(address: str, service: str = "", timeout: float = 5.0) -> str:
    """SERVING / NOT_SERVING / ..., or UNAVAILABLE when nothing answers."""
    try:
        with grpc.insecure_channel(address) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout
            )
    except grpc.RpcError as exc:
        return exc.code().name
    return serving_status_name(reply)
