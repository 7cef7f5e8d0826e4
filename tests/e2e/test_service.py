"""memd and modeld as separate processes, the rest of modeld's surface through the client: Abort,
GetInfo, Capacity, seeded sampling, the asyncio client, the max_tokens alias, duplicate request
ids, memd's death (modeld turns NOT_SERVING and answers UNAVAILABLE instead of hanging, then
stops cleanly), and the `python -m client` command line. memd's pools are fully free and modeld's
queues empty after every test that uses the module's daemons."""

import asyncio
import concurrent.futures
import json
import pathlib
import signal
import subprocess
import sys
import time
import uuid

import grpc
import pytest

import client
from client.messages import build_generate_request
from protos import modeld_pb2_grpc
from tests.daemons import REPO, child_env, is_idle, run_memd, run_modeld

MAX_NEW = 16
LONG = dict(max_new_tokens=2000, temperature=0, ignore_eos=True)  # runs until aborted or cancelled
MEMD_ARGS = [
    "--page-size",
    "1",
    "--max-running-requests",
    "8",
    "--max-total-tokens",
    "8192",
    "--draft-model",
    "none",
    "--kv-cache-dtype",
    "float32",
    "--strict",
]


@pytest.fixture(scope="module")
def daemons(default_model):
    with run_memd(default_model, *MEMD_ARGS) as memd, run_modeld(memd, "--target-model", str(default_model)) as modeld:
        with client.Client(modeld.address, timeout=60) as c:
            yield memd, modeld, c


def wait_idle(memd, c, timeout: float = 5.0):
    """Poll until memd holds no slot and no request, and modeld runs and queues nothing."""
    deadline = time.monotonic() + timeout
    while True:
        cap, mine = memd.capacity(), c.capacity()
        idle = is_idle(cap) and mine["running_requests"] == 0 and mine["waiting_requests"] == 0
        if idle or time.monotonic() > deadline:
            return cap, mine
        time.sleep(0.05)


@pytest.fixture(autouse=True)
def pools_free_after(request):
    yield
    if "daemons" not in request.fixturenames:
        return  # the memd-lost test runs (and kills) its own daemons
    memd, _, c = request.getfixturevalue("daemons")
    _, mine = wait_idle(memd, c)
    assert mine["running_requests"] == 0 and mine["waiting_requests"] == 0, mine
    memd.assert_idle_then_flush()


def new_rid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def ids_of(chunks) -> list[int]:
    return [t for chunk in chunks for t in chunk.token_ids]


# ---- 1. Abort ----------------------------------------------------------------------------------


@pytest.mark.parametrize("aborter", ["same-client", "other-client"])
def test_abort_ends_a_running_stream(daemons, aborter):
    memd, modeld, c = daemons
    rid = new_rid("abort")
    handle = c.stream("Tell me a long story.", request_id=rid, **LONG)
    chunks = iter(handle)
    seen = [next(chunks), next(chunks)]
    assert handle.request_id == rid
    assert memd.capacity().target.held_by_requests > 0 and c.capacity()["running_requests"] == 1

    if aborter == "same-client":
        assert c.abort(rid) is True
    else:
        with client.Client(modeld.address, timeout=10) as other:
            assert other.abort(rid) is True
    start = time.monotonic()
    seen += list(chunks)  # the stream ends by itself, with a complete message
    assert time.monotonic() - start < 5
    result = handle.result
    assert result is not None and result.finish_reason == "abort" and result.request_id == rid
    assert list(result.output_ids) == ids_of(seen)
    assert 2 <= result.completion_tokens == len(result.output_ids) < LONG["max_new_tokens"]

    cap, mine = wait_idle(memd, c)
    assert is_idle(cap) and mine["running_requests"] == 0
    assert c.abort(rid) is False  # finished: modeld no longer knows it


def test_abort_of_an_unknown_id_returns_false(daemons):
    c = daemons[2]
    assert c.abort(new_rid("never-started")) is False
    assert c.abort("") is False


