"""The draft's training data: the target's own answers to the prompts, resumable and time-bounded.

    python -m train.generate --prompts DIR --out DIR [--engine inproc|modeld|hf] [--addr MODELD | --memd MEMD]
        [--target DIR]
        [--sampling greedy,0.8] [--top-p 0.95] [--max-new-tokens 768] [--concurrency 256] [--batch 256]
        [--time-budget SECONDS] [--limit N] [--device cuda] [--kv-budget-gb 40] [--page-size 64]
    python -m train.generate pack --src DIR --out DIR [--max-mib 15]

--engine inproc (the default without --addr): modeld's engine in this process (train.inproc: no gRPC stream,
about 4x the tokens/s at hundreds of requests in flight) over the memd at --memd, or one started here for
--target. --engine modeld (the default with --addr): prompts stream through the project's asyncio client at
--concurrency requests in flight, to the modeld at --addr, or to a memd + modeld pair started here. Both
decode without a draft (plain decoding is what the draft learns to predict). --engine hf: batched Hugging Face
`generate` on --target, the fallback; batches of similar prompt length, greedy and sampled apart.

Every prompt record (train.prompts) is answered once per --sampling entry: "greedy", or a temperature (with
--top-p; the seed comes from the prompt id, so a re-run samples the same). Requests are built by train.chat:
the chat template the serving path applies, the conversation so far for a later turn of a multi-turn prompt.
Answers go to response shards (train.responses) as they finish; a restart reads the shards in --out and skips
every (prompt, sample) already there, so stopping and resuming loses or repeats nothing. --time-budget stops
starting work after that many seconds, abandons requests still in flight (they are redone next time), writes
what is done and exits 0; SIGTERM / SIGINT do the same at once.
`pack` merges shards into files of at most --max-mib MiB (what may come back from the GPU machine).
"""

import argparse
import asyncio
import pathlib
import signal
import sys
import time

from train import chat, responses
from train.dedupe import stable_hash
from train.prompts import read_records


def parse_sampling(text: str) -> list[float]:
    """ "greedy,0.8" -> [0.0, 0.8]: one answer per entry; 0 is greedy."""
    out = []
    for part in text.split(","):
        part = part.strip().lower()
        out.append(0.0 if part in ("greedy", "0", "0.0") else float(part))
        if out[-1] < 0:
            raise ValueError(f"a temperature must be >= 0: {part}")
    return out


def make_jobs(
    records: list[dict],
    temperatures: list[float],
    done: set[str],
    limit: int | None,
    sources_first: tuple[str, ...] = (),
) -> list[tuple[dict, int]]:
    """(record, sample index) still to do, in prompt order; --limit counts prompts (done or not). The prompts of
    `sources_first` go first, in the order given (the rest after them, in prompt order): a time-bounded run then
    spends its budget on the mix asked for."""
    jobs = []
    for record in records[:limit]:
        for k in range(len(temperatures)):
            if f"{record['id']}#{k}" not in done:
                jobs.append((record, k))
    rank = {source: i for i, source in enumerate(sources_first)}
    return sorted(jobs, key=lambda job: rank.get(job[0].get("source"), len(rank)))


def meta(record: dict, k: int, temperature: float, answers: list[list[int]]) -> dict:
    return {
        "key": f"{record['id']}#{k}",
        "id": record["id"],
        "source": record.get("source"),
        "sample": k,
        "temperature": temperature,
        "turns": len(answers),
    }


def seed_of(record: dict, k: int) -> int:
    return stable_hash(f"{record['id']}#{k}") % (2**31 - 1)


class Stop:
    """Set by the time budget or a signal."""

    def __init__(self, budget: float, max_answers: int | None = None):
        self.deadline = time.monotonic() + budget
        self.max_answers = max_answers
        self.answered = 0
        self.flag = False

    def count(self, n: int = 1) -> None:
        self.answered += n
        if self.max_answers is not None and self.answered >= self.max_answers:
            self.flag = True

    def __call__(self) -> bool:
        return self.flag or time.monotonic() >= self.deadline

    def left(self) -> float:
        return 0.0 if self.flag else max(0.0, self.deadline - time.monotonic())


