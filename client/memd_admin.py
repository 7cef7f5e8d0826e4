"""Admin calls to memd: capacity and health (read-only), and flushing its prefix cache; what a Capacity answer says
of its pools (idle, all free), the one definition tests and benchmarks check memd's end state by."""

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from client.messages import proto_to_dict, serving_status_name
from protos import memd_pb2, memd_pb2_grpc


def capacity_reply(address: str, timeout: float = 5.0) -> memd_pb2.CapacityResponse:
    """memd's CapacityResponse; raises grpc.RpcError on failure."""
    with grpc.insecure_channel(address) as channel:
        return memd_pb2_grpc.MemdStub(channel).Capacity(memd_pb2.CapacityRequest(), timeout=timeout)


def memd_capacity(address: str, timeout: float = 5.0) -> dict:
    """memd's CapacityResponse as a dict (pools, sizing, sessions); raises grpc.RpcError on failure."""
    return proto_to_dict(capacity_reply(address, timeout))


def capacity_pools(cap: memd_pb2.CapacityResponse) -> list[memd_pb2.PoolCapacity]:
    """The pools of a Capacity answer: the target's, and the draft's if memd has one."""
    return [cap.target] + ([cap.draft] if cap.has_draft else [])


def is_idle(cap: memd_pb2.CapacityResponse) -> bool:
    """No request holds a slot: per pool, every token free or in the prefix cache with no request protecting it."""
    return cap.running_requests == 0 and all(
        p.free + p.evictable == p.total and p.held_by_requests == 0 and p.protected == 0 for p in capacity_pools(cap)
    )


def all_free(cap: memd_pb2.CapacityResponse) -> bool:
    """Every slot of every pool free (no request, nothing cached)."""
    return all(p.free == p.total for p in capacity_pools(cap))


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
