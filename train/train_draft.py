"""Train a DFLASH draft for a target the way the DFlash paper trains (section 5, appendix A.1), and save it
in the z-lab format modeld loads (modeld/spec/draft.py, unchanged).

    python -m train.train_draft --prompts DIR --responses DIR[,DIR] --out DIR --ckpt FILE [--target DIR]
        [--epochs 6] [--max-len 2048] [--anchors 512] [--batch-anchors 8192] [--time-budget S [--paced]] [--resume]
        [--init DRAFT]

The recipe and what this does with it:
- Draft: --layers 5 Qwen3-style layers at the target's attention geometry (hidden 576, 9 heads, 3 KV heads,
  head_dim 64, intermediate 1536 for SmolLM2-135M); block 16; 5 target taps spread evenly from layer 2 to the
  third-to-last (`build_target_layer_ids`: [1, 8, 14, 20, 27] for 30 layers); the taps concatenated -> fc ->
  RMSNorm (hidden_norm) become context K/V in every draft layer (DFlashDraft.context_kv); embeddings and LM
  head are the target's, frozen (the draft has none of its own).
- Attention: exactly the inference pattern (train.block_loss, tested against the serving module's per-anchor
  path): a block sees the context strictly before its anchor within the sliding window (per query: t - p <
  window) and itself bidirectionally. Every block of a batch is one draft forward: flex attention over the
  context K/V projected once per position and the blocks' own K/V, under a block-sparse mask
  (train.block_layout), so no anchor copies its context window. The draft's layers slide (window 256 by
  default) because modeld's bounded draft KV pool and its captured propose graphs need every layer to slide; a
  135M target's chats are short (most sequences < 1K tokens), and the taps carry the long context anyway.
- Anchors: --anchors 512 random anchor positions per sequence, re-sampled every epoch (the generator is seeded
  by (seed, epoch, sequence), so a resumed run draws the same). An anchor a and a + 1 lie in one of the target's
  answers (the first generated token onwards: at inference the block starts at the last committed token);
  block position k predicts the token at a + k; positions past the answer or the sequence weigh nothing. A
  135M target's answers are a few hundred tokens, fewer than 512, so in practice every valid position is an
  anchor once per epoch; --anchors lower than that trades data per epoch for time. An answer that ends in a
  repetition loop is anchored only --loop-repeats (2) periods into it (train.loops: 33 % of the answer tokens
  of the first 73,642 answers lay past that point, copies a draft predicts anyway); its labels still run to its end.
  --source-weights sharegpt=3 counts each answer to a ShareGPT prompt three times an epoch (each copy its own
  draw of anchors): the answers most like the held-out requests can weigh more than the templated ones.
- Loss: cross-entropy weighted exp(-(k-1)/gamma), gamma 7 for block 16 (4 for block 8, 5 for block 10), through
  the frozen LM head in chunks (train.head_loss: the full logits never exist).
- The target runs without its LM head over the sequences (its hidden states are all the taps need).
- Optimiser: AdamW lr 6e-4 (no weight decay), cosine schedule with 4 % linear warm-up, gradient clip 1.0,
  --epochs (6 in the paper), sequences cut at --max-len (3,072 in the paper; 2,048 by default here: longer
  ones are rare for this target). fp32 master weights, bf16 autocast on CUDA (a bf16-only run learned more
  slowly in the first experiment, see the draft-training notes); the fused AdamW on CUDA.
- Batches: sequences in a seeded per-epoch order, packed in length order within windows of SORT_WINDOW
  sequences until --batch-anchors blocks or --batch-tokens tokens, the batches then shuffled. On CUDA every
  step is padded to those two budgets, so that the compiled attention is compiled once.
- Resumable: --ckpt holds the draft, the optimiser, the schedule, the step and the data position (epoch,
  batch); --resume continues from it and gives the same next step as a run that never stopped. It is written
  every --save-every steps, at --time-budget and at the end; each save also exports the bf16 draft to --out.
- Size: the bf16 draft must stay under --max-draft-mb (40 MB): checked from the config before training starts
  and on the written file.
"""