async def generate_modeld(address: str, jobs, tokenizer, temperatures, args, writer, stop: Stop, log) -> int:
    import client

    queue = iter(jobs)
    finished = 0

    async with client.AsyncClient(address, timeout=args.request_timeout, connect_timeout=60) as c:

        async def worker():
            nonlocal finished
            for record, k in queue:
                if stop():
                    return
                t = temperatures[k]
                sampling = (
                    dict(temperature=0.0) if t == 0 else dict(temperature=t, top_p=args.top_p, seed=seed_of(record, k))
                )
                answers = []
                for _ in record["turns"]:
                    ids = chat.turn_prompt(tokenizer, record, answers)
                    result = await c.generate(input_ids=ids, max_new_tokens=args.max_new_tokens, **sampling)
                    answers.append(list(result.output_ids))
                writer.add(meta(record, k, t, answers), answers)
                finished += 1
                stop.count()
                if finished % 500 == 0:
                    log(f"{finished} answered")

        tasks = [asyncio.ensure_future(worker()) for _ in range(args.concurrency)]
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, lambda: setattr(stop, "flag", True))
            except (NotImplementedError, RuntimeError):
                pass
        pending = set(tasks)
        while pending and not stop():
            _, pending = await asyncio.wait(pending, timeout=min(1.0, max(0.01, stop.left())))
        for task in pending:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError)]
        if errors:
            raise errors[0]
    return finished


def generate_hf(target: str, jobs, tokenizer, temperatures, args, writer, stop: Stop, log) -> int:
    """Batches of jobs with the same sample index and turn count, of similar prompt length; a multi-turn
    batch is generated turn by turn. The budget is checked between batches."""
    import torch
    from transformers import AutoModelForCausalLM

    device = args.device
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(target, dtype=dtype).to(device).eval()
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    finished = 0
    window = 8 * args.batch
    for first in range(0, len(jobs), window):
        chunk = jobs[first : first + window]
        groups: dict[tuple[int, int], list] = {}
        for job in chunk:
            groups.setdefault((job[1], len(job[0]["turns"])), []).append(job)
        for (k, _), group in sorted(groups.items()):
            group.sort(key=lambda job: len(chat.turn_prompt(tokenizer, job[0], [])))
            for b in range(0, len(group), args.batch):
                if stop():
                    return finished
                part = group[b : b + args.batch]
                answers = [[] for _ in part]
                for _ in part[0][0]["turns"]:
                    prompts = [chat.turn_prompt(tokenizer, rec, ans) for (rec, _), ans in zip(part, answers)]
                    seed = seed_of(part[0][0], k)
                    for ans, new in zip(
                        answers, _hf_batch(model, prompts, temperatures[k], args, eos, pad, device, seed)
                    ):
                        ans.append(new)
                for (record, _), ans in zip(part, answers):
                    writer.add(meta(record, k, temperatures[k], ans), ans)
                finished += len(part)
                stop.count(len(part))
                log(f"{finished} answered")
    return finished


def _hf_batch(model, prompts: list[list[int]], temperature: float, args, eos: int, pad: int, device: str, seed: int):
    import torch

    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    if temperature > 0:
        torch.manual_seed(seed)
        sampling = dict(do_sample=True, temperature=temperature, top_p=args.top_p, top_k=0)
    else:
        sampling = dict(do_sample=False)
    with torch.no_grad():
        out = model.generate(
            ids, attention_mask=mask, max_new_tokens=args.max_new_tokens, pad_token_id=pad, eos_token_id=eos, **sampling
        )[:, width:].tolist()
    return [a[: a.index(eos) + 1] if eos in a else a for a in out]


def start_memd(args):
    """memd for --target on --device, sized for --concurrency requests (train.stack.run_memd)."""
    from train.stack import memd_args, run_memd

    kv = "bfloat16" if args.device == "cuda" else "float32"
    mem = memd_args(
        page=args.page_size,
        budget=int(args.kv_budget_gb * 2**30),
        max_running=args.concurrency,
        chunk=args.chunked_prefill,
    )
    return run_memd(pathlib.Path(args.target), *mem, "--kv-cache-dtype", kv, device=args.device)


def start_stack(args):
    """memd + modeld for --target on --device; a context manager yielding modeld's address."""
    import contextlib

    from train.stack import run_modeld

    @contextlib.contextmanager
    def stack():
        with start_memd(args) as memd:
            with run_modeld(
                memd, "--target-model", args.target, "--speculative-algorithm", "none", device=args.device
            ) as modeld:
                yield modeld.address

    return stack()


def run_inproc(args, jobs, tokenizer, temperatures, writer, stop: Stop, log) -> int:
    """--engine inproc over the memd at --memd, or one started here."""
    from train.inproc import generate_inproc

    def run(memd: str) -> int:
        return generate_inproc(memd, jobs, tokenizer, temperatures, args, writer, stop, log, seed_of=seed_of, meta=meta)

    if args.memd:
        return run(args.memd)
    with start_memd(args) as memd:
        return run(memd.address)


