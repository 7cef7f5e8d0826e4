"""python -m client {capacity,health} [--memd ADDR] [--json]"""

import argparse
import json
import sys

from client.memd_admin import health_status, memd_capacity
from memd.defaults import default_memd_address


def print_capacity(cap: dict) -> None:
    pools = [("target", cap["target"])] + ([("draft", cap["draft"])] if cap["has_draft"] else [])
    print(f"{'pool':<8}{'total':>10}{'free':>10}{'used':>10}{'held':>10}{'evictable':>11}{'protected':>11}{'bytes':>14}")
    for name, p in pools:
        print(f"{name:<8}{p['total']:>10}{p['free']:>10}{p['used']:>10}{p['held_by_requests']:>10}"
              f"{p['evictable']:>11}{p['protected']:>11}{p['bytes']:>14}")
    print(f"ratio={cap['draft_kv_ratio']} window={cap['draft_window']} page_size={cap['page_size']} "
          f"request_cap={cap['request_cap']} running={cap['running_requests']}/{cap['max_running_requests']} "
          f"sessions={cap['sessions']}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m client")
    parser.add_argument("--memd", default=None, help="memd address (default: its owner-only Unix socket)")
    parser.add_argument("--timeout", type=float, default=5.0)
    sub = parser.add_subparsers(dest="command", required=True)
    cap = sub.add_parser("capacity", help="memd's pools: total, free, used, held")
    cap.add_argument("--json", action="store_true")
    sub.add_parser("health", help="grpc.health.v1 status of memd")
    args = parser.parse_args(argv)
    address = args.memd or default_memd_address()
    if args.command == "health":
        status = health_status(address, timeout=args.timeout)
        print(f"memd {address}: {status}")
        return 0 if status == "SERVING" else 1
    result = memd_capacity(address, timeout=args.timeout)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_capacity(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
