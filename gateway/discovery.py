"""modelds found by a DNS name (`--modeld dns:///NAME:PORT`): a Kubernetes headless Service's name resolves to the
address of every ready pod behind it, so replicas that come and go are followed by resolving it again now and then.
The gateway adds a backend for each new address and drains one whose address is gone: it takes no new request, its
open ones finish (or fail on their own), and then it is closed and dropped."""

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable

SCHEME = "dns:///"
# Seconds between resolutions of a name: Kubernetes' DNS answers a headless Service from its endpoints (ready pods),
# with a TTL of 5-30 s; a new replica is routed to within one interval of its name listing it.
RESOLVE_INTERVAL = 5.0

Resolver = Callable[[str, int], Awaitable[list[str]]]


def parse_name(address: str) -> tuple[str, int] | None:
    """(host, port) of a `dns:///HOST:PORT` address; None for any other address. ValueError if it is malformed."""
    if not address.startswith(SCHEME):
        return None
    host, colon, port = address[len(SCHEME) :].rpartition(":")
    if not colon or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise ValueError(f"--modeld {address!r}: a DNS name is dns:///HOST:PORT with a port in 1..65535")
    return host.strip("[]"), int(port)


async def resolve(host: str, port: int) -> list[str]:
    """The gRPC addresses `host` resolves to now (HOST:PORT, an IPv6 one in brackets), sorted; none if it resolves
    to nothing (a Service with no ready pod)."""
    loop = asyncio.get_running_loop()
    try:
        found = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return []
    return sorted({grpc_address(info[4][0], port) for info in found})


def grpc_address(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ipaddress.ip_address(ip).version == 6 else f"{ip}:{port}"
