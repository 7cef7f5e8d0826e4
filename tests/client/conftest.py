import shutil
import tempfile

import pytest

from protos import memd_pb2_grpc, modeld_pb2_grpc
from tests.client.fake_modeld import FakeMemd, FakeModeld, serve


@pytest.fixture
def fake_modeld():
    """A FakeModeld, serving; its address is `fake_modeld.address`."""
    fake = FakeModeld()
    with serve(fake, modeld_pb2_grpc.add_ModeldServicer_to_server) as address:
        fake.address = address
        yield fake


@pytest.fixture
def memd_address():
    """Address of a serving FakeMemd."""
    with serve(FakeMemd(), memd_pb2_grpc.add_MemdServicer_to_server) as address:
        yield address


@pytest.fixture
def nowhere():
    """An address where nothing listens."""
    folder = tempfile.mkdtemp(prefix="cl-", dir="/tmp")
    yield f"unix://{folder}/none.sock"
    shutil.rmtree(folder, ignore_errors=True)