# ---- 2. GetInfo --------------------------------------------------------------------------------


def test_info_describes_model_and_geometry(daemons, default_model, tokenizer):
    memd, _, c = daemons
    info = c.info()
    cap = memd.capacity()
    assert info["target_model"] == str(default_model)
    assert info["draft_model"] == "" and info["draft_tokens"] == 0
    assert info["dtype"] == "float32" and info["device"] == "cpu"
    assert info["speculative_algorithm"] == "none"
    assert info["page_size"] == 1 == cap.page_size
    assert info["max_running_requests"] == 8 == cap.max_running_requests
    assert info["context_len"] == cap.context_len > 0
    assert info["target_tokens"] == 8192 == cap.target.total
    assert info["vocab_size"] == 49152 == len(tokenizer)
    assert info["spec_drafts"] == info["spec_draft_tokens"] == info["spec_accepted_tokens"] == 0


# ---- 3. Capacity through modeld ----------------------------------------------------------------


def test_capacity_reports_memd_pools_and_modeld_queues(daemons, chat_ids):
    memd, _, c = daemons
    idle = c.capacity()
    direct = memd.capacity()
    pool = idle["memd"]["target"]
    assert pool["total"] == direct.target.total == 8192
    assert pool["free"] == pool["total"] and pool["used"] == 0 and pool["held_by_requests"] == 0
    assert pool["bytes"] == direct.target.bytes > 0
    assert idle["memd"]["has_draft"] is False
    assert idle["memd"]["page_size"] == 1 and idle["memd"]["max_running_requests"] == 8
    [held] = idle["memd"]["session_holdings"]
    assert idle["memd"]["sessions"] == 1 and (held["client_name"], held["target_held"]) == ("modeld", 0)
    assert len(held["model_digest"]) == 16  # modeld names its model (memd shows a digest of it): prefixes kept apart
    assert idle["memd"]["running_requests"] == 0
    assert idle["running_requests"] == 0 and idle["waiting_requests"] == 0

    ids = chat_ids[3]
    with c.stream(input_ids=ids, **LONG) as handle:
        chunks = iter(handle)
        next(chunks), next(chunks)
        busy = c.capacity()
        pool = busy["memd"]["target"]
        assert pool["used"] >= len(ids) and pool["free"] == pool["total"] - pool["used"]
        # the prompt, prefilled, is checkpointed into the prefix cache (protected while the request runs);
        # the request itself holds the rest
        assert pool["used"] == pool["held_by_requests"] + pool["protected"] + pool["evictable"]
        assert pool["protected"] >= len(ids) - 1 and pool["held_by_requests"] > 0
        assert pool["held_by_requests"] == sum(h["target_held"] for h in busy["memd"]["session_holdings"])
        assert busy["memd"]["running_requests"] == 1
        assert busy["running_requests"] == 1 and busy["waiting_requests"] == 0
    # leaving the block cancelled the stream; the autouse check waits for the slots to come back


# ---- 4. Seeded sampling ------------------------------------------------------------------------


