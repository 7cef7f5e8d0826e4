"""Wiring an engine wherever it runs (modeld's engine process, benchmarks, tests): attach to memd, load the target
(and draft), check memd's pools against them, capture CUDA graphs, build the scheduler, runner and engine. The gRPC
front (modeld.front.server) never imports this: it needs neither torch nor the model code."""

import logging
from dataclasses import dataclass

from modeld.config import ModeldConfig
from modeld.engine.hooks import EngineHooks
from modeld.engine.loop import Engine
from modeld.engine.memd_link import MemdLink, StartupError
from modeld.engine.ranks import RankGroup
from modeld.engine.scheduler import Scheduler
from modeld.grammar.compiler import GrammarCompiler
from modeld.model.fingerprint import model_fingerprint
from modeld.model.loader import eos_token_ids, load_target
from modeld.runner.graphs import GraphRunner
from modeld.runner.inputs import FIELDS
from modeld.runner.model_runner import ModelRunner
from modeld.spec.draft import load_served_draft
from modeld.spec.policy import SpeculationPolicy
from modeld.spec.worker import DflashWorker

log = logging.getLogger("modeld")


def check_layout(layout, hf_config, dtype: str) -> None:
    """memd's pools must have the model's KV geometry (a rank's share of its KV heads) and dtype."""
    t = layout.target
    heads = hf_config.num_attention_heads
    want = (
        hf_config.num_hidden_layers,
        hf_config.num_key_value_heads // max(1, layout.tensor_parallel_size),
        getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads,
    )
    if (t.layers, t.kv_heads, t.head_dim) != want:
        raise StartupError(
            f"memd's target pool is (layers, kv_heads, head_dim) = {(t.layers, t.kv_heads, t.head_dim)}, the model "
            f"needs {want}"
        )
    if layout.kv_dtype != dtype:
        raise StartupError(
            f"memd's KV dtype is {layout.kv_dtype} but modeld runs {dtype}: start memd with --kv-cache-dtype {dtype}"
        )


def check_draft_pool(layout, draft) -> None:
    """memd's draft pool must hold this draft's KV, for its window and block."""
    if not layout.has_draft:
        raise StartupError(
            "memd has no draft pool: start memd with --draft-model (or modeld with --speculative-algorithm none)"
        )
    d, g = layout.draft, draft.config
    if (d.layers, d.kv_heads, d.head_dim) != (g.num_hidden_layers, g.num_key_value_heads, g.head_dim):
        raise StartupError(
            f"memd's draft pool is (layers, kv_heads, head_dim) = {(d.layers, d.kv_heads, d.head_dim)}, "
            f"the draft needs {(g.num_hidden_layers, g.num_key_value_heads, g.head_dim)}"
        )
    if layout.draft_kv_ratio < 1:
        if None in draft.spec.windows:
            raise StartupError(
                "a draft with full-attention layers reads every position: it needs memd at --draft-kv-ratio 1"
            )
        if layout.draft_window < max(draft.spec.windows) - 1:
            raise StartupError(
                f"memd keeps a draft window of {layout.draft_window} tokens, the draft reads "
                f"{max(draft.spec.windows) - 1}: start memd with --draft-window >= that"
            )
        if draft.spec.block_size > layout.draft_block_size:
            raise StartupError(
                f"memd sized its request cap for blocks of {layout.draft_block_size}, "
                f"modeld would verify {draft.spec.block_size}"
            )


@dataclass
class Built:
    engine: Engine
    link: MemdLink
    info: dict
    tokenizer: object
    vocab_size: int
    ranks: RankGroup | None = None  # the other tensor-parallel ranks, when memd's layout has several

    def close(self) -> None:
        """After the engine stopped: memd's session closed, the other ranks ended."""
        self.link.close()
        if self.ranks is not None:
            self.ranks.stop()


