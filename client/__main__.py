"""python -m client [--addr MODELD] [--memd MEMD] {generate,health,capacity,flush-cache,info} ...

  generate PROMPT [--max-new-tokens N] [--temperature T] [--top-p P] [--top-k K] [--seed S]
           [--stop STR ...] [--chat] [--n N] [--stream] [--json]
      the text, then a line with finish reason and counts; --stream prints the text as it arrives;
      --json prints the result as JSON (with --stream: one JSON line per chunk, then the result);
      --n N samples the prompt N times (seed + i for sample i) and prints each sample in order
  health      grpc.health.v1 status of modeld and memd; exit 0 only if all are SERVING
  capacity    pools and queues through modeld
  With --memd and no --addr, health and capacity ask memd alone, directly.
  flush-cache drop memd's prefix cache (asks memd directly, --memd or its default socket); prints the
              tokens freed per pool; fails with FAILED_PRECONDITION while any request runs
  info        modeld's models, geometry and speculation counters as JSON

Errors print "error: CODE: message" on stderr and exit 1.
"""

import argparse
import json
import pathlib
import sys

import grpc

from client import errors
from client.cli_output import (
    meta_line,
    print_capacity,
    print_chunk_text,
    print_flushed,
    print_json,
    print_modeld_capacity,
)
from client.client import Client
from client.connection import default_modeld_address
from client.memd_admin import flush_cache, health_status, memd_capacity
from memd.defaults import default_memd_address


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m client", description="Talk to modeld and memd.")
    parser.add_argument("--addr", default=None, help="modeld address (default: its owner-only Unix socket)")
    parser.add_argument("--memd", default=None, help="memd address (default: its owner-only Unix socket)")
    parser.add_argument("--timeout", type=float, default=60.0, help="deadline of each call, seconds (default 60)")
    parser.add_argument("--connect-timeout", type=float, default=5.0, help="wait for a connection, seconds (default 5)")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate from a text prompt")
    gen.add_argument("prompt")
    gen.add_argument("--max-new-tokens", type=int)
    gen.add_argument("--temperature", type=float)
    gen.add_argument("--top-p", type=float)
    gen.add_argument("--top-k", type=int)
    gen.add_argument("--seed", type=int)
    gen.add_argument("--stop", nargs="+", metavar="STR", help="stop strings")
    gen.add_argument("--chat", action="store_true", help="wrap the prompt with the chat template")
    shape = gen.add_mutually_exclusive_group()
    shape.add_argument("--json-schema", metavar="FILE", help="the output is JSON this schema (a JSON file) accepts")
    shape.add_argument("--regex", help="the output matches this regular expression")
    shape.add_argument("--json-object", action="store_true", help="the output is a JSON object")
    gen.add_argument(
        "--logprobs", type=int, metavar="K", help="each token's log probability and the K likeliest (0-20) with --json"
    )
    gen.add_argument("--n", type=int, default=1, help="samples of the prompt, its prefill computed once (default 1)")
    gen.add_argument("--stream", action="store_true", help="print the text as it is generated (with --n 1)")
    gen.add_argument("--json", action="store_true", help="print the result as JSON")
    sub.add_parser("health", help="grpc.health.v1 status of modeld and memd")
    cap = sub.add_parser("capacity", help="KV pools and request queues")
    cap.add_argument("--json", action="store_true")
    flush = sub.add_parser("flush-cache", help="drop memd's prefix cache (only while no request runs)")
    flush.add_argument("--json", action="store_true")
    sub.add_parser("info", help="modeld's models and counters")
    return parser


def modeld_client(args) -> Client:
    return Client(args.addr or default_modeld_address(), timeout=args.timeout, connect_timeout=args.connect_timeout)


def run_generate(args) -> int:
    params = dict(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
        stop=args.stop,
        chat=args.chat,
        regex=args.regex,
        json_object=args.json_object,
    )
    if args.json_schema is not None:
        params["json_schema"] = pathlib.Path(args.json_schema).read_text()
    if args.logprobs is not None:
        params.update(logprobs=True, top_logprobs=args.logprobs)
    if args.stream and args.n != 1:
        raise errors.BadArgument("--stream prints one sample: give --n 1")
    with modeld_client(args) as client:
        if not args.stream:
            for result in client.generate_choices(args.prompt, n=args.n, **params):
                if args.json:
                    print_json(result)
                else:
                    print(result.text)
                    print(meta_line(result))
            return 0
        with client.stream(args.prompt, **params) as handle:
            for chunk in handle:
                if args.json:
                    print_json(chunk)
                else:
                    print_chunk_text(chunk)
        if args.json:
            print_json(handle.result)
        else:
            print()
            print(meta_line(handle.result))
    return 0


def run_health(args) -> int:
    checks = []
    if args.addr or not args.memd:
        checks.append(("modeld", args.addr or default_modeld_address(), modeld_health))
    checks.append(("memd", args.memd or default_memd_address(), health_status))
    statuses = [status_of(address, timeout=args.timeout) for _, address, status_of in checks]
    for (name, address, _), status in zip(checks, statuses):
        print(f"{name} {address}: {status}")
    return 0 if all(status == "SERVING" for status in statuses) else 1


def modeld_health(address: str, timeout: float) -> str:
    with Client(address, timeout=timeout) as client:
        return client.health()


def run_capacity(args) -> int:
    if args.memd and not args.addr:
        cap = memd_capacity(args.memd, timeout=args.timeout)
        print_json_or(cap, args.json, print_capacity)
        return 0
    with modeld_client(args) as client:
        print_json_or(client.capacity(), args.json, print_modeld_capacity)
    return 0


def run_flush_cache(args) -> int:
    freed = flush_cache(args.memd or default_memd_address(), timeout=args.timeout)
    print_json_or(freed, args.json, print_flushed)
    return 0


def run_info(args) -> int:
    with modeld_client(args) as client:
        print(json.dumps(client.info(), indent=2))
    return 0


def print_json_or(value: dict, as_json: bool, print_table) -> None:
    if as_json:
        print(json.dumps(value, indent=2))
    else:
        print_table(value)


COMMANDS = {
    "generate": run_generate,
    "health": run_health,
    "capacity": run_capacity,
    "flush-cache": run_flush_cache,
    "info": run_info,
}


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except grpc.RpcError as exc:
        error = errors.from_rpc_error(exc)
    except errors.ClientError as exc:
        error = exc
    print(f"error: {error}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
