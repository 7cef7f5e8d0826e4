"""The draft K/V that DFLASH leaves for committed tokens, read back from memd's draft pool through
req_to_token and the target->draft mapping, equals a direct computation from the target's tapped
hidden states (Hugging Face forward) and the draft's weights: fc, hidden_norm, k_proj + k_norm +
RoPE at the token's position, v_proj. Rows of uncommitted block positions are never written."""

import json

import torch
from safetensors.torch import load_file

from memd.attach import MemdSession
from modeld.model.causal_lm import ForwardBatch
from modeld.model.loader import load_target
from modeld.spec.draft import load_draft
from modeld.spec.worker import DflashWorker
from tests.daemons import memd_args, run_memd
from tests.tiny_models import load_hf, write_draft, write_random_target

TAPS = (1, 3)  # 3 is the last layer: HF's hidden_states[4] is the final norm's output


def rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def expected_kv(target_dir, draft_dir, ids: list[int], positions: list[int]):
    """Per draft layer, K and V rows [len(positions), kv_heads, head_dim], computed from scratch."""
    with torch.no_grad():
        states = load_hf(target_dir)(torch.tensor([ids]), output_hidden_states=True).hidden_states
    taps = torch.cat([states[i + 1][0] for i in TAPS], dim=-1)[positions]
    cfg = json.loads((draft_dir / "config.json").read_text())
    w = load_file(str(draft_dir / "model.safetensors"))
    eps, d = cfg["rms_norm_eps"], cfg["head_dim"]
    ctx = rms(taps @ w["fc.weight"].T, w["hidden_norm.weight"], eps)
    inv_freq = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, d, 2).float() / d))
    angles = torch.tensor(positions).float()[:, None] * inv_freq
    cos, sin = torch.cat([angles, angles], -1).cos()[:, None], torch.cat([angles, angles], -1).sin()[:, None]
    out = []
    for layer in range(cfg["num_hidden_layers"]):
        p = f"layers.{layer}.self_attn."
        k = rms((ctx @ w[p + "k_proj.weight"].T).unflatten(-1, (-1, d)), w[p + "k_norm.weight"], eps)
        k = k * cos + torch.cat([-k[..., d // 2 :], k[..., : d // 2]], -1) * sin
        out.append((k, (ctx @ w[p + "v_proj.weight"].T).unflatten(-1, (-1, d))))
    return out


def forward(model, pools, row, ids, start, slots, worker):
    t = lambda v: torch.tensor(v, dtype=torch.int64)  # noqa: E731
    n = len(ids)
    batch = ForwardBatch(
        t(ids),
        t(range(start, start + n)),
        t(slots),
        t([row]),
        t([start]),
        t([n]),
        t([start + n]),
        pools["req_to_token"],
    )
    return model(batch, pools["target_kv"], capture_layers=worker.taps)


def read_back(pools, row, positions, layer):
    slots = pools["target_to_draft"][pools["req_to_token"][row, positions].long()].long()
    assert (slots > 0).all(), "a committed position has no draft slot"
    return pools["draft_kv"][layer, 0][slots], pools["draft_kv"][layer, 1][slots]


def test_committed_draft_kv_equals_direct_computation(tmp_path):
    target = write_random_target(tmp_path / "t", vocab=128)
    draft = write_draft(tmp_path / "d", target, layers=2, block_size=4, target_layer_ids=TAPS, sliding_window=64)
    # a lookahead of 32: this budget's draft pool at ratio 0.5 holds no more (memd's default with a draft is 96)
    flags = memd_args(draft=draft, ratio=0.5, window=64, page=16, budget=2_000_000, lookahead=32)
    with run_memd(target, *flags) as memd:
        with MemdSession(memd.address, "draft-kv-test") as session:
            pools = session.map()
            model, _, cfg = load_target(str(target), "float32", "cpu")
            worker = DflashWorker(load_draft(str(draft), cfg, torch.float32, "cpu"), model, pools)
            prompt = torch.randint(0, 128, (21,), generator=torch.Generator().manual_seed(5)).tolist()
            got = session.alloc(extends=[("r", 0, len(prompt))]).requests[0]
            _, captured = forward(model, pools, got.row, prompt, 0, list(got.target_slots), worker)
            worker.write_context(captured, torch.arange(21), torch.tensor(list(got.target_slots)))
            for layer, (k, v) in enumerate(expected_kv(target, draft, prompt, list(range(21)))):
                rk, rv = read_back(pools, got.row, list(range(21)), layer)
                torch.testing.assert_close(rk, k, atol=1e-5, rtol=1e-5)
                torch.testing.assert_close(rv, v, atol=1e-5, rtol=1e-5)

            # A verified block of 4 at positions 21..24 of which 2 are committed.
            block = [prompt[-1] + 1, 7, 9, 11]
            grown = session.alloc(grows=[("r", 4)]).requests[0]
            _, captured = forward(model, pools, got.row, block, 21, list(grown.target_slots), worker)
            worker.write_committed(
                captured, torch.arange(21, 25), torch.tensor([list(grown.target_slots)]), torch.tensor([2])
            )
            for layer, (k, v) in enumerate(expected_kv(target, draft, prompt + block, [21, 22])):
                rk, rv = read_back(pools, got.row, [21, 22], layer)
                torch.testing.assert_close(rk, k, atol=1e-5, rtol=1e-5)
                torch.testing.assert_close(rv, v, atol=1e-5, rtol=1e-5)
                unwritten = read_back(pools, got.row, [23, 24], layer)
                assert not unwritten[0].any() and not unwritten[1].any(), "an uncommitted block row was written"
            session.free(commits=[("r", 23)], finishes=["r"])