def build_engine(cfg: ModeldConfig, set_health, hooks: EngineHooks | None = None) -> Built:
    """Attach to memd, load the target (and draft), capture CUDA graphs, wire the engine (not started); `hooks`:
    an observer of its steps' phases (benchmarks, tests)."""
    link = MemdLink(cfg.memd, cfg.connect_timeout, set_health, writes_draft_kv=cfg.speculative_algorithm == "dflash")
    layout = link.layout
    dtype = layout.kv_dtype if cfg.dtype == "auto" else cfg.dtype
    try:
        ranks = start_ranks(cfg, layout, dtype)
    except BaseException:
        link.close()
        raise
    try:
        model, tokenizer, hf_config = load_target(
            cfg.target_model, dtype, cfg.device, cfg.load_format, ranks.tensor_parallel if ranks else None
        )
        tuning = cfg.tuning
        model.use_skinny_linear(tuning.skinny_linear, fuse_norms=tuning.norm_fusion)
        epoch = layout.epoch
        link.identify(model_fingerprint(model, hf_config, dtype, layout.kv_dtype))  # memd caches prefixes per model
        layout = link.layout
        if ranks is not None:
            if layout.epoch != epoch:  # memd made new pools meanwhile: the other ranks map them too
                ranks.bind(layout.SerializeToString())
            ranks.wait_ready()
            model.ranks = ranks
    except BaseException:
        if ranks is not None:
            ranks.stop()
        raise
    draft = None
    if cfg.speculative_algorithm == "dflash":
        # with several ranks, every rank runs its share of the draft over its heads of the draft pool
        draft = load_served_draft(cfg, hf_config, dtype, ranks.tensor_parallel if ranks else None)

    def check(new_layout) -> None:
        size = ranks.size if ranks else 1
        if max(1, new_layout.tensor_parallel_size) != size:  # the ranks are started once, with the model
            raise StartupError(
                f"memd has {new_layout.tensor_parallel_size} tensor-parallel ranks, this modeld runs {size}: start "
                "modeld again to follow it"
            )
        check_layout(new_layout, hf_config, dtype)
        if draft is not None:
            check_draft_pool(new_layout, draft)

    link.check = check
    check(layout)
    worker = None
    if draft is not None:
        worker = DflashWorker(draft, model, link.pools)
        worker.draft.use_skinny_linear(tuning.skinny_linear, fuse_norms=tuning.norm_fusion)
        worker.ranks = ranks
    limits = step_limits(layout, worker is not None)
    log.info("from memd's layout: prefill chunk %d tokens, decode lookahead %d", limits.chunk, limits.lookahead)
    graphed = cfg.device == "cuda" and not cfg.disable_cuda_graph
    if tuning.alone_prompt_tokens and not graphed:  # asked for (None: the default, which follows the graphs)
        log.warning("alone_prompt_tokens is off: it needs CUDA graphs (a lone chunk alone would still run eagerly)")
    scheduler = Scheduler(
        link.session,
        limits.max_running,
        limits.chunk,
        limits.context_len,
        worker.block if worker else 0,
        lookahead=limits.lookahead,
        async_top_ups=True,
        speculate_below=cfg.speculative_disable_by_batch_size,
        policy=SpeculationPolicy() if worker and tuning.adaptive_speculation else None,
        alone_prompt_tokens=tuning.alone_prompt_limit(graphed),
        hooks=hooks,
    )
    graphs = None
    if graphed:
        graphs = GraphRunner(
            layout.max_running_requests,
            (1, worker.block) if worker else (1,),
            FIELDS,
            cfg.device,
            steps_per_replay=tuning.steps_per_replay,
            several_from=tuning.several_steps_from_batch,
            cycles_from=tuning.several_cycles_from_batch,
        )
    runner = ModelRunner(
        model,
        link.pools,
        cfg.device,
        taps=worker.taps if worker else (),
        graphs=graphs,
        spec=worker,
        overlap_decode=tuning.overlaps_decode(cfg.device),
        hooks=hooks,
    )
    if worker is not None and graphs is not None:
        worker.use_graphs(graphs)
    if ranks is not None:  # first: the other ranks map memd's new pools before any forward (graph captures included)
        link.rebinders.append(lambda session, pools: ranks.bind(session.layout.SerializeToString()))
    link.rebinders += [lambda session, pools: scheduler.memd.rebind(session), lambda session, pools: runner.bind(pools)]
    if worker is not None:
        link.rebinders.append(lambda session, pools: worker.bind(pools))
    if scheduler.policy is not None:  # new pools and graphs: their step costs are measured again
        link.rebinders.append(lambda session, pools: scheduler.policy.reset_costs())
    eos_ids = eos_token_ids(tokenizer, hf_config, cfg.target_model)
    engine = Engine(
        runner,
        scheduler,
        tokenizer,
        eos_ids,
        limits.context_len,
        link,
        spec_block=worker.block if worker else 0,
        trim_draft=limits.trim_draft,
        stream_interval=cfg.stream_interval,
        hooks=hooks,
        grammars=None if tokenizer is None else GrammarCompiler(tokenizer, hf_config.vocab_size, eos_ids),
    )
    info = dict(
        target_model=cfg.target_model,
        draft_model=cfg.draft_model or "",
        dtype=dtype,
        device=cfg.device,
        speculative_algorithm=cfg.speculative_algorithm,
        block_size=worker.block if worker else 0,
        vocab_size=hf_config.vocab_size,
        **layout_info(layout),
    )

    def apply_limits(session, pools) -> None:  # a re-attached memd may run with other settings
        new = step_limits(session.layout, worker is not None)
        scheduler.set_limits(new.max_running, new.chunk, new.context_len, new.lookahead, async_top_ups=True)
        engine.trim_draft, engine.output.context_len = new.trim_draft, new.context_len
        info.update(layout_info(session.layout))

    link.rebinders.append(apply_limits)
    return Built(engine, link, info, tokenizer, hf_config.vocab_size, ranks)


