"""DFLASH on an H200 in bf16 with the default target (SmolLM2-135M-Instruct) and a random draft:
greedy output with the draft on equals the output with it off, except where bf16 rounding decides a
near-tie (NEAR_TIE, justified in tests/e2e/conftest.py); and a short throughput print, draft on vs off.
A random draft is almost never accepted, so the throughput shows the cost of speculation, not its gain. One prompt
is exactly a block long (a prompt chunk with the verify graph's shape: it once ran a decode chain over itself)."""

import concurrent.futures
import time

import pytest
import torch

import client
from tests.conftest import NEAR_TIE
from tests.daemons import memd_args, run_memd, run_modeld
from tests.tiny_models import write_draft

pytestmark = pytest.mark.gpu
MAX_NEW = 64
BLOCK = 8  # the random draft's


def run_all(address: str, prompts: list[list[int]], at_once: bool) -> tuple[list[list[int]], float, int]:
    with client.Client(address, timeout=600) as c:
        go = lambda ids: c.generate(input_ids=ids, max_new_tokens=MAX_NEW, temperature=0, ignore_eos=True)  # noqa: E731
        begin = time.perf_counter()
        if at_once:
            with concurrent_pool() as pool:
                results = list(pool.map(go, prompts))
        else:
            results = [go(ids) for ids in prompts]
        elapsed = time.perf_counter() - begin
    return [list(r.output_ids) for r in results], elapsed, sum(r.spec_verify_ct for r in results)


def concurrent_pool():
    return concurrent.futures.ThreadPoolExecutor(8)


def first_difference_is_a_near_tie(hf, prompt, a, b) -> tuple[bool, float]:
    first = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    with torch.no_grad():
        logits = hf(torch.tensor([prompt + a[:first]], device="cuda")).logits[0, -1].float()
    top2 = logits.topk(2).values
    gap = float(top2[0] - top2[1])
    return gap <= NEAR_TIE, gap


@pytest.mark.parametrize("page, ratio", [(1, 1.0), (64, 0.25)])
def test_bf16_greedy_lossless_and_throughput(tmp_path, default_model, chat_ids, hf_models, page, ratio):
    draft = write_draft(
        tmp_path / "draft", default_model, layers=2, block_size=BLOCK, target_layer_ids=(1, 15, 27), sliding_window=128
    )
    # and a prompt exactly one block long: it has the verify graph's shape, yet runs as a prompt (one step)
    prompts = chat_ids + [chat_ids[0][:BLOCK]]
    args = memd_args(
        draft=draft,
        ratio=ratio,
        window=128 if ratio < 1 else None,
        page=page,
        budget=2_000_000_000,
        max_running=8,
        chunk=512,
    ) + ["--kv-cache-dtype", "bfloat16"]
    report = []
    with run_memd(default_model, *args, device="cuda") as memd:
        outputs = {}
        for algorithm in ("dflash", "none"):
            extra = ["--draft-model", str(draft)] if algorithm == "dflash" else []
            with run_modeld(
                memd, "--target-model", str(default_model), "--speculative-algorithm", algorithm, *extra, device="cuda"
            ) as modeld:
                run_all(modeld.address, chat_ids[:2], at_once=False)  # warm-up
                for at_once in (False, True):
                    out, seconds, verifies = run_all(modeld.address, prompts, at_once)
                    outputs[algorithm, at_once] = out
                    tokens = sum(len(o) for o in out)
                    report.append(
                        f"{algorithm:6s} batch {'8' if at_once else '1'}: {tokens / seconds:8.1f} tok/s "
                        f"({tokens} tokens, {seconds:.2f} s, {verifies} verify steps)"
                    )
    print(f"\npage {page}, ratio {ratio}:\n" + "\n".join(report))
    hf = hf_models("cuda")
    for at_once in (False, True):
        for prompt, a, b in zip(prompts, outputs["dflash", at_once], outputs["none", at_once]):
            if a != b:
                tie, gap = first_difference_is_a_near_tie(hf, prompt, a, b)
                assert tie, f"draft on/off part where the top-2 logit gap is {gap:.3f} > {NEAR_TIE}"