import argparse
import dataclasses
import json
import math
import os
import pathlib
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch
from safetensors.torch import save_file
from torch.profiler import record_function
from transformers import Qwen3Config

from modeld.spec.draft import DFlashDraft, read_spec
from train.batches import epoch_batches, fingerprint, load_sequences, sample_anchors, weighted
from train.block_loss import block_loss
from train.target_taps import check_supported


class DraftTooLarge(ValueError):
    pass


@dataclass(frozen=True)
class TrainConfig:
    layers: int = 5
    block: int = 16
    window: int = 256
    taps: tuple[int, ...] = ()  # () = build_target_layer_ids(target layers, layers)
    mask_token_id: int = 16
    intermediate: int = 0  # 0 = the target's
    epochs: int = 6
    max_len: int = 2048
    anchors: int = 512
    batch_anchors: int = 8192
    batch_tokens: int = 16384  # sequence tokens a step at most (the target's forward and the context rows)
    lr: float = 6e-4
    warmup: float = 0.04
    gamma: float = 7.0
    loop_repeats: int = 2  # anchors stop this many periods into a repetition loop (train.loops; 0: anchor everywhere)
    source_weights: str = ""  # "sharegpt=3,...": each answer to such a prompt counts this many times an epoch
    clip: float = 1.0
    seed: int = 0
    max_draft_mb: float = 40.0

    def __post_init__(self):
        if self.batch_tokens < self.max_len:
            raise ValueError(f"batch_tokens ({self.batch_tokens}) must hold a sequence of max_len ({self.max_len})")
        if self.anchors > self.batch_anchors:
            raise ValueError(
                f"anchors per sequence ({self.anchors}) must fit a step's batch_anchors ({self.batch_anchors})"
            )
        self.weights()  # refuses a malformed --source-weights before anything runs

    def weights(self) -> dict[str, int]:
        """source_weights as {prompt source: times an epoch} (every other source once)."""
        out = {}
        for item in filter(None, self.source_weights.split(",")):
            name, _, times = item.partition("=")
            if not name or not times.isdigit() or int(times) < 1:
                raise ValueError(f"source weights are name=N with N >= 1, comma-separated; got {item!r}")
            out[name] = int(times)
        return out


def build_target_layer_ids(target_layers: int, count: int) -> list[int]:
    """`count` layers spread evenly from the second (index 1) to the third-to-last (the reference rule)."""
    if count == 1:
        return [target_layers // 2]
    return [round(1 + i * (target_layers - 4) / (count - 1)) for i in range(count)]


def draft_config(target_cfg, tc: TrainConfig) -> dict:
    """config.json of the draft (z-lab format), Qwen3 layers at the target's attention geometry."""
    head_dim = getattr(target_cfg, "head_dim", None) or target_cfg.hidden_size // target_cfg.num_attention_heads
    rope = getattr(target_cfg, "rope_parameters", None) or {}
    theta = rope.get("rope_theta", getattr(target_cfg, "rope_theta", 10000.0))
    taps = list(tc.taps) or build_target_layer_ids(target_cfg.num_hidden_layers, tc.layers)
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "torch_dtype": "bfloat16",
        "hidden_size": target_cfg.hidden_size,
        "intermediate_size": tc.intermediate or target_cfg.intermediate_size,
        "num_hidden_layers": tc.layers,
        "num_attention_heads": target_cfg.num_attention_heads,
        "num_key_value_heads": target_cfg.num_key_value_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "attention_bias": False,
        "rms_norm_eps": target_cfg.rms_norm_eps,
        "rope_theta": theta,
        "rope_parameters": {"rope_theta": theta, "rope_type": "default"},
        "max_position_embeddings": target_cfg.max_position_embeddings,
        "vocab_size": target_cfg.vocab_size,
        "tie_word_embeddings": False,
        "layer_types": ["sliding_attention"] * tc.layers,
        "sliding_window": tc.window,
        "use_sliding_window": True,
        "is_causal": False,
        "block_size": tc.block,
        "num_target_layers": target_cfg.num_hidden_layers,
        "dflash_config": {
            "block_size": tc.block,
            "target_layer_ids": taps,
            "mask_token_id": tc.mask_token_id,
            "causal": False,
        },
    }


