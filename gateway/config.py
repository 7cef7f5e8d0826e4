"""The gateway's command line and its frozen configuration."""

import argparse
import os
from dataclasses import dataclass, field

from gateway.discovery import parse_name
from memd.addresses import check_address

# 8 MiB: a prompt that fills a 128K-token context is about 0.5 MB of text, and JSON's escapes (\uXXXX: 6 bytes for
# one character) still leave it within 8 MiB; yet the bound sits far below modeld's gRPC receive bound (64 MiB), so an
# oversized body is the gateway's 413 and never modeld's RESOURCE_EXHAUSTED (429).
MAX_BODY_BYTES = 8 << 20
# The API key comes from the environment, not a flag: a flag's value is visible to every local user in `ps`.
API_KEY_VARIABLE = "GATEWAY_API_KEY"


@dataclass(frozen=True)
class GatewayConfig:
    modelds: tuple[str, ...]
    host: str = "127.0.0.1"
    port: int = 8000
    poll_interval: float = 0.5  # seconds between GetInfo polls of every modeld (their load and model)
    request_timeout: float = 600.0  # deadline of one generation, first token to last
    affinity_block_chars: int = 64  # prompts are keyed by their prefixes at multiples of this many characters
    affinity_entries: int = 4096  # prefix keys remembered (least recently used dropped first)
    affinity_max_imbalance: int = 4  # affinity yields when its modeld has this many more requests than the least loaded
    max_body_bytes: int = MAX_BODY_BYTES  # a request body over this is refused (413) before it is read whole
    body_timeout: float = 30.0  # seconds from the end of the headers to the end of the body (408 after)
    max_queued: int = 256  # requests waiting per modeld for one of its places (gateway.admission); 429 beyond
    queue_timeout: float = 30.0  # seconds a request may wait for a place (429 after)
    log_level: str = "INFO"
    api_key: str | None = field(default=None, repr=False)  # required on /v1/ routes when set (gateway.api_key)

    def __post_init__(self):
        checks = [
            (len(self.modelds) >= 1, "give at least one --modeld"),
            (len(set(self.modelds)) == len(self.modelds), "a --modeld address is given twice"),
            (0 <= self.port <= 65535, f"--port must be in 0..65535, got {self.port}"),
            (self.poll_interval > 0, "--poll-interval must be > 0"),
            (self.request_timeout > 0, "--request-timeout must be > 0"),
            (self.affinity_block_chars >= 1, "--affinity-block-chars must be >= 1"),
            (self.affinity_entries >= 0, "--affinity-entries must be >= 0"),
            (self.affinity_max_imbalance >= 0, "--affinity-max-imbalance must be >= 0"),
            (self.max_body_bytes >= 1, f"--max-body-bytes must be >= 1, got {self.max_body_bytes}"),
            (self.body_timeout > 0, f"--body-timeout must be > 0 seconds, got {self.body_timeout}"),
            (self.max_queued >= 0, f"--max-queued must be >= 0, got {self.max_queued}"),
            (self.queue_timeout > 0, f"--queue-timeout must be > 0 seconds, got {self.queue_timeout}"),
            (
                self.api_key is None or (self.api_key.strip() and self.api_key.isprintable()),
                f"the API key ({API_KEY_VARIABLE}) must be printable and not blank",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gateway",
        description="OpenAI-compatible HTTP gateway in front of modelds",
        epilog=f"With {API_KEY_VARIABLE} set in its environment, the gateway requires "
        "'Authorization: Bearer <key>' on its /v1/ routes (401 otherwise).",
    )
    p.add_argument(
        "--modeld",
        action="append",
        required=True,
        metavar="ADDR",
        help="a modeld's address (unix:///path or HOST:PORT), or a DNS name whose every address is one "
        "(dns:///HOST:PORT, resolved again every few seconds: a Kubernetes headless Service); repeat for several",
    )
    p.add_argument("--host", default="127.0.0.1", help="HTTP address to listen on (default: loopback)")
    p.add_argument("--port", type=int, default=8000, help="HTTP port (0: any free port)")
    p.add_argument("--poll-interval", type=float, default=0.5, help="seconds between load polls (GetInfo)")
    p.add_argument("--request-timeout", type=float, default=600.0, help="seconds one generation may take")
    p.add_argument(
        "--affinity-block-chars",
        type=int,
        default=64,
        help="prefix affinity: prompts are keyed by their prefixes at multiples of this many characters",
    )
    p.add_argument("--affinity-entries", type=int, default=4096, help="prefix keys remembered (0: no affinity)")
    p.add_argument(
        "--affinity-max-imbalance",
        type=int,
        default=4,
        help="a shared prefix stays on its modeld unless that one runs this many more requests than the least loaded",
    )
    p.add_argument(
        "--max-body-bytes",
        type=int,
        default=MAX_BODY_BYTES,
        help="largest request body accepted, in bytes (default 8 MiB: room for a 128K-token prompt with "
        "JSON escapes, far below modeld's 64 MiB message bound); a larger one is refused with 413 "
        "before it is read, so a client cannot make the gateway hold more than this per request",
    )
    p.add_argument(
        "--body-timeout",
        type=float,
        default=GatewayConfig.body_timeout,
        help="seconds a request's whole body may take to arrive after its headers (default 30: a local "
        "client sends 8 MiB in well under a second); a slower one is refused with 408, so a client "
        "that trickles its body cannot hold a request open",
    )
    p.add_argument(
        "--max-queued",
        type=int,
        default=GatewayConfig.max_queued,
        help="requests that wait per modeld while its open streams are at its bound (default 256; each "
        "holds its body, so the worst case is this times --max-body-bytes); more are refused with "
        "429 and Retry-After (0: no queue)",
    )
    p.add_argument(
        "--queue-timeout",
        type=float,
        default=GatewayConfig.queue_timeout,
        help="seconds a request may wait in that queue before it is refused with 429 and Retry-After (default 30)",
    )
    p.add_argument("--log-level", default="INFO")
    return p


def config_from_args(argv=None) -> GatewayConfig:
    args = build_parser().parse_args(argv)
    for address in args.modeld:
        if parse_name(address) is None:  # a DNS name is checked by its own rule (ValueError, as the others)
            check_address("--modeld", address, listening=False)
    return GatewayConfig(
        modelds=tuple(args.modeld),
        host=args.host,
        port=args.port,
        poll_interval=args.poll_interval,
        request_timeout=args.request_timeout,
        affinity_block_chars=args.affinity_block_chars,
        affinity_entries=args.affinity_entries,
        affinity_max_imbalance=args.affinity_max_imbalance,
        max_body_bytes=args.max_body_bytes,
        body_timeout=args.body_timeout,
        max_queued=args.max_queued,
        queue_timeout=args.queue_timeout,
        log_level=args.log_level,
        api_key=os.environ.get(API_KEY_VARIABLE),
    )
