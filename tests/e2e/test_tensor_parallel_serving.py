"""modeld over memd's tensor-parallel ranks, on the CPU over gloo: memd with --tensor-parallel-size 2 makes a KV pool
per rank, and modeld follows its layout with two ranks, each holding half the heads and half the MLP width. Greedy
output equals one rank's and Hugging Face's; a prompt cached by the two ranks is served again from every rank's pool;
a rank that dies stops the engine (open streams fail UNAVAILABLE, memd frees what it held) and the front starts every
rank again. With a DFLASH draft split over the ranks too, greedy output equals plain decoding's and the drafts are
accepted as over one rank."""

import os
import pathlib
import random
import signal
from concurrent.futures import ThreadPoolExecutor

import pytest

import client
from tests import tiny_models as tm
from tests.daemons import is_idle, memd_args, run_memd, run_modeld, shipped_draft_flags, shipped_draft_memd_args
from tests.e2e.test_engine_process import alive, engine_pid, wait_until
from tests.e2e.test_model_identity_e2e import NEW_TOKENS, hf_greedy

PROMPTS = [random.Random(seed).choices(range(1, 512), k=40 + 7 * seed) for seed in range(3)]


def memd_flags(ranks: int) -> list[str]:
    return [*memd_args(budget=2_000_000, max_running=4, chunk=32), "--tensor-parallel-size", str(ranks)]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return tm.write_random_target(tmp_path_factory.mktemp("tp-target") / "target")


def generate_each(address: str) -> list[tuple[int, list[int]]]:
    """(cached tokens, output ids) of every prompt, greedy, all in flight at once."""
    with client.Client(address, timeout=300) as c, ThreadPoolExecutor(len(PROMPTS)) as pool:
        results = list(
            pool.map(
                lambda p: c.generate(input_ids=p, max_new_tokens=NEW_TOKENS, temperature=0, ignore_eos=True), PROMPTS
            )
        )
    return [(r.cached_tokens, list(r.output_ids)) for r in results]


def rank_pids(engine: int) -> list[int]:
    """The engine process's other ranks: its children named by multiprocessing's spawn, but its resource tracker."""
    children = [
        int(pid)
        for task in pathlib.Path(f"/proc/{engine}/task").iterdir()
        for pid in (task / "children").read_text().split()
    ]
    return [
        pid
        for pid in children
        if "resource_tracker" not in pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    ]


def test_two_ranks_generate_what_one_rank_and_hugging_face_do(target):
    expected = [hf_greedy(target, p) for p in PROMPTS]
    with run_memd(target, *memd_flags(1)) as memd, run_modeld(memd, "--target-model", str(target)) as modeld:
        one_rank = generate_each(modeld.address)
    assert [out for _, out in one_rank] == expected
    with run_memd(target, *memd_flags(2)) as memd, run_modeld(memd, "--target-model", str(target)) as modeld:
        assert memd.capacity().tensor_parallel_size == 2
        assert len(rank_pids(engine_pid(modeld.pid))) == 1, "rank 1 runs beside the engine process (rank 0)"
        first = generate_each(modeld.address)
        again = generate_each(modeld.address)  # every prompt but its last token from memd's prefix cache
        assert "2 tensor-parallel ranks (memd's layout)" in modeld.log_path.read_text()
    assert [out for _, out in first] == expected
    assert [out for _, out in again] == expected
    assert all(cached == len(p) - 1 for (cached, _), p in zip(again, PROMPTS))


def test_a_rank_that_dies_stops_the_engine_and_every_rank_starts_again(target):
    with (
        run_memd(target, *memd_flags(2)) as memd,
        run_modeld(memd, "--target-model", str(target)) as modeld,
        client.Client(modeld.address, timeout=60, max_retries=0) as c,
    ):
        engine = engine_pid(modeld.pid)
        (rank1,) = rank_pids(engine)
        handle = c.stream(input_ids=PROMPTS[0], max_new_tokens=3000, temperature=0, ignore_eos=True)
        chunks = iter(handle)
        next(chunks)  # the request runs, holding slots in memd
        os.kill(rank1, signal.SIGKILL)
        with pytest.raises(client.Unavailable):
            for _ in chunks:
                pass
        assert wait_until(lambda: not alive(engine), 30), "the engine outlived a lost rank"
        assert wait_until(lambda: c.health() == "SERVING", 120), "the engine was not started again"
        assert len(rank_pids(engine_pid(modeld.pid))) == 1
        log_text = modeld.log_path.read_text()
        assert "tensor-parallel rank 1 exited (exit code -9)" in log_text
        assert "the engine process serves again (restart 1)" in log_text
        result = c.generate(input_ids=PROMPTS[1], max_new_tokens=NEW_TOKENS, temperature=0, ignore_eos=True)
        assert list(result.output_ids) == hf_greedy(target, PROMPTS[1])
        assert is_idle(memd.wait_idle(10))  # the dead engine's session ended: its lease freed its slots on every rank


