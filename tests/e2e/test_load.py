"""A load test on the CPU: 64 concurrent streaming clients on a small pool, two rounds. Every greedy output equals
its solo run (whatever it was batched, queued or preempted with), health answers throughout, both daemons are idle
after each round, and modeld's memory is flat from one round to the next."""

import concurrent.futures
import pathlib
import threading
import time

import client
from tests.daemons import is_idle, run_memd, run_modeld

CLIENTS, MAX_NEW, ROUNDS = 64, 12, 2


def rss_kib(pid: int) -> int:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


class HealthWatch:
    """Polls health in a thread; keeps the slowest answer and anything but SERVING."""

    def __init__(self, c: client.Client):
        self.c, self.slowest, self.bad, self.stop = c, 0.0, [], threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self.stop.is_set():
            begin = time.monotonic()
            status = self.c.health(timeout=5)
            self.slowest = max(self.slowest, time.monotonic() - begin)
            if status != "SERVING":
                self.bad.append(status)
            time.sleep(0.05)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


def stream_all(c: client.Client, prompts: list[list[int]]) -> list[list[int]]:
    def one(ids):
        with c.stream(input_ids=ids, max_new_tokens=MAX_NEW, temperature=0, ignore_eos=True) as handle:
            streamed = [t for chunk in handle for t in chunk.token_ids]
        assert streamed == list(handle.result.output_ids)
        return streamed

    with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
        return list(pool.map(one, prompts))


def test_64_streaming_clients_on_a_small_pool(default_model, chat_ids):
    args = [
        "--page-size",
        "16",
        "--max-running-requests",
        "16",
        "--max-total-tokens",
        "768",
        "--draft-model",
        "none",
        "--kv-cache-dtype",
        "float32",
        "--strict",
    ]
    prompts = [chat_ids[i % len(chat_ids)] for i in range(CLIENTS)]
    with (
        run_memd(default_model, *args) as memd,
        run_modeld(memd, "--target-model", str(default_model), "--max-open-streams", str(CLIENTS)) as modeld,
        client.Client(modeld.address, timeout=600) as c,
    ):
        solo = {
            tuple(ids): list(
                c.generate(input_ids=ids, max_new_tokens=MAX_NEW, temperature=0, ignore_eos=True).output_ids
            )
            for ids in chat_ids
        }
        memory = []
        for _ in range(ROUNDS):
            with HealthWatch(c) as watch:
                outputs = stream_all(c, prompts)
            assert not watch.bad and watch.slowest < 2.0, (watch.bad, watch.slowest)
            assert outputs == [solo[tuple(ids)] for ids in prompts]
            assert is_idle(memd.wait_idle(timeout=5))
            assert c.capacity()["running_requests"] == 0
            memory.append(rss_kib(modeld.pid))
        assert memory[-1] <= memory[0] * 1.05 + 8192, f"modeld's memory grew across rounds: {memory} KiB"
