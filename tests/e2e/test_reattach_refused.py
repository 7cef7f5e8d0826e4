"""A memd that answers but refuses the session (UNAVAILABLE "memd is shutting down": one stopping, its socket
still open) while modeld re-attaches, or while it starts: the re-attach keeps trying and attaches to the memd that
comes next; start-up tries until its deadline, then fails with memd's reason. Before, the refusal escaped the
re-attach and stopped the engine thread (a CI run caught it: the integration test that stops and starts memd)."""

import logging
import threading
import time
from concurrent import futures

import grpc
import pytest

from modeld.engine.memd_link import MemdLink, StartupError
from tests.daemons import link_to_a_stopped_memd, memd_args, run_memd
from tests.models import tiny_target


class Refusing(grpc.GenericRpcHandler):
    """Every call refused as a memd that is shutting down refuses a new session."""

    def __init__(self):
        self.refused = 0

    def service(self, handler_call_details):
        def refuse(request, context):
            self.refused += 1
            context.abort(grpc.StatusCode.UNAVAILABLE, "memd is shutting down")

        return grpc.unary_stream_rpc_method_handler(refuse)


def refusing_server(address: str) -> tuple[grpc.Server, Refusing]:
    handler = Refusing()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), handlers=[handler])
    server.add_insecure_port(address)
    server.start()
    return server, handler


def test_a_reattach_refused_by_a_stopping_memd_tries_again_and_attaches_to_the_next(tmp_path, caplog):
    target = tiny_target(tmp_path / "t")
    health: list[bool] = []
    link, address = link_to_a_stopped_memd(target, health)
    server, handler = refusing_server(address)
    stopped, attached = threading.Event(), []
    thread = threading.Thread(target=lambda: attached.append(link.reattach(stopped)))
    try:
        with caplog.at_level(logging.WARNING, logger="modeld"):
            thread.start()
            deadline = time.monotonic() + 20
            while handler.refused < 2:  # refused, and tried again
                assert time.monotonic() < deadline and thread.is_alive(), "the re-attach did not try again"
                time.sleep(0.05)
        assert any("refused the session (UNAVAILABLE: memd is shutting down)" in r.getMessage() for r in caplog.records)
        server.stop(None).wait()
        with run_memd(target, *memd_args(), address=address) as second:
            thread.join(timeout=30)
            assert attached == [True] and health == [True]
            assert second.capacity().sessions == 1
            link.close()
    finally:
        stopped.set()
        server.stop(None)
        thread.join(timeout=10)


def test_start_up_refused_by_a_stopping_memd_fails_with_its_reason(tmp_path):
    address = f"unix://{tmp_path / 'memd.sock'}"
    server, handler = refusing_server(address)
    try:
        begin = time.monotonic()
        with pytest.raises(StartupError, match="refused the session: UNAVAILABLE: memd is shutting down"):
            MemdLink(address, 2, lambda serving: None, writes_draft_kv=False)
        assert handler.refused >= 2, "start-up did not try again before its deadline"
        assert time.monotonic() - begin < 10
    finally:
        server.stop(None)
