"""Tokens/s through modeld's gRPC streams at high concurrency, side by side with the same engine in this process (no
gRPC): what the serving front (Generate handlers, detokenization, one message per chunk) costs on top of the engine.

    python -m bench.serving.grpc_streams [--concurrency 64,256] [--new-tokens 64] [--prompt-tokens 32] [--rounds 3]
        [--device cpu] [--target bench/configs/tiny-host] [--stream-intervals 1,4]

A model so small that the forward is cheap (bench/configs/tiny-host, dummy weights; on the GPU --target
bench/configs/smollm2-135m gives the default model's shape) with the default model's tokenizer, so handlers make text
as they do for real; memd and modeld child processes, modeld as served (decode
lookahead 32). Every request answers --new-tokens greedy tokens (ignore_eos) to random prompt ids, all sent at once
from an asyncio client (client.aio) in this process. Rounds alternate between the daemons and the in-process engine
(whose streams this process's main thread reads, as bench.engine.host_overhead does). Prints per concurrency the median
over rounds of both tokens/s, their ratio, and modeld's CPU seconds per 1,000 tokens (all its processes and threads);
with several --stream-intervals, a modeld for each runs in every round (the in-process engine reads every token).
"""

import argparse
import asyncio
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
import time

from bench.common.in_process import running_engine
from bench.common.requests import generate_all
from bench.common.tiny_host import TINY, many_requests_memd_flags, random_prompts
from client.aio import AsyncClient
from modeld.config import ModeldConfig
from modeld.model.fetch_default import ensure_default_model
from train.stack import run_memd, run_modeld

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def model_with_tokenizer(config: pathlib.Path, folder: pathlib.Path) -> pathlib.Path:
    """A model's config.json beside the default model's tokenizer (the small vocabulary's ids are real tokens)."""
    source = pathlib.Path(ensure_default_model())
    shutil.copy(config / "config.json", folder / "config.json")
    for name in TOKENIZER_FILES:
        if (source / name).exists():
            shutil.copy(source / name, folder / name)
    return folder


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and its live children (modeld's engine process), all their threads."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    children = pathlib.Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK") + sum(cpu_seconds(int(c)) for c in children)


async def stream_all(address: str, prompts: list[list[int]], new_tokens: int) -> int:
    """Every prompt streamed at once through modeld; the tokens generated."""
    async with AsyncClient(address, timeout=600) as c:
        await c.health()

        async def one(ids):
            count = 0
            async with c.stream(input_ids=ids, max_new_tokens=new_tokens, temperature=0, ignore_eos=True) as handle:
                async for chunk in handle:
                    count += len(chunk.token_ids)
            assert count == new_tokens == len(handle.result.output_ids), (count, handle.result.output_ids)
            return count

        return sum(await asyncio.gather(*(one(ids) for ids in prompts)))


def through_grpc(address: str, pid: int, prompts, new_tokens: int) -> tuple[float, float]:
    """(tokens/s, modeld CPU seconds per 1,000 tokens)."""
    cpu, begin = cpu_seconds(pid), time.perf_counter()
    tokens = asyncio.run(stream_all(address, prompts, new_tokens))
    seconds = time.perf_counter() - begin
    return tokens / seconds, 1e3 * (cpu_seconds(pid) - cpu) / tokens


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.serving.grpc_streams", description=__doc__.splitlines()[0])
    p.add_argument("--concurrency", default="64,256")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--target", default=str(TINY), help="a folder with a config.json (dummy weights)")
    p.add_argument("--stream-intervals", default="1", help="modeld's --stream-interval values to run, side by side")
    args = p.parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",")]
    intervals = [int(i) for i in args.stream_intervals.split(",")]
    prompts = random_prompts(max(levels), args.prompt_tokens)
    print(
        f"{pathlib.Path(args.target).name} (dummy weights) with the default model's tokenizer on the {args.device}, "
        f"{args.prompt_tokens} "
        f"prompt + {args.new_tokens} new tokens a request, greedy, median of {args.rounds} rounds\n\n"
        "| requests | stream interval | through gRPC tok/s | in-process tok/s | gRPC / in-process | modeld CPU s / "
        "1K tokens |\n"
        "|---|---|---|---|---|---|"
    )
    with (
        tempfile.TemporaryDirectory(prefix="bench-grpc-") as tmp,
        run_memd(args.target, *many_requests_memd_flags(max(levels)), device=args.device) as memd,
    ):
        folder = model_with_tokenizer(pathlib.Path(args.target), pathlib.Path(tmp))
        cfg = ModeldConfig(
            device=args.device,
            memd=memd.address,
            target_model=str(folder),
            load_format="dummy",
            speculative_algorithm="none",
        )
        grpc_rates = {(level, i): ([], []) for level in levels for i in intervals}  # tokens/s, CPU s per 1K tokens
        local_rates = {level: [] for level in levels}
        for k in range(args.rounds):
            for interval in intervals:
                with run_modeld(
                    memd,
                    "--target-model",
                    str(folder),
                    "--load-format",
                    "dummy",
                    "--speculative-algorithm",
                    "none",
                    "--stream-interval",
                    str(interval),
                    device=args.device,
                ) as modeld:
                    asyncio.run(stream_all(modeld.address, prompts[:8], 8))  # warm-up
                    for level in levels:
                        rate, cpu = through_grpc(modeld.address, modeld.proc.pid, prompts[:level], args.new_tokens)
                        grpc_rates[(level, interval)][0].append(rate)
                        grpc_rates[(level, interval)][1].append(cpu)
            with running_engine(cfg) as engine:
                generate_all(engine, prompts[:8], 8, True, f"warm-{k}")
                for level in levels:
                    tokens, seconds, _ = generate_all(engine, prompts[:level], args.new_tokens, True, f"c{level}-{k}")
                    local_rates[level].append(tokens / seconds)
        for (level, interval), (rates, cpus) in grpc_rates.items():
            g, local = statistics.median(rates), statistics.median(local_rates[level])
            print(f"| {level} | {interval} | {g:.0f} | {local:.0f} | {g / local:.2f} | {statistics.median(cpus):.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