def draft_bytes(config: dict, target_hidden: int, bytes_per_param: int = 2) -> int:
    """The size of the draft's weights in bf16 (what model.safetensors holds, less its small header)."""
    h, i, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    q, kv = config["num_attention_heads"] * config["head_dim"], config["num_key_value_heads"] * config["head_dim"]
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * i + 2 * h + 2 * config["head_dim"]
    fc = len(config["dflash_config"]["target_layer_ids"]) * target_hidden * h
    return bytes_per_param * (layers * per_layer + fc + 2 * h)


def check_size(config: dict, target_hidden: int, max_mb: float) -> int:
    size = draft_bytes(config, target_hidden)
    if size > max_mb * 1e6:
        raise DraftTooLarge(
            f"the draft would be {size / 1e6:.1f} MB in bf16, over the {max_mb:g} MB limit "
            f"({config['num_hidden_layers']} layers, intermediate {config['intermediate_size']})"
        )
    return size


def new_draft(config: dict, target_cfg, device: str) -> DFlashDraft:
    cfg = Qwen3Config(**{k: v for k, v in config.items() if k not in ("architectures", "model_type")})
    with torch.device(device):
        draft = DFlashDraft(cfg, read_spec(cfg, config, None), target_cfg.hidden_size).float()
    gen = torch.Generator(device="cpu").manual_seed(0)
    with torch.no_grad():
        for name, p in draft.named_parameters():
            p.copy_(torch.ones_like(p) if name.endswith("norm.weight") else torch.randn(p.shape, generator=gen) * 0.02)
    return draft


# --- the loss (train.block_loss) ----------------------------------------------------------------------------------


def accept_length(predictions: torch.Tensor, seqs, anchors, block: int, weights: torch.Tensor | None = None) -> float:
    """Mean tokens per verify step (bonus included) if the sequences are the target's greedy output:
    1 + the leading block predictions that equal the sequence (a label of weight 0 ends the run)."""
    labels = []
    for s, a in zip(seqs, anchors):
        for x in np.asarray(a).tolist():
            row = list(np.asarray(s["ids"][x + 1 : x + block]))
            labels.append(row + [-1] * (block - 1 - len(row)))
    labels = torch.tensor(labels, device=predictions.device)
    hit = predictions == labels
    if weights is not None:
        hit &= weights > 0
    return float((1 + hit.long().cumprod(-1).sum(-1)).float().mean())


# --- training ---------------------------------------------------------------------------------------------------------


def lr_factor(step: int, total: int, warmup: float) -> float:
    """Linear warm-up over the first `warmup` of the steps, then cosine to 0."""
    w = max(1, round(warmup * total))
    if step < w:
        return (step + 1) / w
    return 0.5 * (1 + math.cos(math.pi * (step - w) / max(1, total - w)))


def paced_factor(done: float, warmup: float) -> float:
    """lr_factor over a fraction `done` of a time budget: linear warm-up over the first `warmup` of it, then cosine
    to 0 at its end."""
    if done < warmup:
        return done / warmup
    return 0.5 * (1 + math.cos(math.pi * min(1.0, (done - warmup) / (1 - warmup))))