def test_seeded_sampling_is_reproducible_and_top_k_1_is_greedy(daemons, chat_ids):
    c = daemons[2]
    ids = chat_ids[1]  # a haiku: many plausible continuations
    sampled = dict(input_ids=ids, max_new_tokens=32, temperature=0.8, top_p=0.9, top_k=50, ignore_eos=True)
    first = c.generate(seed=1234, **sampled).output_ids  # alone
    assert len(first) == 32

    # The same seed again, batched with other requests: its own generator, so the same tokens.
    jobs = {
        "again": dict(seed=1234, **sampled),
        "greedy": dict(input_ids=ids, max_new_tokens=32, temperature=0, ignore_eos=True),
        "top_k_1": dict(input_ids=ids, max_new_tokens=32, temperature=0.8, top_k=1, seed=7, ignore_eos=True),
        "top_k_1_unseeded": dict(input_ids=ids, max_new_tokens=32, temperature=1.0, top_k=1, ignore_eos=True),
        "seed_99": dict(seed=99, **sampled),
    }
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        out = dict(zip(jobs, pool.map(lambda kw: c.generate(**kw).output_ids, jobs.values())))
    assert out["again"] == first
    assert out["top_k_1"] == out["greedy"] and out["top_k_1_unseeded"] == out["greedy"]

    # Other seeds give other samples: 1234 vs 99 differ over 32 tokens almost surely; should
    # they not, a couple more seeds must produce at least one difference.
    others = [out["seed_99"]]
    if others[0] == first:
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            others += list(pool.map(lambda s: c.generate(seed=s, **sampled).output_ids, (5, 2024, 31337)))
    assert any(o != first for o in others), "every seed sampled the same 32 tokens"
    assert first != out["greedy"] or any(o != out["greedy"] for o in others), "sampling looks greedy"


# ---- 5. asyncio client -------------------------------------------------------------------------


def test_async_client_matches_the_sync_client(daemons, chat_ids):
    _, modeld, c = daemons
    ids = chat_ids[3]
    expected = c.generate(input_ids=ids, max_new_tokens=MAX_NEW, temperature=0)

    async def main():
        async with client.AsyncClient(modeld.address, timeout=60) as ac:
            assert await ac.health() == "SERVING"
            assert (await ac.info())["vocab_size"] == 49152
            assert await ac.abort(new_rid("async-unknown")) is False

            async def streamed():
                handle = ac.stream(input_ids=ids, max_new_tokens=MAX_NEW, temperature=0)
                async with handle:
                    chunks = [chunk async for chunk in handle]
                return chunks, handle.result

            result, (chunks, stream_result) = await asyncio.gather(
                ac.generate(input_ids=ids, max_new_tokens=MAX_NEW, temperature=0), streamed()
            )
            capacity = await ac.capacity()
            return result, chunks, stream_result, capacity

    result, chunks, stream_result, capacity = asyncio.run(main())
    assert result.output_ids == expected.output_ids and result.text == expected.text
    assert result.finish_reason == expected.finish_reason and result.prompt_tokens == len(ids)
    assert len(chunks) > 1
    assert tuple(ids_of(chunks)) == stream_result.output_ids == expected.output_ids
    assert "".join(chunk.text for chunk in chunks) == stream_result.text == expected.text
    assert capacity["memd"]["target"]["total"] == 8192


# ---- 6. max_tokens alias -----------------------------------------------------------------------


def test_max_tokens_is_an_alias_of_max_new_tokens(daemons, chat_ids):
    _, modeld, c = daemons
    ids = chat_ids[4]
    by_alias = c.generate(input_ids=ids, max_tokens=8, temperature=0, ignore_eos=True)
    by_name = c.generate(input_ids=ids, max_new_tokens=8, temperature=0, ignore_eos=True)
    assert by_alias.output_ids == by_name.output_ids and len(by_alias.output_ids) == 8
    assert by_alias.finish_reason == by_name.finish_reason == "length"

    with pytest.raises(ValueError, match="alias"):
        c.generate(input_ids=ids, max_new_tokens=8, max_tokens=8)
    # The alias is validated like the name.
    with pytest.raises(client.InvalidArgument, match="max_new_tokens"):
        c.generate(input_ids=ids, max_tokens=0)
    with pytest.raises(client.InvalidArgument, match="exceeds the context"):
        c.generate(input_ids=ids, max_tokens=8192)

    # modeld itself rejects both (a client that skips the ValueError).
    request = build_generate_request(input_ids=ids, max_new_tokens=8)
    request.sampling.max_tokens = 8
    with grpc.insecure_channel(modeld.address) as channel:
        with pytest.raises(grpc.RpcError) as exc:
            list(modeld_pb2_grpc.ModeldStub(channel).Generate(request, timeout=10))
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "alias" in exc.value.details()


