"""A DFLASH draft split over two tensor-parallel ranks (modeld.model.tensor_parallel.shard_draft), each rank a process
of its own joined over gloo on the CPU: each rank's context K/V are the whole draft's at its own KV heads, and its
block forward over the context of its heads (all-reduced after each layer's attention and MLP) gives the whole
draft's hidden states (fp32)."""

import pathlib

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import AutoConfig

from modeld.model.tensor_parallel import TensorParallel, shard_draft
from modeld.spec.draft import load_draft
from modeld.spec.serving_draft import ServingDraft
from tests import tiny_models as tm

RANKS = 2
N, B, C = 2, 4, 11  # requests, block, context positions


def serving(folder: pathlib.Path, target: pathlib.Path, tp: TensorParallel | None) -> ServingDraft:
    draft = load_draft(str(folder), AutoConfig.from_pretrained(target), torch.float32, "cpu")
    return ServingDraft(draft if tp is None else shard_draft(draft, tp), 256)


def inputs(draft: ServingDraft, taps_width: int) -> dict:
    gen = torch.Generator().manual_seed(5)
    layers, kv_heads, hd = len(draft.layers), draft.kv_heads, draft.head_dim
    return dict(
        taps=torch.randn(N * C, taps_width, generator=gen),
        context_positions=torch.arange(N * C) % C,
        embeds=torch.randn(N, B, draft.config.hidden_size, generator=gen),
        positions=C + torch.arange(B).repeat(N, 1),
        ctx=[
            (torch.randn(N, C, kv_heads, hd, generator=gen), torch.randn(N, C, kv_heads, hd, generator=gen))
            for _ in range(layers)
        ],
        visible=torch.rand(N, B, C, generator=gen) > 0.3,
    )


def computed(draft: ServingDraft, x: dict, heads: slice) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(context K, context V, block hidden states) with the context of the given KV heads."""
    k, v = draft.context_kv_layers(x["taps"], x["context_positions"])
    contexts = [(ck[:, :, heads], cv[:, :, heads], x["visible"]) for ck, cv in x["ctx"]]
    return k, v, draft.block_hidden(x["embeds"], x["positions"], contexts)


def rank_main(rank: int, folder: str, target: str, rendezvous: str, results: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=RANKS)
    try:
        draft = serving(pathlib.Path(folder), pathlib.Path(target), TensorParallel(rank, RANKS))
        width = draft.fc.shape[1]
        whole_kv_heads = draft.kv_heads * RANKS
        x = inputs(serving(pathlib.Path(folder), pathlib.Path(target), None), width)  # the whole draft's inputs
        assert x["ctx"][0][0].shape[2] == whole_kv_heads
        torch.save(
            computed(draft, x, slice(rank * draft.kv_heads, (rank + 1) * draft.kv_heads)), f"{results}/r{rank}.pt"
        )
    finally:
        dist.destroy_process_group()


def test_draft_ranks_compute_the_whole_drafts_kv_and_hidden_states(tmp_path):
    target = tm.write_random_target(tmp_path / "target")
    folder = tm.write_draft(tmp_path / "draft", target, layers=2, block_size=B, sliding_window=16, std=0.2)
    whole = serving(folder, target, None)
    x = inputs(whole, whole.fc.shape[1])
    k, v, hidden = computed(whole, x, slice(None))
    mp.start_processes(
        rank_main,
        args=(str(folder), str(target), str(tmp_path / "rendezvous"), str(tmp_path)),
        nprocs=RANKS,
        start_method="spawn",
    )
    share = whole.kv_heads // RANKS
    for rank in range(RANKS):
        rank_k, rank_v, rank_hidden = torch.load(tmp_path / f"r{rank}.pt")
        heads = slice(rank * share, (rank + 1) * share)
        torch.testing.assert_close(rank_k, k[:, :, heads], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(rank_v, v[:, :, heads], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(rank_hidden, hidden, atol=1e-5, rtol=1e-5, msg=f"rank {rank}")
