"""Where modeld listens by default, how the clients open channels, and how they wait for one."""

import grpc
from grpc_health.v1 import health_pb2

from memd.defaults import default_modeld_address  # noqa: F401  (re-exported for the client's users)

# Prompts and outputs travel as token ids: lift gRPC's 4 MiB receive limit.
# gRPC's reconnect back-off grows to 120 s by default: a client that outlived a modeld restart would then wait
# long after modeld serves again. Capped at 1 s, a restarted modeld is found within a second.
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", -1),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]

# Sent with wait_for_ready to wait, up to the connect timeout, until the server is reachable.
CONNECTION_PROBE = health_pb2.HealthCheckRequest()


def probe_reached_server(exc: grpc.RpcError) -> bool:
    """Whether a failed connection probe still got an answer from the server (e.g. UNIMPLEMENTED)."""
    return exc.code() not in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE)


def no_connection_message(address: str, waited: float) -> str:
    """The UNAVAILABLE message when the server could not be reached in time."""
    return f"could not connect to {address} within {waited:.1f} s"
