"""The residual add + RMSNorm (+ SiLU-mul) folded into the skinny projection, against the same ops unfused: the
residual stream it stores, the projection's values, one row alone equal to the same row among sixteen. On the CPU
(Triton's interpreter) in fp16 only, as tests/modeld/kernels/test_skinny_linear.py says why; on a GPU in both 16-bit dtypes."""

import pytest
import torch
from triton.runtime.errors import OutOfResources

from modeld.kernels import tile_fitting
from modeld.kernels.fused import rms_norm, silu_mul
from modeld.kernels.norm_linear import FUSED_TILES, fits, norm_linear, norm_linear_launch
from modeld.kernels.skinny_linear import MAX_ROWS, skinny_launch

TILE = (16, 64, 4, 2)  # a small tile: the interpreter's cost grows with it
EPS = 1e-5


@pytest.fixture(params=[torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def dtype(request, device):
    if device == "cpu" and request.param == torch.bfloat16:
        pytest.skip("Triton's interpreter multiplies bf16 tiles wrongly; bf16 runs on a GPU")
    return request.param


def _inputs(device, dtype, rows, n, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g).to(device, dtype)
    residual = torch.randn(rows, k, generator=g).to(device, dtype)
    norm_weight = (1 + 0.1 * torch.randn(k, generator=g)).to(device, dtype)
    w = (torch.randn(n, k, generator=g) / k**0.5).to(device, dtype)
    b = torch.randn(n, generator=g).to(device, dtype)
    return x, residual, norm_weight, w, b


def _unfused(x, residual, norm_weight, w, b, silu_pair):
    """The same step as the engine ran it before: the norm kernel, the skinny projection, the SiLU-mul kernel."""
    h, stream = rms_norm(x, norm_weight, EPS, residual)
    y = skinny_launch(h, w, b, TILE)
    return (silu_mul(y) if silu_pair else y), stream


@pytest.mark.parametrize("silu_pair", [False, True], ids=["projection", "gate_up_silu"])
@pytest.mark.parametrize("with_residual", [True, False], ids=["add", "no_add"])
@pytest.mark.parametrize("rows,n,k", [(1, 64, 128), (5, 96, 160), (16, 64, 96), (37, 64, 96)])
def test_equals_the_unfused_norm_projection_and_silu(device, dtype, silu_pair, with_residual, rows, n, k):
    x, residual, norm_weight, w, b = _inputs(device, dtype, rows, n, k)
    residual = residual if with_residual else None
    y, stream = norm_linear_launch(x, residual, norm_weight, EPS, w, b, TILE, silu_pair)
    expected, expected_stream = _unfused(x, residual, norm_weight, w, b, silu_pair)
    assert y.shape == (rows, n // 2 if silu_pair else n) and y.dtype == dtype
    assert torch.equal(stream, expected_stream)  # the residual stream bit for bit
    if not with_residual:
        assert stream is x
    # the sum of squares is taken by K chunk rather than in one reduction: a normalised value may move by an ulp,
    # and so, rarely, an output (in Triton's interpreter none does)
    ulp = expected.float().abs().clamp_min(1.0) * torch.finfo(dtype).eps
    assert ((y.float() - expected.float()).abs() <= ulp).all()
    assert (y != expected).float().mean() <= 0.02
    reference = torch.nn.functional.linear(
        rms_norm(x.float(), norm_weight.float(), EPS, None if residual is None else residual.float())[0],
        w.float(),
        b.float(),
    )
    if silu_pair:
        gate, up = reference.chunk(2, dim=-1)
        reference = torch.nn.functional.silu(gate) * up
    torch.testing.assert_close(y.float(), reference, atol=5e-2, rtol=5e-2)  # a few 16-bit roundings from fp32


@pytest.mark.parametrize("silu_pair", [False, True], ids=["projection", "gate_up_silu"])
def test_a_row_alone_equals_the_same_row_among_many(device, dtype, silu_pair):
    """Among 16 rows (one program's block) and among 40 (three blocks, the last partial)."""
    x, residual, norm_weight, w, b = _inputs(device, dtype, 40, 64, 128, seed=1)
    block, _ = norm_linear_launch(x, residual, norm_weight, EPS, w, b, TILE, silu_pair)
    sixteen, _ = norm_linear_launch(x[:16], residual[:16], norm_weight, EPS, w, b, TILE, silu_pair)
    assert torch.equal(sixteen, block[:16])
    for i in (0, 9, 15, 16, 39):
        alone, stream = norm_linear_launch(x[i : i + 1], residual[i : i + 1], norm_weight, EPS, w, b, TILE, silu_pair)
        assert torch.equal(alone[0], block[i])
        assert torch.equal(stream[0], (x[i].float() + residual[i].float()).to(dtype))


def test_shape_errors_are_clear(device):
    x, residual, norm_weight, w, _ = _inputs(device, torch.float16, 2, 32, 64)
    with pytest.raises(ValueError, match="input of 32 columns"):
        norm_linear_launch(x[:, :32], None, norm_weight, EPS, w, None, TILE)
    with pytest.raises(ValueError, match="residual of shape"):
        norm_linear_launch(x, residual[:1], norm_weight, EPS, w, None, TILE)


def test_a_tile_past_the_cards_shared_memory_takes_fewer_stages_then_none(device, monkeypatch):
    """A launch that fails for shared memory is tried again with fewer stages, down to 2, and the tile that
    compiled is kept; when none does, norm_linear answers None (the caller runs the ops apart) and keeps that."""
    import modeld.kernels.norm_linear as nl

    x, residual, norm_weight, w, b = _inputs(device, torch.float16, 2, 64, 128)
    monkeypatch.setitem(FUSED_TILES, (*w.shape, False), (32, 64, 4, 4))
    monkeypatch.setattr(tile_fitting, "_TILE_THAT_FITS", {})
    real, tried, limit = nl.norm_linear_launch, [], [2]

    def launch(*args):
        tried.append(args[6][3])  # the tile's stages
        if args[6][3] > limit[0]:
            raise OutOfResources(300_000, 232_448, "shared memory")
        return real(*args)

    monkeypatch.setattr(nl, "norm_linear_launch", launch)
    y, _ = nl.norm_linear(x, residual, norm_weight, EPS, w, b)
    assert tried == [4, 3, 2]
    assert torch.equal(y, real(x, residual, norm_weight, EPS, w, b, (32, 64, 4, 2))[0])
    nl.norm_linear(x, residual, norm_weight, EPS, w, b)
    assert tried == [4, 3, 2, 2]  # the tile that fitted, at once
    limit[0], tried[:] = 1, []
    assert nl.norm_linear(x, None, norm_weight, EPS, w, b) is None  # another kernel: no residual
    assert nl.norm_linear(x, None, norm_weight, EPS, w, b) is None and tried == [4, 3, 2]


def test_the_cpu_path_runs_the_ops_apart():
    x, _, norm_weight, w, _ = _inputs("cpu", torch.bfloat16, 2, 32, 64)
    assert not fits(x, norm_weight, w)


@pytest.mark.gpu
def test_on_the_gpu_a_measured_shape_of_up_to_sixteen_rows_is_fused():
    n, k, _ = next(iter(FUSED_TILES))
    x, residual, norm_weight, w, b = _inputs("cuda", torch.bfloat16, MAX_ROWS + 1, n, k)
    assert fits(x[:MAX_ROWS], norm_weight, w, silu_pair=True) and not fits(x, norm_weight, w, silu_pair=True)
    assert not fits(x[:1], norm_weight.float(), w, silu_pair=True)  # a norm weight of another dtype
    assert not fits(x[:1], norm_weight, w)  # without SiLU-mul this shape was not measured faster
    y, stream = norm_linear(x[:1], residual[:1], norm_weight, EPS, w, b, silu_pair=True)
    h, expected_stream = rms_norm(x[:1], norm_weight, EPS, residual[:1])
    assert torch.equal(stream, expected_stream)
    torch.testing.assert_close(y, silu_mul(torch.nn.functional.linear(h, w, b)), atol=2e-2, rtol=2e-2)


def test_only_a_shape_measured_faster_is_fused(device, monkeypatch):
    """The dispatch follows the measured tables, not the inputs alone: with every input condition met, a projection
    is fused only where its (N, K, SiLU-mul) is in FUSED_TILES, and the attention input only where its q|k|v shape
    is in ATTENTION_TILES; elsewhere (the 8B geometry's shapes, say) the ops run apart, with the same results."""
    import modeld.kernels.norm_linear as nl
    import modeld.kernels.norm_qkv_rotary as nqr

    x, residual, norm_weight, w, b = _inputs(device, torch.float16, 2, 64, 96)
    launches = []

    def counted(key, tile, launch):
        launches.append(key[0])
        return launch(tile)

    monkeypatch.setattr(nl, "fits_inputs", lambda *a: True)  # on the CPU too: the tables alone decide
    monkeypatch.setattr(nl, "launch_fitting", counted)
    monkeypatch.setattr(nqr, "launch_fitting", counted)
    apart = nl.norm_project(x, residual, norm_weight, EPS, w, b, fuse=False)
    assert torch.equal(nl.norm_project(x, residual, norm_weight, EPS, w, b)[0], apart[0]) and launches == []
    monkeypatch.setitem(nl.FUSED_TILES, (64, 96, True), TILE)  # measured as gate|up only
    nl.norm_project(x, residual, norm_weight, EPS, w, b)
    assert launches == []
    monkeypatch.setitem(nl.FUSED_TILES, (64, 96, False), TILE)
    fused = nl.norm_project(x, residual, norm_weight, EPS, w, b)
    assert launches == ["norm_linear"]
    torch.testing.assert_close(fused[0], apart[0], atol=2e-2, rtol=2e-2)
    cos, sin = (torch.ones(2, 16, dtype=torch.float16, device=device) for _ in range(2))
    caches = [torch.zeros(8, 1, 16, dtype=torch.float16, device=device) for _ in range(2)]
    slots = torch.tensor([1, 2], device=device)
    args = (x, residual, norm_weight, EPS, w, b, cos, sin, *caches, slots, 2, 1)
    assert nqr.norm_qkv_rotary(*args) is None and launches == ["norm_linear"]  # (64, 96) not in ATTENTION_TILES
    monkeypatch.setitem(nqr.ATTENTION_TILES, (64, 96), TILE)
    assert nqr.norm_qkv_rotary(*args) is not None and launches == ["norm_linear", "norm_qkv_rotary"]


def _tiny_llama():
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=311,
        hidden_size=96,
        intermediate_size=80,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
    )


def _fuse_shapes(monkeypatch, device, shapes, tile_fits=True) -> list:
    """The fused kernels on for these (N, K) weight shapes (a small tile in their tables: q|k|v, the attention input,
    and gate|up with SiLU-mul), on the CPU too (the dispatcher takes CUDA tensors only: here it takes the
    interpreter's); or, without tile_fits, every fused launch answering None as where no tile fits the card.
    Returns the list that gets an entry per fused launch asked for."""
    import modeld.kernels.norm_linear as nl
    import modeld.kernels.norm_qkv_rotary as nqr

    qkv, gate_up = shapes
    monkeypatch.setitem(nl.FUSED_TILES, (*qkv, False), (32, 32, 4, 2))
    monkeypatch.setitem(nqr.ATTENTION_TILES, qkv, (32, 32, 4, 2))
    monkeypatch.setitem(nl.FUSED_TILES, (*gate_up, True), (32, 32, 4, 2))
    monkeypatch.setattr(tile_fitting, "_TILE_THAT_FITS", {})
    if device == "cpu":
        monkeypatch.setattr(nl, "fits_inputs", lambda x, norm_weight, weight: x.shape[0] <= MAX_ROWS)
    launches, launch_fitting = [], tile_fitting.launch_fitting

    def counted(key, tile, launch):
        launches.append(key[0])
        return launch_fitting(key, tile, launch) if tile_fits else None

    monkeypatch.setattr(nl, "launch_fitting", counted)
    monkeypatch.setattr(nqr, "launch_fitting", counted)
    return launches


def _check_fused_against_unfused(outs: dict, launches: list, expected_launches: list, tile_fits: bool) -> None:
    assert sorted(launches) == sorted(expected_launches)
    if tile_fits:
        torch.testing.assert_close(outs[True], outs[False], atol=2e-2, rtol=2e-2)
    else:
        assert torch.equal(outs[True], outs[False])


@pytest.mark.parametrize("tile_fits", [True, False], ids=["fused", "no_tile_fits"])
def test_a_model_forward_with_the_norms_fused_equals_it_unfused(device, monkeypatch, tile_fits):
    """The wiring in modeld.model.causal_lm.DecoderLayer: a prefill of 7 tokens and two decode steps of a 2-layer Llama
    through the fused kernels (the attention input in one launch, gate|up with its norm and SiLU-mul in another)
    give the hidden states of the same forward with the norms, projections, rotary and SiLU-mul apart. Where no
    tile fits the card (the fused launches answer None), the layer runs the ops apart: the same hidden states."""
    from modeld.model.causal_lm import CausalLM, RMSNorm
    from tests.modeld.runner.paged import PagedPools

    cfg = _tiny_llama()
    torch.manual_seed(0)
    model = CausalLM(cfg).to(device, torch.float16).eval()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, RMSNorm):
                module.weight.normal_(1.0, 0.1)
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    launches = _fuse_shapes(
        monkeypatch,
        device,
        [
            (cfg.hidden_size + 2 * cfg.num_key_value_heads * head_dim, cfg.hidden_size),
            (2 * cfg.intermediate_size, cfg.hidden_size),
        ],
        tile_fits,
    )
    gen = torch.Generator().manual_seed(4)
    steps = [torch.randint(0, cfg.vocab_size, (n,), generator=gen).tolist() for n in (7, 1, 1)]
    hidden = {}
    for fuse in (True, False):
        model.use_skinny_linear(True, fuse_norms=fuse)
        pools = PagedPools(cfg, pages=16, page_size=4, dtype=torch.float16)
        pools.kv, pools.req_to_token = pools.kv.to(device), pools.req_to_token.to(device)
        outs = []
        for ids in steps:
            batch = pools.batch([(1, ids)])
            for name, value in vars(batch).items():
                if isinstance(value, torch.Tensor):
                    setattr(batch, name, value.to(device))
            outs.append(model(batch, pools.kv)[0].float())
        hidden[fuse] = torch.cat(outs)
    per_layer = ["norm_qkv_rotary", "norm_linear"]  # the attention input, gate|up with SiLU-mul
    if not tile_fits:  # the attention input's launch did not fit: the norm + q|k|v launch is tried next
        per_layer.append("norm_linear")
    _check_fused_against_unfused(hidden, launches, per_layer * cfg.num_hidden_layers * len(steps), tile_fits)


@pytest.mark.parametrize("tile_fits", [True, False], ids=["fused", "no_tile_fits"])
def test_the_drafts_block_with_the_norms_fused_equals_it_unfused(device, monkeypatch, tile_fits):
    """The same for the DFLASH draft's serving layers (modeld.spec.serving_draft): one request's block of 4 rows."""
    from modeld.spec.serving_draft import ServingDraft
    from tests.modeld.spec.test_draft_serving import HIDDEN, contexts_for, make_draft

    draft = make_draft(causal=False, dtype=torch.float16, device=device)
    serving = ServingDraft(draft, max_positions=256)
    cfg = draft.config
    launches = _fuse_shapes(
        monkeypatch,
        device,
        [
            ((cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * cfg.head_dim, HIDDEN),
            (2 * cfg.intermediate_size, HIDDEN),
        ],
        tile_fits,
    )
    b = draft.spec.block_size
    gen = torch.Generator().manual_seed(5)
    embeds = torch.randn(1, b, HIDDEN, generator=gen).to(device, torch.float16)
    positions = torch.arange(40, 40 + b, device=device)[None, :]
    contexts = contexts_for(draft, 1, b, 12, torch.float16, device)
    outs = {}
    for fuse in (True, False):
        serving.use_skinny_linear(True, fuse_norms=fuse)
        outs[fuse] = serving.block_hidden(embeds, positions, contexts).float()
    per_layer = ["norm_linear", "norm_linear"]  # q|k|v (the draft's q/k norms come between it and rotary), gate|up
    _check_fused_against_unfused(outs, launches, per_layer * cfg.num_hidden_layers, tile_fits)


@pytest.mark.gpu
def test_the_default_models_and_drafts_shapes_take_the_fused_kernels(monkeypatch):
    """On a GPU, in bf16, the default model's geometry (SmolLM2-135M, random weights) decodes one
    token through the attention input's and gate|up's fused launches, and the default draft's block of 16 rows
    through its one fused launch a layer (gate|up): the dispatch conditions (tuned shapes, dtypes, strides) hold for the
    real shapes, and no launch falls back for shared memory."""
    from transformers import LlamaConfig

    import modeld.kernels.norm_linear as nl
    import modeld.kernels.norm_qkv_rotary as nqr
    from memd.defaults import draft_folder
    from modeld.model.causal_lm import CausalLM
    from modeld.spec.draft import load_draft
    from modeld.spec.serving_draft import ServingDraft
    from tests.modeld.runner.paged import PagedPools

    cfg = LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
    )
    launches, launch_fitting = [], tile_fitting.launch_fitting

    def counted(key, tile, launch):
        out = launch_fitting(key, tile, launch)
        launches.append((key[0], out is not None))
        return out

    monkeypatch.setattr(nl, "launch_fitting", counted)
    monkeypatch.setattr(nqr, "launch_fitting", counted)
    torch.manual_seed(0)
    model = CausalLM(cfg).to("cuda", torch.bfloat16).eval()
    pools = PagedPools(cfg, pages=8, page_size=16, dtype=torch.bfloat16)
    pools.kv, pools.req_to_token = pools.kv.cuda(), pools.req_to_token.cuda()
    batch = pools.batch([(1, [5])])
    for name, value in vars(batch).items():
        if isinstance(value, torch.Tensor):
            setattr(batch, name, value.cuda())
    model(batch, pools.kv)
    assert launches == [("norm_qkv_rotary", True), ("norm_linear", True)] * cfg.num_hidden_layers
    launches.clear()
    draft = ServingDraft(load_draft(draft_folder("default"), cfg, torch.bfloat16, "cuda", dummy=True), 512)
    b = draft.spec.block_size
    contexts = [
        (torch.zeros(1, 4, 3, 64, device="cuda", dtype=torch.bfloat16),) * 2
        + (torch.ones(1, b, 4, dtype=torch.bool, device="cuda"),)
    ] * len(draft.layers)
    draft.block_hidden(
        torch.randn(1, b, 576, device="cuda", dtype=torch.bfloat16), torch.arange(b, device="cuda")[None, :], contexts
    )
    assert launches == [("norm_linear", True)] * len(draft.layers)  # gate|up; q|k|v measured slower fused at 16 rows
