"""A health probe for containers: one grpc.health.v1 Check of one daemon, exit 0 only if it is SERVING.

    python -m client.probe ADDRESS [--service NAME] [--timeout S]

ADDRESS is memd's or modeld's (`127.0.0.1:PORT`, `unix:///path`). Prints the status (or the error) on one line.
Exit status: 0 SERVING, 1 any other status or no answer, 2 bad arguments. It imports grpc alone (no torch), so a
compose health check every few seconds costs little.
"""

import argparse
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def check(address: str, service: str = "", timeout: float = 3.0) -> str:
    """The status name (SERVING, NOT_SERVING, ...) or the gRPC code's name when there is no answer."""
    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout
            )
        except grpc.RpcError as exc:
            return exc.code().name
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m client.probe", description=__doc__.splitlines()[0])
    parser.add_argument("address", help="memd's or modeld's address: HOST:PORT or unix:///path")
    parser.add_argument("--service", default="", help="service name to check (default: the server as a whole)")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for the answer (default 3)")
    args = parser.parse_args(argv)
    status = check(args.address, args.service, args.timeout)
    print(f"{args.address}: {status}")
    return 0 if status == "SERVING" else 1


if __name__ == "__main__":
    sys.exit(main())
