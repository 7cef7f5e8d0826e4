"""The configurations bench.engine_speed compares (its --variants): modeld's settings per row, the rows that run
modeld's defaults on CUDA (SERVED), and the ModeldConfig of each."""

from dataclasses import dataclass

from modeld.config import ModeldConfig
from modeld.engine.tuning import Tuning


@dataclass(frozen=True)
class Variant:
    name: str
    graphs: bool
    lookahead: int
    dflash: bool
    steps: int = 1  # decode (verify) steps a replay may run
    speculate_below: int = 0  # DFLASH verifies only while fewer requests run (0: always)
    speculate_below_sampled: int = 0  # the same while any running request samples
    several_from: int = 16  # the smallest batch that runs several steps a replay (modeld's SEVERAL_STEPS_FROM_BATCH)
    cycles_from: int = 1  # the same for greedy verify steps (modeld's SEVERAL_CYCLES_FROM_BATCH)
    skinny: bool = True  # projections of <= 16 rows through the skinny Triton kernel (False: cuBLAS)
    fuse_norms: bool = True  # with skinny: norms, SiLU-mul, rotary + K/V write inside it (False: kernels of their own)
    overlap: bool = False  # a plain decode step queued before the one before it is committed (modeld's default on CUDA)
    prompt_graphs: bool = True  # one request's prompt chunk of up to 128 tokens replays a graph (False: eager)


