"""The gateway's command line and its frozen configuration."""

import argparse
from dataclasses import dataclass

from memd.addresses import check_address


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
    log_level: str = "INFO"

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
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gateway", description="OpenAI-compatible HTTP gateway in front of modelds")
    p.add_argument("--modeld", action="append", required=True, metavar="ADDR",
                   help="a modeld's address (unix:///path or HOST:PORT); repeat for several")
    p.add_argument("--host", default="127.0.0.1", help="HTTP address to listen on (default: loopback)")
    p.add_argument("--port", type=int, default=8000, help="HTTP port (0: any free port)")
    p.add_argument("--poll-interval", type=float, default=0.5, help="seconds between load polls (GetInfo)")
    p.add_argument("--request-timeout", type=float, default=600.0, help="seconds one generation may take")
    p.add_argument("--affinity-block-chars", type=int, default=64,
                   help="prefix affinity: prompts are keyed by their prefixes at multiples of this many characters")
    p.add_argument("--affinity-entries", type=int, default=4096, help="prefix keys remembered (0: no affinity)")
    p.add_argument("--affinity-max-imbalance", type=int, default=4,
                   help="a shared prefix stays on its modeld unless that one runs this many more requests than the "
                        "least loaded")
    p.add_argument("--log-level", default="INFO")
    return p


def config_from_args(argv=None) -> GatewayConfig:
    args = build_parser().parse_args(argv)
    for address in args.modeld:
        check_address("--modeld", address, listening=False)
    return GatewayConfig(
        modelds=tuple(args.modeld), host=args.host, port=args.port, poll_interval=args.poll_interval,
        request_timeout=args.request_timeout, affinity_block_chars=args.affinity_block_chars,
        affinity_entries=args.affinity_entries, affinity_max_imbalance=args.affinity_max_imbalance,
        log_level=args.log_level,
    )