def main_generate(args) -> int:
    from transformers import AutoTokenizer

    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    temperatures = parse_sampling(args.sampling)
    records = read_records(pathlib.Path(args.prompts))
    out = pathlib.Path(args.out)
    done = responses.done_keys(out) if out.exists() else set()
    jobs = make_jobs(records, temperatures, done, args.limit, tuple(filter(None, args.sources_first.split(","))))
    log(f"{len(records)} prompts x {len(temperatures)} samples; {len(done)} done before, {len(jobs)} to do")
    if not jobs:
        return 0
    if args.target is None:
        from modeld.model.fetch_default import ensure_default_model

        args.target = str(ensure_default_model())
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    writer = responses.ShardWriter(out, args.shard_records, args.flush_seconds)
    stop = Stop(args.time_budget, args.max_answers)
    begin = time.monotonic()
    try:
        if args.engine == "hf":
            finished = generate_hf(args.target, jobs, tokenizer, temperatures, args, writer, stop, log)
        elif args.engine == "inproc":
            finished = run_inproc(args, jobs, tokenizer, temperatures, writer, stop, log)
        elif args.addr:
            finished = asyncio.run(generate_modeld(args.addr, jobs, tokenizer, temperatures, args, writer, stop, log))
        else:
            with start_stack(args) as address:
                finished = asyncio.run(generate_modeld(address, jobs, tokenizer, temperatures, args, writer, stop, log))
    finally:
        writer.flush()
    seconds = time.monotonic() - begin
    log(
        f"{finished} answered in {seconds:.0f} s; {len(jobs) - finished} left"
        + ("" if finished == len(jobs) else " (run again to continue)")
    )
    return 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["pack"]:
        p = argparse.ArgumentParser(prog="python -m train.generate pack")
        p.add_argument("--src", required=True)
        p.add_argument("--out", required=True)
        p.add_argument("--max-mib", type=float, default=15.0)
        a = p.parse_args(argv[1:])
        for path in responses.pack(pathlib.Path(a.src), pathlib.Path(a.out), a.max_mib):
            print(f"{path} {path.stat().st_size / 2**20:.1f} MiB")
        return 0
    p = argparse.ArgumentParser(prog="python -m train.generate", description=__doc__.splitlines()[0])
    p.add_argument("--prompts", required=True, help="a folder of prompt shards (python -m train.prompts build)")
    p.add_argument("--out", required=True, help="the response shards' folder (read first: what is there is skipped)")
    p.add_argument("--engine", choices=["inproc", "modeld", "hf"], help="default: modeld with --addr, else inproc")
    p.add_argument("--addr", help="--engine modeld: a running modeld (else memd + modeld are started here)")
    p.add_argument("--memd", help="--engine inproc: a running memd (else one is started here for --target)")
    p.add_argument("--target", help="the target's folder (default: the converted default model)")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--sampling", default="greedy", help="comma-separated: greedy and/or temperatures, e.g. greedy,0.8")
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--max-new-tokens", type=int, default=768)
    p.add_argument("--concurrency", type=int, default=256, help="requests in flight (inproc and modeld engines)")
    p.add_argument("--batch", type=int, default=256, help="sequences per generate call (hf engine)")
    p.add_argument("--time-budget", type=float, default=float("inf"), help="seconds; then stop cleanly")
    p.add_argument("--limit", type=int, help="only the first N prompts")
    p.add_argument("--sources-first", default="", help="comma-separated prompt sources answered before the rest")
    p.add_argument("--max-answers", type=int, help="stop (cleanly, as at the time budget) after N answers")
    p.add_argument("--shard-records", type=int, default=4000)
    p.add_argument("--flush-seconds", type=float, default=120.0)
    p.add_argument("--request-timeout", type=float, default=3600.0)
    p.add_argument("--kv-budget-gb", type=float, default=40.0, help="memd's KV budget when started here")
    p.add_argument("--page-size", type=int, default=64)
    p.add_argument("--chunked-prefill", type=int, default=4096)
    args = p.parse_args(argv)
    args.engine = args.engine or ("modeld" if args.addr else "inproc")
    if args.addr and args.engine != "modeld":
        p.error(f"--addr is a modeld's address: it needs --engine modeld, not {args.engine}")
    if args.memd and args.engine != "inproc":
        p.error(f"--memd is for --engine inproc (--engine {args.engine} starts its own or uses --addr)")
    return main_generate(args)


if __name__ == "__main__":
    sys.exit(main())