VARIANTS = [
    Variant("modeld eager, memd call every step (before)", graphs=False, lookahead=0, dflash=False),
    Variant("modeld graphs + lookahead", graphs=True, lookahead=32, dflash=False),
    Variant("modeld graphs + lookahead, 4 steps a replay", graphs=True, lookahead=32, dflash=False, steps=4),
    Variant("modeld DFLASH graphs + lookahead", graphs=True, lookahead=32, dflash=True),
    # four verify steps reach 64 positions: a lookahead of 32 would rarely hold them (memd runs with 96 for this one)
    Variant("modeld DFLASH graphs + lookahead 96, 4 steps a replay", graphs=True, lookahead=96, dflash=True, steps=4),
    Variant(
        "modeld DFLASH as served by default (4 steps a replay, speculation off from 16 running)",
        graphs=True,
        lookahead=96,
        dflash=True,
        steps=4,
        speculate_below=16,
        speculate_below_sampled=2,
        overlap=True,
    ),
    # the same one step at a time: how a batch too large to speculate decoded until plain decodes with a draft's
    # context ran several steps as a chain (modeld.runner.decode_chain)
    Variant(
        "modeld DFLASH as served, one step at a time",
        graphs=True,
        lookahead=96,
        dflash=True,
        steps=1,
        speculate_below=16,
        speculate_below_sampled=2,
    ),
    # several steps a replay at every batch size: fewer host gaps between a large model's steps at batch 1
    Variant(
        "modeld graphs + lookahead, 4 steps a replay from batch 1",
        graphs=True,
        lookahead=32,
        dflash=False,
        steps=4,
        several_from=1,
    ),
    # the projections of a few rows on cuBLAS, as before the skinny kernel (batch 1 and one request's DFLASH block)
    Variant(
        "modeld graphs + lookahead, cuBLAS for few rows (before)", graphs=True, lookahead=32, dflash=False, skinny=False
    ),
    Variant(
        "modeld DFLASH as served, cuBLAS for few rows (before)",
        graphs=True,
        lookahead=96,
        dflash=True,
        steps=4,
        speculate_below=16,
        speculate_below_sampled=2,
        skinny=False,
    ),
    # --disable-norm-fusion: the skinny kernel with the norms, the SiLU-mul and the rotary + K/V write as kernels of
    # their own, as before modeld.kernels.norm_linear and norm_qkv_rotary (the draft's q/k norms + rotary and the
    # two-launch argmax stay)
    Variant(
        "modeld graphs + lookahead, norms unfused (before)", graphs=True, lookahead=32, dflash=False, fuse_norms=False
    ),
    Variant(
        "modeld DFLASH as served, norms unfused (before)",
        graphs=True,
        lookahead=96,
        dflash=True,
        steps=4,
        speculate_below=16,
        speculate_below_sampled=2,
        fuse_norms=False,
    ),
    # decode overlapped: the host's work of a plain decode step (commit, output, scheduling, packing, launch) while
    # the GPU computes the next one (modeld.runner.step_ahead): plain decoding as served, and DFLASH as served before the
    # overlap (--disable-overlap-decode). Their tokens/s is the measure: the breakdown synchronises after every
    # forward, which undoes the overlap
    Variant(
        "modeld graphs + lookahead, 4 steps a replay, decode overlapped",
        graphs=True,
        lookahead=32,
        dflash=False,
        steps=4,
        overlap=True,
    ),
    Variant(
        "modeld DFLASH as served, decode not overlapped (before)",
        graphs=True,
        lookahead=96,
        dflash=True,
        steps=4,
        speculate_below=16,
        speculate_below_sampled=2,
    ),
    # one greedy verify step a replay below 16 running, as served before several verify steps ran a replay at every
    # batch size (SEVERAL_CYCLES_FROM_BATCH); and as served with a lookahead of 32: its spare
    # holds one or two verify steps, where 96's holds four
    Variant(
        "modeld DFLASH as served, one verify step a replay below 16 running (before)",
        graphs=True,
        lookahead=96,
        dflash=True,
        steps=4,
        speculate_below=16,
        speculate_below_sampled=2,
        overlap=True,
        cycles_from=16,
    ),
    Variant(
        "modeld DFLASH as served, lookahead 32 (before)",
        graphs=True,
        lookahead=32,
        dflash=True,
        steps=4,
        speculate_below=16,
        speculate_below_sampled=2,
        overlap=True,
    ),
    # speculating below 32 running instead of 16
    Variant(
        "modeld DFLASH graphs + lookahead 96, 4 steps a replay, speculation off from 32 running",
        graphs=True,
        lookahead=96,
        dflash=True,
        steps=4,
        speculate_below=32,
        speculate_below_sampled=32,
        overlap=True,
    ),
    # plain and DFLASH as served with every prompt chunk eager, as before one request's chunk replayed a graph
    Variant(
        "modeld graphs + lookahead, 4 steps a replay, decode overlapped, prompts eager (before)",
        graphs=True,
        lookahead=32,
        dflash=False,
        steps=4,
        overlap=True,
        prompt_graphs=False,
    ),
    Variant(
        "modeld DFLASH as served, prompts eager (before)",
        graphs=True,
        lookahead=96,
        dflash=True,
        steps=4,
        speculate_below=16,
        speculate_below_sampled=2,
        overlap=True,
        prompt_graphs=False,
    ),
    # DFLASH as served, speculating only below 8 and below 4 running (where does verifying stop paying?)
    Variant(
        "modeld DFLASH as served, speculation off from 8 running",
        graphs=True,
        lookahead=96,
        dflash=True,
        steps=4,
        speculate_below=8,
        speculate_below_sampled=2,
        overlap=True,
    ),
    Variant(
        "modeld DFLASH as served, speculation off from 4 running",
        graphs=True,
        lookahead=96,
        dflash=True,
        steps=4,
        speculate_below=4,
        speculate_below_sampled=2,
        overlap=True,
    ),
]
SERVED = {"plain": VARIANTS[12].name, "dflash": VARIANTS[5].name}  # modeld's defaults on CUDA, without and with a draft


def variant_config(v: Variant, memd: str, args) -> ModeldConfig:
    """modeld's settings for a variant (args: --target, --load-format, --draft)."""
    return ModeldConfig(
        device="cuda",
        memd=memd,
        target_model=args.target,
        load_format=args.load_format,
        draft_model=args.draft if v.dflash else None,
        speculative_algorithm="dflash" if v.dflash else "none",
        disable_cuda_graph=not v.graphs,
        speculative_disable_by_batch_size=v.speculate_below,
        tuning=Tuning(
            steps_per_replay=v.steps,
            speculate_below_sampled=v.speculate_below_sampled,
            skinny_linear=v.skinny,
            norm_fusion=v.fuse_norms,
            overlap_decode=v.overlap,
            alone_prompt_tokens=None if v.prompt_graphs else 0,
            several_steps_from_batch=v.several_from,
            several_cycles_from_batch=v.cycles_from,
        ),
    )
