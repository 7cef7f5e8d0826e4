"""Fake modelds for gateway tests that need no model: tests.client.fake_modeld's echo servicer on a Unix socket, with
a grpc.health status the test sets (SERVING at the start)."""

import contextlib
import shutil
import tempfile
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from protos import modeld_pb2_grpc
from tests.client.fake_modeld import FakeModeld

FAKE_MODEL = "fake-target"  # the model name the gateway serves a fake under (its GetInfo's target_model)


class FakeBackend:
    def __init__(self, address: str, servicer: FakeModeld, health_servicer: health.HealthServicer):
        self.address, self.servicer, self._health = address, servicer, health_servicer

    def set_serving(self, serving: bool) -> None:
        self._health.set(
            "", health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        )


@contextlib.contextmanager
def fake_modelds(count: int):
    """`count` fake modelds, each on its own socket in one fresh /tmp folder; yields their FakeBackends."""
    folder = tempfile.mkdtemp(prefix="gw-fake-", dir="/tmp")
    servers, backends = [], []
    try:
        for i in range(count):
            server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
            servicer, health_servicer = FakeModeld(), health.HealthServicer()
            modeld_pb2_grpc.add_ModeldServicer_to_server(servicer, server)
            health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
            address = f"unix://{folder}/fake-{i}.sock"
            server.add_insecure_port(address)
            server.start()
            servers.append(server)
            backends.append(FakeBackend(address, servicer, health_servicer))
            backends[-1].set_serving(True)
        yield backends
    finally:
        for server in servers:
            server.stop(grace=None)
        shutil.rmtree(folder, ignore_errors=True)
