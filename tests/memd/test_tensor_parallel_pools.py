"""memd with several tensor-parallel ranks (CPU, shared memory): one target and one draft pool per rank, each of the
model's KV heads / tp, sized by the same formula per rank; one slot allocator and one set of tables for them all;
Capacity per rank and in total; a session's holdings freed on every rank by one release."""

import pytest
import torch

from client.__main__ import main
from memd.attach import MemdSession
from memd.config import MemdConfig
from memd.plan import ConfigError, make_plan
from protos import memd_pb2
from tests.daemons import memd_args, run_memd
from tests.models import tiny_draft, tiny_target

RANKS = 2
BUDGET = 600_000  # bytes per rank


def sized(tmp_path, name: str, ranks: int, target_heads: int, draft_heads: int, ratio: float = 0.5):
    target = tiny_target(tmp_path / f"{name}-t", kv_heads=target_heads)
    draft = tiny_draft(tmp_path / f"{name}-d", kv_heads=draft_heads, window=32, block=4)
    args = memd_args(draft=draft, ratio=ratio, window=32, budget=BUDGET, max_running=2, chunk=16)
    return target, [*args, "--tensor-parallel-size", str(ranks)]


def capacity(session: MemdSession) -> memd_pb2.CapacityResponse:
    return session.stub.Capacity(memd_pb2.CapacityRequest(), timeout=5)


def test_each_rank_gets_its_share_of_the_heads_and_the_slots_of_one_rank_alone(tmp_path, capsys):
    target, args = sized(tmp_path, "tp", RANKS, target_heads=4, draft_heads=2)
    alone_target, alone_args = sized(tmp_path, "one", 1, target_heads=2, draft_heads=1)
    with run_memd(alone_target, *alone_args) as one, MemdSession(one.address, "one") as s:
        alone = s.layout
    with run_memd(target, *args) as memd, MemdSession(memd.address, "rank0") as s:
        layout = s.layout
        assert layout.tensor_parallel_size == RANKS
        # a rank holds half the heads, so the per-rank budget buys what one rank of half the heads buys
        assert (layout.target.kv_heads, layout.draft.kv_heads) == (2, 1)
        assert (layout.target.tokens, layout.draft.tokens) == (alone.target.tokens, alone.draft.tokens)
        assert layout.target.bytes == alone.target.bytes and layout.request_cap == alone.request_cap
        kv = sorted((d.name, d.rank) for d in layout.buffers if d.name.endswith("_kv"))
        assert kv == [("draft_kv", 0), ("draft_kv", 1), ("target_kv", 0), ("target_kv", 1)]
        assert all(d.shared for d in layout.buffers if not d.name.endswith("_kv"))
        cap = capacity(s)
        assert cap.tensor_parallel_size == RANKS
        t_total = cap.target.total
        assert cap.target.bytes_per_rank == layout.target.bytes and cap.target.bytes == RANKS * layout.target.bytes
        assert cap.draft.bytes == RANKS * cap.draft.bytes_per_rank == RANKS * layout.draft.bytes
        assert "2 tensor-parallel ranks" in memd.log()
        assert main(["--memd", memd.address, "capacity"]) == 0
        table = capsys.readouterr().out
        assert f"{'target':<8}{t_total:>10}" in table and "tensor-parallel ranks=2" in table


def test_ranks_map_their_own_kv_and_the_same_tables(tmp_path):
    target, args = sized(tmp_path, "tp", RANKS, target_heads=4, draft_heads=2)
    with (
        run_memd(target, *args) as memd,
        MemdSession(memd.address, "rank0") as s0,
        MemdSession(memd.address, "rank1") as s1,
    ):
        pools = [s0.map(0), s1.map(1)]
        t = s0.layout.target
        for rank_pools in pools:
            assert rank_pools["target_kv"].shape == (t.layers, 2, t.rows, 2, t.head_dim)
        pools[1]["target_kv"][0, 0, 5] = 7.0  # rank 1's K row of slot 5
        assert float(pools[0]["target_kv"][0, 0, 5].abs().sum()) == 0.0  # rank 0's is another buffer
        assert torch.equal(s0.map(1)["target_kv"], pools[1]["target_kv"])  # the same memory for every mapper
        pools[1]["target_kv"].zero_()
        held = s0.alloc(extends=[("a", 0, 12)]).requests[0]
        row = pools[1]["req_to_token"][held.row, :12]
        assert torch.equal(row, pools[0]["req_to_token"][held.row, :12])  # one table: the same slots everywhere
        assert row.tolist() == list(held.target_slots)
        assert capacity(s0).target.free == t.tokens - 12
        s0.close()  # the session goes without freeing: its slots come back for every rank at once
        assert capacity(s1).target.free == t.tokens
        with pytest.raises(ValueError, match="rank 2 is not one of memd's 2"):
            s1.map(2)


@pytest.mark.parametrize(
    "ranks,target_heads,draft_heads,message",
    [
        (3, 4, 2, "the target's 4 KV heads do not split evenly over 3"),
        (2, 4, 3, "the draft's 3 KV heads do not split evenly over 2"),
    ],
)
def test_heads_that_do_not_split_are_refused(tmp_path, ranks, target_heads, draft_heads, message):
    target = tiny_target(tmp_path / "t", kv_heads=target_heads)
    draft = tiny_draft(tmp_path / "d", kv_heads=draft_heads, window=32, block=4)
    cfg = MemdConfig(
        target_model=str(target), draft_model=str(draft), tensor_parallel_size=ranks, kv_budget_bytes=BUDGET
    )
    with pytest.raises(ConfigError, match=message):
        make_plan(cfg)


def test_several_cuda_ranks_are_refused_before_any_device_is_touched(tmp_path):
    cfg = MemdConfig(device="cuda", target_model=str(tiny_target(tmp_path / "t", kv_heads=4)), tensor_parallel_size=2)
    with pytest.raises(ConfigError, match="CPU .shared memory. only"):
        make_plan(cfg)


def test_zero_ranks_is_a_bad_value():
    with pytest.raises(ValueError, match="--tensor-parallel-size must be >= 1"):
        MemdConfig(tensor_parallel_size=0)
