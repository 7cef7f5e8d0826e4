"""A target split over two tensor-parallel ranks (modeld.model.tensor_parallel), each rank a process of its own
joined over gloo on the CPU: every rank's logits equal the whole model's (fp32), over paged pools of the rank's KV
heads laid out alike, for a prefill and the greedy decode steps after it; Llama, Qwen2 (q|k|v biases) and Qwen3
(q/k norms), with biases on the row-parallel projections too."""

import pathlib

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import LlamaConfig, Qwen2Config, Qwen3Config

from modeld.model.loader import load_target
from modeld.model.tensor_parallel import TensorParallel, shard_config
from tests.modeld.runner.paged import PagedPools

RANKS = 2
PROMPTS = [[5, 17, 3, 44, 9, 60, 2], [71, 8, 30, 1, 12]]
DECODE_STEPS = 6
SIZES = dict(
    vocab_size=97,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    tie_word_embeddings=False,
)
CONFIGS = {
    "llama": lambda: LlamaConfig(attention_bias=True, mlp_bias=True, **SIZES),
    "qwen2": lambda: Qwen2Config(**SIZES),
    "qwen3": lambda: Qwen3Config(head_dim=8, **SIZES),
}


def tiny(folder: pathlib.Path, family: str) -> pathlib.Path:
    CONFIGS[family]().save_pretrained(folder)
    return folder


def greedy_logits(model) -> list[torch.Tensor]:
    """Logits of a prefill of both prompts, then of DECODE_STEPS greedy steps of both requests."""
    pools = PagedPools(model.config, pages=48, page_size=4, seed=3)  # the same scattered pages on every rank
    parts = [(row + 1, ids) for row, ids in enumerate(PROMPTS)]
    out = []
    for _ in range(DECODE_STEPS + 1):
        batch = pools.batch(parts)
        hidden, _ = model(batch, pools.kv)
        logits = model.logits(hidden)
        out.append(logits)
        last = torch.cumsum(batch.q_lens, 0) - 1
        parts = [(row, [int(logits[i].argmax())]) for (row, _), i in zip(parts, last.tolist())]
    return out


def rank_main(rank: int, folder: str, rendezvous: str, results: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=RANKS)
    try:
        torch.manual_seed(0)
        model, _, _ = load_target(folder, "float32", "cpu", "dummy", tensor_parallel=TensorParallel(rank, RANKS))
        assert model.config.num_key_value_heads == 1  # the rank's share of the pool's heads
        torch.save(greedy_logits(model), f"{results}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_ranks_compute_the_whole_models_logits(tmp_path, family):
    folder = tiny(tmp_path / "model", family)
    whole, _, _ = load_target(str(folder), "float32", "cpu", "dummy")
    expected = greedy_logits(whole)
    mp.start_processes(
        rank_main, args=(str(folder), str(tmp_path / "rendezvous"), str(tmp_path)), nprocs=RANKS, start_method="spawn"
    )
    for rank in range(RANKS):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert len(got) == len(expected)
        for step, (ours, theirs) in enumerate(zip(got, expected)):
            torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5, msg=f"rank {rank}, step {step}")


def test_heads_that_do_not_split_are_refused():
    with pytest.raises(ValueError, match="num_key_value_heads 3 does not split over 2 ranks"):
        shard_config(LlamaConfig(hidden_size=48, num_attention_heads=6, num_key_value_heads=3, intermediate_size=64), 2)