# ---- 7. Duplicate request id -------------------------------------------------------------------


def test_duplicate_request_id_of_a_running_request_gets_already_exists(daemons, chat_ids):
    memd, _, c = daemons
    rid = new_rid("dup")
    ids = chat_ids[5]
    handle = c.stream(input_ids=ids, request_id=rid, **LONG)
    chunks = iter(handle)
    seen = [next(chunks)]
    with pytest.raises(client.AlreadyExists, match=rid):
        c.generate("hi", request_id=rid, max_new_tokens=4)
    assert c.capacity()["running_requests"] == 1  # the duplicate never ran
    seen += [next(chunks), next(chunks)]  # the original goes on
    assert c.abort(rid) is True
    seen += list(chunks)
    result = handle.result
    assert result.finish_reason == "abort" and list(result.output_ids) == ids_of(seen)
    # ... undisturbed: its tokens are the greedy continuation of its prompt.
    n = len(result.output_ids)
    assert c.generate(input_ids=ids, max_new_tokens=n, temperature=0, ignore_eos=True).output_ids == result.output_ids

    # Once the request is over, its id may be used again.
    wait_idle(memd, c)
    again = c.generate("hi", request_id=rid, max_new_tokens=4, temperature=0)
    assert again.request_id == rid and again.finish_reason in ("stop", "length")


# ---- 8. memd lost ------------------------------------------------------------------------------


def test_back_to_back_duplicates_and_an_immediate_abort(daemons):
    """Ids are reserved when a call arrives, not when the engine picks it up: of two requests sent
    back to back with one id, one runs and the other gets ALREADY_EXISTS, and nothing else is
    disturbed; an Abort right after a Generate finds the request."""
    memd, modeld, c = daemons[:3]
    stub = modeld_pb2_grpc.ModeldStub(grpc.insecure_channel(modeld.address))
    rid = new_rid("dup")
    request = build_generate_request("Count to ten.", max_new_tokens=20, temperature=0, request_id=rid)

    def drain(call):
        try:
            return [m for m in call][-1].complete.finish_reason
        except grpc.RpcError as exc:
            return exc.code()

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        outcomes = list(pool.map(drain, [stub.Generate(request, timeout=60) for _ in range(2)]))
    assert grpc.StatusCode.ALREADY_EXISTS in outcomes
    assert [o for o in outcomes if o != grpc.StatusCode.ALREADY_EXISTS][0] in (1, 2)  # STOP or LENGTH: it ran
    for _ in range(3):
        rid = new_rid("abort-now")
        call = stub.Generate(
            build_generate_request(
                "Tell me a long story.", max_new_tokens=500, temperature=0, ignore_eos=True, request_id=rid
            ),
            timeout=60,
        )
        try:
            # The call may not have reached modeld yet; once it has, an Abort must find it.
            deadline = time.monotonic() + 5
            while not c.abort(rid):
                assert time.monotonic() < deadline, "Abort never found a running request"
            assert [m for m in call][-1].complete.finish_reason == 3  # ABORT
        finally:
            call.cancel()


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "client", *args],
        capture_output=True,
        text=True,
        env=child_env(),
        cwd=REPO,
        timeout=timeout,
    )