@pytest.fixture(scope="module")
def friendly(tmp_path_factory):
    """A target whose output runs into SINK and a draft that proposes SINK: greedy DFLASH accepts those runs."""
    root = tmp_path_factory.mktemp("tp-friendly")
    target = tm.write_friendly_target(root / "target")
    draft = tm.write_draft(
        root / "draft", target, layers=2, block_size=4, sliding_window=32, mask_token_id=tm.FRIENDLY_MASK
    )
    return target, draft


def friendly_outputs(target, draft, ranks: int, speculate: bool) -> list[tuple[list[int], int]]:
    """(output ids, verify steps) of greedy requests over `ranks` ranks, with the draft (every step verifying) or
    plainly."""
    rng = random.Random(7)
    prompts = [[rng.randrange(tm.FRIENDLY_VOCAB) for _ in range(n)] for n in (5, 23, 48)]
    flags = memd_args(budget=2_000_000, max_running=4, chunk=16, draft=draft, ratio=0.5, window=32)
    modeld_flags = ["--target-model", str(target)]
    modeld_flags += ["--draft-model", str(draft)] if speculate else ["--speculative-algorithm", "none"]
    with (
        run_memd(target, *flags, "--tensor-parallel-size", str(ranks)) as memd,
        run_modeld(memd, *modeld_flags, tuning="adaptive_speculation=false") as modeld,
        client.Client(modeld.address, timeout=300) as c,
    ):
        results = [c.generate(input_ids=p, max_new_tokens=40, temperature=0, ignore_eos=True) for p in prompts]
    return [(list(r.output_ids), r.spec_verify_ct) for r in results]


def test_dflash_over_two_ranks_equals_plain_and_accepts_as_one_rank_does(friendly):
    target, draft = friendly
    plain = friendly_outputs(target, draft, ranks=1, speculate=False)
    one_rank = friendly_outputs(target, draft, ranks=1, speculate=True)
    two_ranks = friendly_outputs(target, draft, ranks=2, speculate=True)
    assert [out for out, _ in two_ranks] == [out for out, _ in plain]
    assert two_ranks == one_rank, "the drafts and their acceptance are the same over two ranks"
    assert sum(40 / steps for _, steps in two_ranks) / len(two_ranks) > 1.3, f"too little accepted: {two_ranks}"


def test_the_default_model_and_its_draft_over_three_ranks_equal_one_rank(default_model, chat_ids):
    """The default model's 9 heads and 3 KV heads split over 3 ranks (not 2), and so does the shipped draft's: DFLASH
    over three ranks gives one rank's plain greedy output with one rank's verify steps."""
    prompts = chat_ids[:2]

    def served(ranks: int, *modeld_flags: str) -> list[tuple[list[int], int]]:
        flags = [*shipped_draft_memd_args(600_000_000, 2, 512), "--tensor-parallel-size", str(ranks)]
        with (
            run_memd(default_model, *flags) as memd,
            run_modeld(
                memd, "--target-model", str(default_model), *modeld_flags, tuning="adaptive_speculation=false"
            ) as modeld,
            client.Client(modeld.address, timeout=600) as c,
        ):
            results = [c.generate(input_ids=ids, max_new_tokens=24, temperature=0, ignore_eos=True) for ids in prompts]
        return [(list(r.output_ids), r.spec_verify_ct) for r in results]

    plain = served(1, "--speculative-algorithm", "none")
    one_rank = served(1, *shipped_draft_flags())
    three_ranks = served(3, *shipped_draft_flags())
    assert [out for out, _ in three_ranks] == [out for out, _ in plain]
    assert three_ranks == one_rank


def test_ranks_follow_memd_back_after_it_is_lost(target):
    """memd killed and back at its address with new pools: every rank maps them, and the output is still the model's;
    a memd back with another rank count is refused until it matches."""
    expected = hf_greedy(target, PROMPTS[2])
    with run_memd(target, *memd_flags(2), check_free=False) as memd:
        with (
            run_modeld(memd, "--target-model", str(target)) as modeld,
            client.Client(modeld.address, timeout=60, connect_timeout=5) as c,
        ):
            memd.proc.send_signal(signal.SIGKILL)
            memd.proc.wait(timeout=10)
            assert wait_until(lambda: c.health() == "NOT_SERVING", 10)
            with run_memd(target, *memd_flags(1), address=memd.address) as other:
                assert wait_until(lambda: "this modeld runs 2" in modeld.log_path.read_text(), 30)
                assert c.health() == "NOT_SERVING" and other.capacity().sessions == 0
            with run_memd(target, *memd_flags(2), address=memd.address) as again:
                assert wait_until(lambda: c.health() == "SERVING", 60), modeld.log_path.read_text()
                result = c.generate(input_ids=PROMPTS[2], max_new_tokens=NEW_TOKENS, temperature=0, ignore_eos=True)
                assert list(result.output_ids) == expected
                assert again.capacity().sessions == 1
                (rank1,) = rank_pids(engine_pid(modeld.pid))
                mapped = pathlib.Path(f"/proc/{rank1}/maps").read_text()
                assert f"memd-{again.proc.pid}-" in mapped, "rank 1 did not map the new memd's pools"
                assert f"memd-{memd.proc.pid}-" not in mapped, "rank 1 still maps the lost memd's pools"