def save_draft(draft: DFlashDraft, config: dict, out: pathlib.Path, max_mb: float = 40.0, dtype=torch.bfloat16) -> int:
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(dtype).contiguous().cpu() for k, v in draft.state_dict().items() if "rotary" not in k}
    tmp = out / ".model.safetensors.tmp"
    save_file(state, str(tmp), metadata={"format": "pt"})
    size = tmp.stat().st_size
    if size > max_mb * 1e6:
        tmp.unlink()
        raise DraftTooLarge(f"model.safetensors would be {size / 1e6:.1f} MB, over {max_mb:g} MB")
    os.replace(tmp, out / "model.safetensors")
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return size


def load_weights(draft: DFlashDraft, config: dict, folder: pathlib.Path) -> None:
    """A saved draft's weights into `draft` (fp32 master copies of the bf16 file); refused if its config differs."""
    from safetensors.torch import load_file

    saved = json.loads((folder / "config.json").read_text())
    if saved != config:
        changed = sorted(k for k in set(saved) | set(config) if saved.get(k) != config.get(k))
        raise ValueError(f"{folder} was trained with other settings ({', '.join(changed)}): it cannot start this run")
    state = {k: v.float() for k, v in load_file(str(folder / "model.safetensors")).items()}
    missing, unexpected = draft.load_state_dict(state, strict=False)
    missing = [k for k in missing if "rotary" not in k]
    if missing or unexpected:
        raise ValueError(f"{folder}: missing {missing}, unexpected {unexpected}")


@dataclass
class State:
    step: int = 0
    epoch: int = 0
    batch: int = 0  # index of the next batch within the epoch
    losses: list = dataclasses.field(default_factory=list)
    seconds: float = 0.0  # training seconds of every call so far (a paced schedule's clock)


def write_log(path: pathlib.Path, tc: TrainConfig, state: State, **extra) -> None:
    """A run's settings, how far it went and every step's loss (a resumed run's earlier calls included), as JSON."""
    path.write_text(
        json.dumps(
            {
                "settings": dataclasses.asdict(tc),
                **extra,
                "steps": state.step,
                "epoch": state.epoch,
                "seconds": round(state.seconds, 1),
                "losses": state.losses,
            }
        )
    )