def test_memd_lost_makes_modeld_unavailable_then_it_reattaches(default_model):
    with run_memd(default_model, *MEMD_ARGS, check_free=False) as memd:
        shm = [pathlib.Path("/dev/shm", name) for name in memd.shm_entries()]
        try:
            with (
                run_modeld(memd, "--target-model", str(default_model)) as modeld,
                client.Client(modeld.address, timeout=20, connect_timeout=5) as c,
            ):
                assert c.health() == "SERVING"
                in_flight = c.stream("Tell me a long story.", **LONG)
                chunks = iter(in_flight)
                next(chunks)

                memd.proc.send_signal(signal.SIGKILL)
                memd.proc.wait(timeout=10)

                # The stream that was running fails with UNAVAILABLE (it is not retried, having started).
                start = time.monotonic()
                with pytest.raises(client.Unavailable, match="memd"):
                    list(chunks)
                assert time.monotonic() - start < 10

                deadline = time.monotonic() + 5
                while c.health() != "NOT_SERVING" and time.monotonic() < deadline:
                    time.sleep(0.05)
                assert c.health() == "NOT_SERVING"

                start = time.monotonic()
                with pytest.raises(client.Unavailable, match="memd is unreachable"):
                    c.generate("hi", max_new_tokens=4, timeout=10)
                with pytest.raises(client.Unavailable, match="memd"):
                    c.capacity(timeout=10)
                assert time.monotonic() - start < 8  # the retries, not the deadline
                assert c.info(timeout=5)["vocab_size"] == 49152  # modeld itself still answers

                status = cli("--addr", modeld.address, "--memd", memd.address, "health", timeout=30)
                assert status.returncode == 1
                assert f"modeld {modeld.address}: NOT_SERVING" in status.stdout
                assert f"memd {memd.address}: UNAVAILABLE" in status.stdout

                # memd comes back at the same address, with a shorter context: modeld re-attaches, maps the new
                # pools, takes the new limits and serves.
                with run_memd(default_model, *MEMD_ARGS, "--context-length", "300", address=memd.address) as again:
                    deadline = time.monotonic() + 20
                    while c.health() != "SERVING" and time.monotonic() < deadline:
                        time.sleep(0.1)
                    assert c.health() == "SERVING", modeld.log_path.read_text()
                    before = c.generate("What is the capital of France?", chat=True, max_new_tokens=8, temperature=0)
                    assert before.completion_tokens > 0 and again.capacity().sessions == 1
                    [held] = again.capacity().session_holdings  # the re-attach names the model again
                    assert len(held.model_digest) == 16
                    repeat = c.generate("What is the capital of France?", chat=True, max_new_tokens=8, temperature=0)
                    assert repeat.cached_tokens > 0 and repeat.output_ids == before.output_ids
                    assert c.info()["context_len"] == 300
                    with pytest.raises(client.InvalidArgument, match="exceeds the context of 300"):
                        c.generate("hi", max_new_tokens=300)
                    modeld.send_signal(signal.SIGTERM)
                    assert modeld.wait(timeout=30) == 0, modeld.log_path.read_text()
            log = modeld.log_path.read_text()
            assert "memd session lost" in log and "re-attached to memd" in log and "modeld stopped" in log
            assert "heap frozen at start" in log and "heap frozen after the re-attach" in log
        finally:
            for path in shm:  # memd died without unlinking its segments
                path.unlink(missing_ok=True)


# ---- 9. the command line -----------------------------------------------------------------------


def test_cli_generate_json_and_health(daemons):
    memd, modeld, c = daemons
    prompt = "What is the capital of France?"
    out = cli(
        "--addr", modeld.address, "generate", prompt, "--chat", "--max-new-tokens", "16", "--temperature", "0", "--json"
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    expected = c.generate(prompt, chat=True, max_new_tokens=16, temperature=0)
    assert result["text"] == expected.text and result["text"].strip()
    assert result["output_ids"] == list(expected.output_ids)
    assert result["finish_reason"] == expected.finish_reason in ("stop", "length")
    assert result["completion_tokens"] == len(result["output_ids"]) and result["request_id"]

    status = cli("--addr", modeld.address, "--memd", memd.address, "health")
    assert status.returncode == 0, status.stdout + status.stderr
    assert status.stdout.splitlines() == [f"modeld {modeld.address}: SERVING", f"memd {memd.address}: SERVING"]

    bad = cli("--addr", modeld.address, "generate", "hi", "--temperature", "-1")
    assert bad.returncode == 1 and bad.stdout == ""
    assert bad.stderr.startswith("error: INVALID_ARGUMENT:") and "temperature" in bad.stderr
