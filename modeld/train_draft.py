"""Train a DFLASH draft for a target, and save it in the z-lab format modeld loads.

The recipe (see the shared draft-training notes): the target is frozen; for random anchors a in
the response part of each training sequence, the block [x_a, mask x (B-1)] at positions a..a+B-1
sees the draft K/V of the context positions before a (within the sliding window, per query: t - p
< window) and itself (bidirectional), exactly as modeld's draft forward does at inference; block
position k is trained to predict x_{a+k}, weighted exp(-(k-1)/gamma). The context K/V comes from
the target's tapped hidden states through fc + hidden_norm and each layer's k_proj/v_proj, with
gradients. Data: JSON lines {"ids": [...], "response_start": n}, e.g. the target's own answers
(python -m modeld.draft_data).

    python -m modeld.train_draft --target DIR --data seqs.jsonl --out DIR [--device cuda] [--steps 4000]
"""

import argparse
import json
import math
import pathlib
import random
import sys
import time
from dataclasses import dataclass

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, Qwen3Config

from modeld.draft import DFlashDraft, read_spec


@dataclass(frozen=True)
class TrainConfig:
    layers: int = 4
    block: int = 16
    window: int = 256
    taps: tuple[int, ...] = (1, 10, 18, 27)
    mask_token_id: int = 16
    intermediate: int = 1536
    steps: int = 4000
    batch: int = 32
    anchors: int = 24
    lr: float = 6e-4
    gamma: float = 7.0
    seed: int = 0
    max_seconds: float = float("inf")  # stop early (and save) after this long; the schedule stays that of `steps`