def save_checkpoint(path: pathlib.Path, draft, opt, state: State, tc: TrainConfig, data: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name("." + path.name + ".tmp")
    torch.save(
        {
            "draft": draft.state_dict(),
            "opt": opt.state_dict(),
            "state": dataclasses.asdict(state),
            "config": dataclasses.asdict(tc),
            "data": data,
        },
        tmp,
    )
    os.replace(tmp, path)


def train(
    target,
    seqs: list[dict],
    tc: TrainConfig,
    device: str,
    log=print,
    ckpt: pathlib.Path | None = None,
    resume: bool = False,
    out: pathlib.Path | None = None,
    time_budget: float = float("inf"),
    max_steps: int | None = None,
    save_every: int = 500,
    init: pathlib.Path | None = None,
    step_ends: list[float] | None = None,
    paced: bool = False,
    schedule_seconds: float | None = None,
) -> tuple[DFlashDraft, dict, State]:
    """Train (or continue, with `resume` and an existing `ckpt`) until the epochs are done, `time_budget`
    seconds have passed, or `max_steps` steps were taken in this call; saves `ckpt` and `out` at the end.
    `paced`: the schedule follows the clock instead of the steps: warm-up and cosine over `schedule_seconds` of
    training (by default, or 0, what earlier calls of the run trained, `State.seconds`, plus this call's
    `time_budget`: the schedule ends annealed when this call does, the last call of a run that ran slower or
    faster than planned), the epochs going on (each a new draw of anchors) until it is
    spent, so that a run whose steps were timed wrong still ends annealed, on time (train.fit_budget). A paced
    run resumed from its checkpoint goes on with the schedule where the last call left it (its clock is
    State.seconds; the data position is the checkpoint's): one schedule over several device calls, each ending
    with a checkpoint, the last one annealed.
    `init`: a saved draft (save_draft's folder, same settings) whose weights replace the random start; the
    optimiser and the schedule start afresh (how a later session continues from the weights that came back,
    when the checkpoint, optimiser included, is too large to). `step_ends`: the monotonic time at which each
    step of this call was queued is appended to it, and the last one's is the time the device finished it.
    The host reads a step's loss only when it logs or saves (reading one waits for the device), so that it
    prepares and queues the next step while the device runs this one."""
    check_supported(target)
    seqs = weighted(seqs, tc.weights())
    config = draft_config(target.config, tc)
    size = check_size(config, target.config.hidden_size, tc.max_draft_mb)
    draft = new_draft(config, target.config, device)
    if init is not None and not (resume and ckpt is not None and ckpt.exists()):
        load_weights(draft, config, init)
        log(f"weights from {init}")
    opt = torch.optim.AdamW(
        draft.parameters(), lr=tc.lr, betas=(0.9, 0.95), weight_decay=0.0, fused=device.startswith("cuda")
    )
    plans = {e: epoch_batches(seqs, tc, e) for e in range(tc.epochs)}
    total = sum(map(len, plans.values()))  # the steps of tc.epochs (a paced run takes what its budget allows)
    data = fingerprint(seqs)
    state = State()
    if resume and ckpt is not None and ckpt.exists():
        saved = torch.load(ckpt, map_location=device, weights_only=False)
        if saved["data"] != data or saved["config"] != dataclasses.asdict(tc):
            raise ValueError(f"{ckpt} was made with other data or settings; start afresh without --resume")
        draft.load_state_dict(saved["draft"])
        opt.load_state_dict(saved["opt"])
        state = State(**saved["state"])
        log(f"resumed at step {state.step} of {total} (epoch {state.epoch}, batch {state.batch})")
    log(f"draft {size / 1e6:.1f} MB in bf16; {len(seqs)} sequences, {total} steps over {tc.epochs} epochs")
    begin, taken = time.monotonic(), 0
    pending: list[torch.Tensor] = []  # the losses of steps the host has not read yet

    def settle():
        if pending:
            state.losses.extend(round(x, 5) for x in torch.stack(pending).tolist())
            pending.clear()
            if step_ends:
                step_ends[-1] = time.monotonic()  # the values are on the host: the device is done with the step

    def save():
        settle()
        if ckpt is not None:
            save_checkpoint(ckpt, draft, opt, state, tc, data)
        if out is not None:
            save_draft(draft, config, out, tc.max_draft_mb)

    trained_before = state.seconds  # a resumed paced run's clock goes on from here
    schedule = schedule_seconds or trained_before + time_budget
    while state.epoch < tc.epochs or paced:
        if state.epoch not in plans:
            plans[state.epoch] = epoch_batches(seqs, tc, state.epoch)
        batches = plans[state.epoch]
        while state.batch < len(batches):
            elapsed = time.monotonic() - begin
            state.seconds = trained_before + elapsed
            if paced and (elapsed >= time_budget or state.seconds >= schedule):
                save()
                log(f"done: {state.step} steps in {elapsed:.0f} s, {state.epoch} epochs and {state.batch} batches")
                return draft, config, state
            if (max_steps is not None and taken >= max_steps) or elapsed > time_budget:
                save()
                log(f"stopped at step {state.step} of {total}; continue with --resume")
                return draft, config, state
            index = batches[state.batch]
            batch = [seqs[i] for i in index]
            anchors = [
                sample_anchors(seqs[i], tc.anchors, tc.max_len, tc.seed, state.epoch, i, tc.loop_repeats) for i in index
            ]
            for group in opt.param_groups:
                group["lr"] = tc.lr * (
                    paced_factor(state.seconds / schedule, tc.warmup)
                    if paced
                    else lr_factor(state.step, total, tc.warmup)
                )
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=device.startswith("cuda")):
                loss, predictions, weights = block_loss(
                    draft, target, batch, anchors, tc, device, fixed_shapes=device.startswith("cuda")
                )
            with record_function("train.backward"):
                opt.zero_grad(set_to_none=True)
                loss.backward()
            with record_function("train.optimizer"):
                torch.nn.utils.clip_grad_norm_(draft.parameters(), tc.clip)
                opt.step()
            pending.append(loss.detach())
            if step_ends is not None:
                step_ends.append(time.monotonic())
            state.step += 1
            state.batch += 1
            taken += 1
            if state.step % max(1, min(50, total // 50)) == 0 or state.step == total:
                settle()
                accept = accept_length(predictions, batch, anchors, tc.block, weights)
                at = f" ({state.seconds / schedule:.0%} of the time)" if paced else f"/{total}"
                log(
                    f"step {state.step}{at} epoch {state.epoch}: loss {state.losses[-1]:.4f} "
                    f"batch accept {accept:.2f} lr {opt.param_groups[0]['lr']:.2e} ({time.monotonic() - begin:.0f} s)"
                )
            if save_every and state.step % save_every == 0:
                save()
        state.epoch += 1
        state.batch = 0
    save()
    log(f"done: {state.step} steps")
    return draft, config, state


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m train.train_draft", description=__doc__.splitlines()[0])
    p.add_argument("--target", help="the target's folder (default: the converted default model)")
    p.add_argument("--prompts", required=True, help="the prompt shards' folder (python -m train.prompts build)")
    p.add_argument("--responses", required=True, help="response shard folders, comma-separated (train.generate)")
    p.add_argument("--out", required=True, help="the draft's folder (bf16, z-lab format), written at every save")
    p.add_argument("--ckpt", required=True, help="the training checkpoint (draft, optimiser, step, data position)")
    p.add_argument("--resume", action="store_true", help="continue from --ckpt if it exists")
    p.add_argument(
        "--init",
        help="start from this saved draft's weights (a fresh optimiser and schedule); "
        "ignored when --resume finds --ckpt",
    )
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--time-budget", type=float, default=float("inf"), help="seconds; then save and stop")
    p.add_argument(
        "--paced",
        action="store_true",
        help="the schedule follows the clock over --time-budget (train.fit_budget's runs)",
    )
    p.add_argument(
        "--schedule-seconds",
        type=float,
        help="with --paced: the schedule's training seconds over every call of the run (default, or 0: "
        "the earlier calls' plus this call's --time-budget: this call ends it, annealed)",
    )
    p.add_argument("--log-json", help="write the settings, the steps and every step's loss so far here at the end")
    p.add_argument("--save-every", type=int, default=500)
    for field in dataclasses.fields(TrainConfig):
        value = field.default
        kind = (lambda s: tuple(int(x) for x in s.split(",") if x)) if isinstance(value, tuple) else type(value)
        p.add_argument(f"--{field.name.replace('_', '-')}", type=kind, default=value)
    args = p.parse_args(argv)
    if args.paced and args.time_budget == float("inf"):
        p.error("--paced needs a --time-budget")
    if args.schedule_seconds is not None and not args.paced:
        p.error("--schedule-seconds is the length of a paced schedule: it needs --paced")
    tc = TrainConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)})
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if args.target is None:
        from modeld.model.fetch_default import ensure_default_model

        args.target = str(ensure_default_model())
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    seqs = load_sequences(
        pathlib.Path(args.prompts), [pathlib.Path(d) for d in args.responses.split(",")], tokenizer, log
    )
    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=dtype).to(args.device).eval().requires_grad_(False)
    _, _, state = train(
        target,
        seqs,
        tc,
        args.device,
        log,
        pathlib.Path(args.ckpt),
        args.resume,
        pathlib.Path(args.out),
        args.time_budget,
        save_every=args.save_every,
        init=pathlib.Path(args.init) if args.init else None,
        paced=args.paced,
        schedule_seconds=args.schedule_seconds,
    )
    if args.log_json:
        write_log(pathlib.Path(args.log_json), tc, state, sequences=len(seqs))
    log(f"draft in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
