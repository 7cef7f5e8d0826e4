"""modelds found by a DNS name (gateway.discovery, `--modeld dns:///HOST:PORT`): three fake modelds behind a name
whose answer the test changes. A new address becomes a backend that is polled and takes requests; one that leaves
its name takes no new request, keeps its open one until it ends, then is dropped and closed; one that comes back
before that serves again; indices are never reused; routing (least loaded, prefix affinity) runs over the live set.
The default resolver is the system's (localhost), and a malformed name is refused at start."""

import asyncio

import pytest

from gateway.backends import Backends
from gateway.config import config_from_args
from gateway.discovery import grpc_address, parse_name, resolve
from gateway.router import Router
from tests.gateway.fake_backends import FAKE_MODEL, fake_modelds

NAME = "dns:///modelds.default.svc:50051"


class ChangingName:
    """A resolver whose answer for NAME the test sets."""

    def __init__(self, addresses: list[str]):
        self.addresses, self.asked = list(addresses), 0

    async def __call__(self, host: str, port: int) -> list[str]:
        assert (host, port) == parse_name(NAME)
        self.asked += 1
        return list(self.addresses)


def live(backends: Backends) -> dict[str, int]:
    return {b.address: b.index for b in backends.all}


def test_replicas_join_drain_and_leave_with_their_name():
    with fake_modelds(3) as fakes:
        a, b, c = (f.address for f in fakes)

        async def scenario():
            name = ChangingName([a, b])
            backends = Backends((NAME,), 30.0, 0.05, 8, 5.0, resolver=name, resolve_interval=0.05)
            await backends.start()
            try:
                assert live(backends) == {a: 0, b: 1}
                assert [x.address for x in backends.serving(FAKE_MODEL)] == [a, b]

                name.addresses = [a, b, c]  # a third replica: polled, then it takes requests
                await backends.resolve_names()
                await backends.poll()
                assert live(backends) == {a: 0, b: 1, c: 2}
                router = Router(block_chars=8, max_entries=64, max_imbalance=0)
                for backend in backends.all[:2]:
                    backend.reported_load = 5
                assert router.pick("a new prompt", backends.serving(FAKE_MODEL)).address == c  # least loaded

                held = backends.all[1]  # b holds an open request when its pod goes
                await held.admission.enter()
                name.addresses = [a, c]
                await backends.resolve_names()
                assert held.draining and not held.ready and b in live(backends)
                assert [x.address for x in backends.serving(FAKE_MODEL)] == [a, c]
                held.admission.leave(0.1)  # its request ends: the next resolution drops it
                await backends.resolve_names()
                assert live(backends) == {a: 0, c: 2}

                name.addresses = [a, c, b]  # b's address comes back: a new backend, a new index
                await backends.resolve_names()
                await backends.poll()
                assert live(backends) == {a: 0, c: 2, b: 3}

                draining = backends.all[0]
                await draining.admission.enter()
                name.addresses = [c, b]
                await backends.resolve_names()
                assert draining.draining
                name.addresses = [a, c, b]  # back before it drained: it serves again
                await backends.resolve_names()
                assert not draining.draining and draining.ready and live(backends) == {a: 0, c: 2, b: 3}
                draining.admission.leave(0.1)

                asked = name.asked
                await asyncio.sleep(0.5)  # the poller resolves the name again on its own
                assert name.asked > asked
            finally:
                await backends.close()

        asyncio.run(scenario())


def test_prefix_affinity_never_follows_a_dropped_backends_index():
    with fake_modelds(2) as fakes:
        a, b = (f.address for f in fakes)

        async def scenario():
            name = ChangingName([a, b])
            backends = Backends((NAME,), 30.0, 0.05, 8, 5.0, resolver=name, resolve_interval=60.0)
            await backends.start()
            try:
                router = Router(block_chars=8, max_entries=64, max_imbalance=4)
                prompt = "the same long shared prefix of a conversation"
                first = router.pick(prompt, backends.serving(FAKE_MODEL))
                name.addresses = [x for x in (a, b) if x != first.address]
                await backends.resolve_names()
                assert first not in backends.all
                again = router.pick(prompt, backends.serving(FAKE_MODEL))
                assert again.address != first.address and again.index != first.index
            finally:
                await backends.close()

        asyncio.run(scenario())


def test_the_system_resolver_answers_localhost():
    assert "127.0.0.1:50051" in asyncio.run(resolve("localhost", 50051))
    assert asyncio.run(resolve("no-such-host.invalid", 50051)) == []
    assert grpc_address("::1", 7) == "[::1]:7"


@pytest.mark.parametrize("bad", ["dns:///nohost", "dns:///host:0", "dns:///host:port", "dns:///:50051"])
def test_a_malformed_name_is_refused_at_start(bad):
    with pytest.raises(ValueError, match="dns:///HOST:PORT"):
        config_from_args(["--modeld", bad])


def test_a_name_and_addresses_mix():
    cfg = config_from_args(["--modeld", NAME, "--modeld", "127.0.0.1:50052"])
    assert cfg.modelds == (NAME, "127.0.0.1:50052")
