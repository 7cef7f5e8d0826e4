"""memd's table writes as a client's kernels see them. memd answers a call without waiting for the GPU; on CUDA it
records its tables-written event behind the call's scatters, and a client stream that waits on it before reading a
table reads what the reply told of. Call after call, with memd's writes racing the reads, a request's req_to_token
row read on the client's stream right after the reply holds exactly the reply's slots. Some calls write many more
entries than the others (memd's staging buffers grow between calls whose writes may still be queued)."""

import pytest
import torch

from memd.attach import MemdSession
from tests.daemons import memd_args, run_memd
from tests.models import tiny_target

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def read_row(table: torch.Tensor, event, row: int, start: int, n: int) -> list[int]:
    """The row's positions [start, start + n) as a kernel on the current stream reads them (after memd's event)."""
    if event is not None:
        torch.cuda.current_stream().wait_event(event)
    return table[row, start : start + n].clone().tolist()


@pytest.mark.parametrize("device", DEVICES)
def test_a_row_read_after_each_reply_holds_its_slots(tmp_path, device):
    target = tiny_target(tmp_path / "t")
    with run_memd(target, *memd_args(page=4), device=device) as memd:
        session = MemdSession(memd.address, "table-reader")
        try:
            pools = session.map()
            event = pools.get("tables_written")
            assert (event is not None) == (device == "cuda")  # shm tables need no event: visible at the reply
            table = pools["req_to_token"]
            previous = ()
            for i in range(40):
                rid, prompt = f"r{i}", 7 if i % 13 else 120 + 20 * i  # a long prompt now and then: many more writes
                first = session.alloc(extends=[(rid, 0, prompt)], finishes=previous).requests[0]
                assert read_row(table, event, first.row, 0, prompt) == list(first.target_slots)
                for _ in range(5):  # decode-sized grows: new pages every few positions, each written by memd
                    grown = session.alloc(grows=[(rid, 3)]).requests[0]
                    assert read_row(table, event, grown.row, grown.start, 3) == list(grown.target_slots)
                previous = [rid]
            session.free(finishes=previous)
        finally:
            session.close()
        cap = memd.wait_all_free()
        assert cap.target.free == cap.target.total