def start_ranks(cfg: ModeldConfig, layout, dtype: str) -> RankGroup | None:
    """The other tensor-parallel ranks memd's layout asks for, started and joined (None for one rank)."""
    size = max(1, layout.tensor_parallel_size)
    if size == 1:
        return None
    if cfg.device != "cpu":
        raise StartupError(f"memd has {size} tensor-parallel ranks: modeld runs several ranks on the CPU only so far")
    log.info("%d tensor-parallel ranks (memd's layout): starting ranks 1..%d", size, size - 1)
    return RankGroup(cfg, size, dtype, layout.SerializeToString())


@dataclass(frozen=True)
class StepLimits:
    max_running: int
    chunk: int  # prefill tokens per step
    context_len: int
    lookahead: int  # decode positions granted ahead
    trim_draft: bool  # a bounded draft pool: out-of-window draft slots are trimmed


def step_limits(layout, speculative: bool) -> StepLimits:
    """What memd's layout sets for a step: memd sizes its pools (the bounded draft pool's request cap holds one
    prefill chunk and each request's decode lookahead), so modeld prefills and grants ahead exactly as much."""
    trim_draft = speculative and layout.draft_kv_ratio < 1
    return StepLimits(
        layout.max_running_requests,
        layout.chunked_prefill_size,
        layout.context_len,
        layout.decode_lookahead,
        trim_draft,
    )


def layout_info(layout) -> dict:
    """The part of GetInfo that memd's layout decides."""
    return dict(
        draft_window=layout.draft_window,
        draft_kv_ratio=layout.draft_kv_ratio,
        page_size=layout.page_size,
        max_running_requests=layout.max_running_requests,
        context_len=layout.context_len,
        target_tokens=layout.target.tokens,
        draft_tokens=layout.draft.tokens,
    )
