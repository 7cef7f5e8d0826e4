"""What scraping modeld's /metrics costs generation: one modeld (--metrics-port 0) decodes batch-1 greedy requests
while a thread scrapes its endpoint as fast as it answers, against the same requests with no scraper, in alternating
rounds of one run.

    python -m bench.serving.metrics_cost [--device cpu|cuda] [--rounds 4] [--requests 4] [--new-tokens 64]

Prints tokens/s without and with the scraper (median over rounds), their ratio, and the scrapes a second.
"""

import argparse
import re
import statistics
import sys
import threading
import time
import urllib.request

import client
from modeld.model.fetch_default import ensure_default_model
from train.stack import memd_args, run_memd, run_modeld

PROMPT = "Write a long story about a lighthouse keeper and the sea."


def generate_tokens(address: str, requests: int, new_tokens: int) -> tuple[int, float]:
    """(tokens, seconds) of `requests` greedy requests one after another."""
    begin, tokens = time.perf_counter(), 0
    with client.Client(address, timeout=600) as c:
        for _ in range(requests):
            tokens += c.generate(
                PROMPT, chat=True, max_new_tokens=new_tokens, temperature=0, ignore_eos=True
            ).completion_tokens
    return tokens, time.perf_counter() - begin


def scrape_until(url: str, stop: threading.Event, count: list[int]) -> None:
    while not stop.is_set():
        with urllib.request.urlopen(url, timeout=10) as reply:
            reply.read()
        count[0] += 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.serving.metrics_cost", description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--requests", type=int, default=4, help="requests a round, one at a time")
    p.add_argument("--new-tokens", type=int, default=64)
    args = p.parse_args(argv)
    target = ensure_default_model()
    speeds = {"no scraper": [], "scraped flat out": []}
    rates = []
    with (
        run_memd(target, *memd_args(budget=400_000_000, max_running=4, chunk=256), device=args.device) as memd,
        run_modeld(memd, "--target-model", str(target), "--metrics-port", "0", device=args.device) as modeld,
    ):
        url = re.search(r"modeld metrics on (http://\S+/metrics)", modeld.log()).group(1)
        generate_tokens(modeld.address, 1, 8)  # warm-up
        for _ in range(args.rounds):
            for mode in speeds:
                stop, count = threading.Event(), [0]
                scraper = (
                    threading.Thread(target=scrape_until, args=(url, stop, count)) if mode != "no scraper" else None
                )
                if scraper:
                    scraper.start()
                tokens, seconds = generate_tokens(modeld.address, args.requests, args.new_tokens)
                stop.set()
                if scraper:
                    scraper.join()
                    rates.append(count[0] / seconds)
                speeds[mode].append(tokens / seconds)
    plain, scraped = (statistics.median(v) for v in speeds.values())
    print(
        f"| device | no scraper tok/s | scraped flat out tok/s | x | scrapes/s |\n|---|---|---|---|---|\n"
        f"| {args.device} | {plain:.1f} | {scraped:.1f} | {scraped / plain:.2f} | {statistics.median(rates):.0f} |"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