def draft_config(target_cfg, tc: TrainConfig) -> dict:
    """config.json of the draft (z-lab format), Qwen3 layers at the target's attention geometry."""
    head_dim = getattr(target_cfg, "head_dim", None) or target_cfg.hidden_size // target_cfg.num_attention_heads
    theta = (getattr(target_cfg, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
    return {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "torch_dtype": "bfloat16",
        "hidden_size": target_cfg.hidden_size, "intermediate_size": tc.intermediate, "num_hidden_layers": tc.layers,
        "num_attention_heads": target_cfg.num_attention_heads, "num_key_value_heads": target_cfg.num_key_value_heads,
        "head_dim": head_dim, "hidden_act": "silu", "attention_bias": False, "rms_norm_eps": target_cfg.rms_norm_eps,
        "rope_theta": theta, "rope_parameters": {"rope_theta": theta, "rope_type": "default"},
        "max_position_embeddings": target_cfg.max_position_embeddings, "vocab_size": target_cfg.vocab_size,
        "tie_word_embeddings": False, "layer_types": ["sliding_attention"] * tc.layers, "sliding_window": tc.window,
        "use_sliding_window": True, "is_causal": False, "block_size": tc.block,
        "num_target_layers": target_cfg.num_hidden_layers,
        "dflash_config": {"block_size": tc.block, "target_layer_ids": list(tc.taps), "mask_token_id": tc.mask_token_id,
                          "causal": False},
    }


def new_draft(config: dict, target_cfg, device: str) -> DFlashDraft:
    cfg = Qwen3Config(**{k: v for k, v in config.items() if k not in ("architectures", "model_type")})
    with torch.device(device):
        draft = DFlashDraft(cfg, read_spec(cfg, config, None), target_cfg.hidden_size).float()
    gen = torch.Generator(device="cpu").manual_seed(0)
    with torch.no_grad():
        for name, p in draft.named_parameters():
            p.copy_(torch.ones_like(p) if name.endswith("norm.weight") else torch.randn(p.shape, generator=gen) * 0.02)
    return draft


def pick_anchors(seqs: list[dict], count: int, block: int, rng: random.Random) -> list[tuple[int, int]]:
    """(sequence, anchor) pairs with the whole block inside the response."""
    out = []
    for s, seq in enumerate(seqs):
        lo, hi = max(1, seq["response_start"] - 1), len(seq["ids"]) - block
        if hi >= lo:
            out += [(s, rng.randint(lo, hi)) for _ in range(count)]
    return out


def block_loss(draft: DFlashDraft, target, seqs: list[dict], anchors: list[tuple[int, int]], tc: TrainConfig,
               device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Weighted cross-entropy of the blocks at `anchors`, and the draft's greedy predictions [A, B-1]."""
    width = max(len(s["ids"]) for s in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long, device=device)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, : len(s["ids"])] = torch.tensor(s["ids"])
        mask[i, : len(s["ids"])] = 1
    with torch.no_grad():
        states = target(ids, attention_mask=mask, output_hidden_states=True).hidden_states
        taps = torch.cat([states[i + 1] for i in tc.taps], dim=-1).float()
    positions = torch.arange(width, device=device).expand(len(seqs), -1)
    ctx = draft.context_kv(taps.flatten(0, 1), positions.flatten())  # per layer [S * T, kv_heads, head_dim]
    seq_of = torch.tensor([s for s, _ in anchors], device=device)
    anchor = torch.tensor([a for _, a in anchors], device=device)
    offsets = torch.arange(tc.block, device=device)
    block_pos = anchor[:, None] + offsets
    block_ids = torch.full_like(block_pos, tc.mask_token_id)
    block_ids[:, 0] = ids[seq_of, anchor]
    contexts, cache = [], {}
    for layer, window in enumerate(draft.spec.windows):
        if window not in cache:
            span = (window - 1) if window is not None else int(anchor.max())
            pos = anchor[:, None] - span + torch.arange(span, device=device)
            valid = pos >= 0
            rows = seq_of[:, None] * width + pos.clamp(min=0)
            visible = valid[:, None, :].expand(-1, tc.block, -1)
            if window is not None:
                visible = visible & (block_pos[:, :, None] - pos[:, None, :] < window)
            cache[window] = (rows, valid, visible)
        rows, valid, visible = cache[window]
        k, v = ctx[layer]
        keep = valid[:, :, None, None]
        contexts.append((torch.where(keep, k[rows], 0), torch.where(keep, v[rows], 0), visible))
    with torch.no_grad():
        embeds = target.get_input_embeddings()(block_ids).float()
    hidden = draft.block_hidden(embeds, block_pos, contexts)[:, 1:]
    logits = target.lm_head(hidden.to(target.lm_head.weight.dtype)).float()
    labels = ids[seq_of[:, None], block_pos[:, 1:]]
    weights = torch.exp(-(offsets[1:] - 1) / tc.gamma).expand_as(labels)
    losses = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none").view_as(labels)
    return (losses * weights).sum() / weights.sum(), logits.argmax(-1)


def accept_length(predictions: torch.Tensor, seqs, anchors, block: int) -> float:
    """Mean tokens per verify step (bonus included) if the sequences are the target's greedy output:
    1 + the leading block predictions that equal the sequence."""
    labels = torch.stack([torch.tensor(seqs[s]["ids"][a + 1 : a + block]) for s, a in anchors]).to(predictions.device)
    return float((1 + (predictions == labels).long().cumprod(-1).sum(-1)).float().mean())


def save_draft(draft: DFlashDraft, config: dict, out: pathlib.Path, dtype=torch.bfloat16) -> None:
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(dtype).contiguous().cpu() for k, v in draft.state_dict().items() if "rotary" not in k}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def train(target, seqs: list[dict], tc: TrainConfig, device: str, log=print) -> tuple[DFlashDraft, dict, list[float]]:
    config = draft_config(target.config, tc)
    draft = new_draft(config, target.config, device)
    opt = torch.optim.AdamW(draft.parameters(), lr=tc.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 100) * 0.5 * (1 + math.cos(math.pi * s / tc.steps)))
    rng = random.Random(tc.seed)
    losses, begin = [], time.time()
    for step in range(tc.steps):
        batch = rng.sample(seqs, min(tc.batch, len(seqs)))
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=device == "cuda"):
            loss, _ = block_loss(draft, target, batch, pick_anchors(batch, tc.anchors, tc.block, rng), tc, device)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if step % max(1, tc.steps // 20) == 0 or step == tc.steps - 1:
            log(f"step {step}: loss {losses[-1]:.4f} ({time.time() - begin:.0f} s)")
        if time.time() - begin > tc.max_seconds:
            log(f"stopped at step {step} of {tc.steps}: --max-seconds {tc.max_seconds} reached")
            break
    return draft, config, losses


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m modeld.train_draft", description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True)
    p.add_argument("--data", required=True, help="JSON lines {ids, response_start}")
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    for field, value in vars(TrainConfig()).items():
        kind = (lambda s: tuple(int(x) for x in s.split(","))) if isinstance(value, tuple) else type(value)
        p.add_argument(f"--{field.replace('_', '-')}", type=kind, default=value)
    args = p.parse_args(argv)
    tc = TrainConfig(**{f: getattr(args, f) for f in vars(TrainConfig())})
    seqs = [json.loads(line) for line in open(args.data) if line.strip()]
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=dtype).to(args.device).eval().requires_grad_(False)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    draft, config, _ = train(target, seqs, tc, args.device, log)
    save_draft(draft, config, pathlib.Path(args.out))
    log(f"saved to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
