"""memd.plan.make_plan / validate against real config.json folders, and
memd.config.config_from_args."""

import json

import pytest

from memd.config import MemdConfig, config_from_args
from memd.plan import ConfigError, make_plan
from memd.sizing import DraftShape, request_cap

TARGET_LAYERS, TARGET_KV_HEADS, TARGET_HEAD_DIM = 4, 2, 64
TARGET_COST = 2 * TARGET_LAYERS * TARGET_KV_HEADS * TARGET_HEAD_DIM * 2  # bf16: 2048 bytes/token
DRAFT_LAYERS, DRAFT_KV_HEADS, DRAFT_HEAD_DIM = 2, 2, 64
DRAFT_COST = 2 * DRAFT_LAYERS * DRAFT_KV_HEADS * DRAFT_HEAD_DIM * 2  # bf16: 1024 bytes/token
BLOCK = 8
MAX_POSITIONS = 8192
BUDGET = 50_000_000


def llama_target(**overrides) -> dict:
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "num_hidden_layers": TARGET_LAYERS,
        "num_attention_heads": 8,
        "num_key_value_heads": TARGET_KV_HEADS,
        "hidden_size": 512,
        "head_dim": TARGET_HEAD_DIM,
        "torch_dtype": "bfloat16",
        "max_position_embeddings": MAX_POSITIONS,
    }
    cfg.update(overrides)
    return cfg


def dflash_draft(**overrides) -> dict:
    cfg = {
        "architectures": ["DFlashDraftModel"],
        "num_hidden_layers": DRAFT_LAYERS,
        "num_attention_heads": 8,
        "num_key_value_heads": DRAFT_KV_HEADS,
        "head_dim": DRAFT_HEAD_DIM,
        "hidden_size": 512,
        "torch_dtype": "bfloat16",
        "layer_types": ["sliding_attention"] * DRAFT_LAYERS,
        "sliding_window": 2048,
        "dflash_config": {"block_size": BLOCK, "target_layer_ids": [1, 3], "mask_token_id": 2},
    }
    cfg.update(overrides)
    return cfg


def write_folder(root, name: str, cfg: dict | str | None):
    folder = root / name
    folder.mkdir()
    if cfg is not None:
        (folder / "config.json").write_text(cfg if isinstance(cfg, str) else json.dumps(cfg))
    return folder


@pytest.fixture
def target_dir(tmp_path):
    return write_folder(tmp_path, "target", llama_target())


@pytest.fixture
def draft_dir(tmp_path):
    return write_folder(tmp_path, "draft", dflash_draft())


def memd_config(target, draft, **overrides) -> MemdConfig:
    fields = dict(
        device="cpu",
        target_model=str(target),
        draft_model=str(draft) if draft is not None else None,
        draft_kv_ratio=0.25,
        draft_window=64,
        draft_eviction_interval=8,
        page_size=1,
        max_running_requests=2,
        chunked_prefill_size=32,
        kv_budget_bytes=BUDGET,
        kv_cache_dtype="bfloat16",
    )
    fields.update(overrides)
    return MemdConfig(**fields)


# --- validation ----------------------------------------------------------------------------


@pytest.mark.parametrize("ratio", [0, -0.5, 1.5])
def test_ratio_outside_range(target_dir, draft_dir, ratio):
    # validate() turns sizing.validate_ratio's SizingError into a ConfigError.
    with pytest.raises(ConfigError, match=r"must be in \(0, 1\]") as raised:
        make_plan(memd_config(target_dir, draft_dir, draft_kv_ratio=ratio))
    assert "cannot address" in str(raised.value)


def test_ratio_below_one_requires_draft_window(target_dir, draft_dir):
    with pytest.raises(ConfigError, match="requires --draft-window"):
        make_plan(memd_config(target_dir, draft_dir, draft_window=None))


def test_ratio_one_needs_no_draft_window(target_dir, draft_dir):
    plan = make_plan(memd_config(target_dir, draft_dir, draft_kv_ratio=1.0, draft_window=None))
    assert plan.window == plan.draft.sliding_window  # reported: the draft's own window
    assert not plan.bounded_draft


def test_ratio_below_one_requires_a_draft(target_dir):
    with pytest.raises(ConfigError, match="needs a DFLASH draft"):
        make_plan(memd_config(target_dir, None))


def test_draft_window_smaller_than_block(target_dir, draft_dir):
    with pytest.raises(ConfigError, match=rf"--draft-window 4 is smaller than the draft block size {BLOCK}"):
        make_plan(memd_config(target_dir, draft_dir, draft_window=4))


def test_draft_window_equal_to_block_is_accepted(target_dir, draft_dir):
    plan = make_plan(memd_config(target_dir, draft_dir, draft_window=BLOCK))
    assert plan.window == BLOCK


def test_draft_window_checked_against_the_drafts_block_size(tmp_path, target_dir):
    config = dflash_draft()
    config["dflash_config"]["block_size"] = 128
    draft = write_folder(tmp_path, "d", config)
    with pytest.raises(ConfigError, match="--draft-window 64 is smaller than the draft block size 128"):
        make_plan(memd_config(target_dir, draft))


def test_draft_with_a_full_attention_layer(tmp_path, target_dir):
    draft = write_folder(tmp_path, "d", dflash_draft(layer_types=["sliding_attention", "full_attention"]))
    with pytest.raises(ConfigError, match="every draft layer to be sliding_attention") as raised:
        make_plan(memd_config(target_dir, draft))
    assert "full_attention" in str(raised.value)


def test_draft_without_layer_types_or_sliding_window(tmp_path, target_dir):
    cfg = dflash_draft()
    del cfg["layer_types"], cfg["sliding_window"]
    draft = write_folder(tmp_path, "d", cfg)
    with pytest.raises(ConfigError, match="every draft layer to be sliding_attention"):
        make_plan(memd_config(target_dir, draft))
    # The same draft is fine for the plain configuration.
    plan = make_plan(memd_config(target_dir, draft, draft_kv_ratio=1.0))
    assert plan.sizes.draft_tokens == plan.sizes.target_tokens


def test_draft_with_sliding_window_alone_is_all_sliding(tmp_path, target_dir):
    cfg = dflash_draft()
    del cfg["layer_types"]
    draft = write_folder(tmp_path, "d", cfg)
    plan = make_plan(memd_config(target_dir, draft))
    assert plan.draft.all_sliding


def test_target_with_sliding_layer_types(tmp_path, draft_dir):
    target = write_folder(
        tmp_path, "t", llama_target(layer_types=["sliding_attention", "full_attention"] * 2, sliding_window=4096)
    )
    with pytest.raises(ConfigError, match="target with sliding-window layers"):
        make_plan(memd_config(target, draft_dir))
    assert make_plan(memd_config(target, draft_dir, draft_kv_ratio=1.0)).target.has_sliding_layers


def test_mistral_style_target_slides(tmp_path, draft_dir):
    target = write_folder(tmp_path, "t", llama_target(model_type="mistral", sliding_window=4096))
    with pytest.raises(ConfigError, match="target with sliding-window layers"):
        make_plan(memd_config(target, draft_dir))


def test_qwen2_style_target_with_sliding_window_off_is_accepted(tmp_path, draft_dir):
    target = write_folder(
        tmp_path, "t", llama_target(model_type="qwen2", sliding_window=4096, use_sliding_window=False)
    )
    plan = make_plan(memd_config(target, draft_dir))
    assert not plan.target.has_sliding_layers
    assert plan.bounded_draft


def test_target_with_sliding_window_null_is_accepted(tmp_path, draft_dir):
    target = write_folder(tmp_path, "t", llama_target(sliding_window=None))
    assert make_plan(memd_config(target, draft_dir)).bounded_draft


# --- unreadable geometry -------------------------------------------------------------------


def _without(key):
    cfg = dflash_draft()
    del cfg[key]
    return cfg


@pytest.mark.parametrize(
    "cfg,message",
    [
        (None, "no config.json"),
        ("{not json", "not valid JSON"),
        (dflash_draft(dflash_config={"target_layer_ids": [1], "mask_token_id": 2}), "dflash_config.block_size"),
        (_without("dflash_config"), "dflash_config.block_size"),
        (dflash_draft(dflash_config={"block_size": 0}), "dflash_config.block_size"),
        (_without("num_hidden_layers"), "num_hidden_layers"),
        (dflash_draft(num_hidden_layers="2"), "num_hidden_layers"),
        (dflash_draft(layer_types=["sliding_attention"]), "layer_types must list one type per layer"),
        (dflash_draft(torch_dtype="int8"), "unsupported dtype"),
    ],
    ids=[
        "missing",
        "invalid-json",
        "no-block-size",
        "no-dflash-config",
        "zero-block-size",
        "no-layers",
        "string-layers",
        "short-layer-types",
        "bad-dtype",
    ],
)
@pytest.mark.parametrize("ratio", [0.25, 1.0])
def test_unreadable_draft_geometry(tmp_path, target_dir, cfg, message, ratio):
    draft = write_folder(tmp_path, "d", cfg)
    with pytest.raises(ConfigError, match=message):
        make_plan(memd_config(target_dir, draft, draft_kv_ratio=ratio))


def test_unreadable_target_geometry(tmp_path, draft_dir):
    cfg = llama_target()
    del cfg["num_attention_heads"]
    target = write_folder(tmp_path, "t", cfg)
    with pytest.raises(ConfigError, match="num_attention_heads"):
        make_plan(memd_config(target, draft_dir))


def test_missing_target_folder(tmp_path, draft_dir):
    with pytest.raises(ConfigError, match="no config.json"):
        make_plan(memd_config(tmp_path / "nowhere", draft_dir))


# --- good plans ----------------------------------------------------------------------------


def test_good_plan_at_quarter_ratio(target_dir, draft_dir):
    cfg = memd_config(target_dir, draft_dir)
    plan = make_plan(cfg)
    sizes = plan.sizes
    assert plan.bounded_draft
    assert plan.block_size == BLOCK
    assert plan.window == 64
    assert plan.kv_dtype == "bfloat16"
    assert sizes.target_bytes_per_token == TARGET_COST
    assert sizes.draft_bytes_per_token == DRAFT_COST
    shape = DraftShape(DRAFT_COST, BLOCK, 64, 8, lookahead=cfg.decode_lookahead)
    assert sizes.request_cap == request_cap(shape, 1, 2, 32)
    assert sizes.draft_tokens >= sizes.request_cap
    sinks = TARGET_COST + DRAFT_COST
    assert sizes.target_tokens == (BUDGET - sinks) // (TARGET_COST + DRAFT_COST // 4)
    assert sizes.draft_tokens == sizes.target_tokens // 4
    assert sum(sizes.kv_bytes()) <= BUDGET


def test_plan_below_the_request_cap_names_a_minimum(target_dir, draft_dir):
    with pytest.raises(ConfigError, match=r"below the \d+ its running requests need.*Use at least ([0-9.]+)"):
        make_plan(memd_config(target_dir, draft_dir, draft_kv_ratio=0.001))


def test_good_plan_at_ratio_one(target_dir, draft_dir):
    plan = make_plan(memd_config(target_dir, draft_dir, draft_kv_ratio=1.0))
    assert plan.sizes.draft_tokens == plan.sizes.target_tokens
    assert plan.sizes.request_cap == 0
    assert not plan.bounded_draft
    assert plan.sizes.target_tokens == (BUDGET - TARGET_COST - DRAFT_COST) // (TARGET_COST + DRAFT_COST)


def test_plan_without_draft(target_dir):
    plan = make_plan(memd_config(target_dir, None, draft_kv_ratio=1.0, draft_window=None))
    assert plan.draft is None
    assert plan.block_size == 0
    assert plan.sizes.draft_tokens == 0
    assert plan.sizes.target_tokens == (BUDGET - TARGET_COST) // TARGET_COST


def test_plan_from_max_total_tokens(target_dir, draft_dir):
    plan = make_plan(memd_config(target_dir, draft_dir, kv_budget_bytes=None, max_total_tokens=4100, page_size=16))
    assert plan.sizes.target_tokens == 4096  # page-floored
    assert plan.sizes.draft_tokens == 1024
    assert plan.page_size == 16


def test_the_request_cap_is_sized_for_the_drafts_own_block(target_dir, draft_dir):
    plan = make_plan(memd_config(target_dir, draft_dir))
    assert plan.block_size == BLOCK
    assert plan.sizes.request_cap == request_cap(DraftShape(DRAFT_COST, BLOCK, 64, 8, lookahead=96), 1, 2, 32)


@pytest.mark.parametrize("ratio", [0.25, 1.0])
def test_float32_kv_doubles_bytes_per_token(target_dir, draft_dir, ratio):
    bf16 = make_plan(memd_config(target_dir, draft_dir, draft_kv_ratio=ratio, kv_cache_dtype="bfloat16"))
    auto_cuda = make_plan(
        memd_config(target_dir, draft_dir, draft_kv_ratio=ratio, device="cuda", kv_cache_dtype="auto")
    )
    auto_cpu = make_plan(memd_config(target_dir, draft_dir, draft_kv_ratio=ratio, kv_cache_dtype="auto"))
    fp32 = make_plan(memd_config(target_dir, draft_dir, draft_kv_ratio=ratio, kv_cache_dtype="float32"))
    # auto: the checkpoint's dtype on CUDA, float32 on CPU (where modeld computes in float32).
    assert auto_cuda.kv_dtype == bf16.kv_dtype == "bfloat16"
    assert auto_cpu.kv_dtype == fp32.kv_dtype == "float32"
    assert auto_cuda.sizes == bf16.sizes and auto_cpu.sizes == fp32.sizes
    assert fp32.sizes.target_bytes_per_token == 2 * bf16.sizes.target_bytes_per_token
    assert fp32.sizes.draft_bytes_per_token == 2 * bf16.sizes.draft_bytes_per_token
    # The same budget holds about half the tokens.
    assert fp32.sizes.target_tokens < bf16.sizes.target_tokens
    assert fp32.sizes.target_tokens == pytest.approx(bf16.sizes.target_tokens / 2, rel=0.01)


def test_auto_kv_dtype_follows_a_float32_target(tmp_path, draft_dir):
    target = write_folder(tmp_path, "t", llama_target(torch_dtype="float32"))
    plan = make_plan(memd_config(target, draft_dir, device="cuda", kv_cache_dtype="auto"))
    assert plan.kv_dtype == "float32"
    assert plan.sizes.target_bytes_per_token == 2 * TARGET_COST


# --- context length ------------------------------------------------------------------------


def test_context_length_defaults_to_max_position_embeddings(target_dir, draft_dir):
    plan = make_plan(memd_config(target_dir, draft_dir))
    assert plan.sizes.target_tokens > MAX_POSITIONS
    assert plan.context_len == MAX_POSITIONS


def test_context_length_capped_at_target_pool(target_dir, draft_dir):
    plan = make_plan(memd_config(target_dir, draft_dir, draft_kv_ratio=1.0, kv_budget_bytes=4_000_000))
    assert plan.sizes.target_tokens < MAX_POSITIONS
    assert plan.context_len == plan.sizes.target_tokens


def test_explicit_context_length(target_dir, draft_dir):
    plan = make_plan(memd_config(target_dir, draft_dir, context_length=1234))
    assert plan.context_len == 1234
    capped = make_plan(memd_config(target_dir, draft_dir, context_length=10**9))
    assert capped.context_len == capped.sizes.target_tokens


def test_context_length_needs_max_position_embeddings(tmp_path, draft_dir):
    cfg = llama_target()
    del cfg["max_position_embeddings"]
    target = write_folder(tmp_path, "t", cfg)
    with pytest.raises(ConfigError, match="max_position_embeddings"):
        make_plan(memd_config(target, draft_dir))
    assert make_plan(memd_config(target, draft_dir, context_length=512)).context_len == 512


# --- config_from_args ----------------------------------------------------------------------


@pytest.fixture
def argv(tmp_path, monkeypatch):
    """Arguments that keep config_from_args off the real runtime folder."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    monkeypatch.delenv("MEMD_STRICT", raising=False)
    return ["--device", "cpu", "--target-model", str(tmp_path / "t"), "--listen", "127.0.0.1:5555"]


@pytest.mark.parametrize(
    "flags",
    [
        ["--kv-budget-bytes", "1000", "--mem-fraction", "0.5"],
        ["--kv-budget-bytes", "1000", "--max-total-tokens", "100"],
        ["--mem-fraction", "0.5", "--max-total-tokens", "100"],
    ],
)
def test_budget_flags_are_mutually_exclusive(argv, flags, capsys):
    with pytest.raises(SystemExit) as raised:
        config_from_args(argv + flags)
    assert raised.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


@pytest.mark.parametrize(
    "flags,field,value",
    [
        (["--kv-budget-bytes", "1000"], "kv_budget_bytes", 1000),
        (["--mem-fraction", "0.5"], "mem_fraction", 0.5),
        (["--max-total-tokens", "100"], "max_total_tokens", 100),
    ],
)
def test_one_budget_flag(argv, flags, field, value):
    assert getattr(config_from_args(argv + flags), field) == value


def test_memd_config_refuses_two_budgets():
    with pytest.raises(ValueError, match="at most one of"):
        MemdConfig(kv_budget_bytes=1000, max_total_tokens=100)


@pytest.mark.parametrize("word", ["none", "None", "NONE"])
def test_draft_model_none(argv, word):
    assert config_from_args(argv + ["--draft-model", word]).draft_model is None


def test_draft_model_path(argv, tmp_path):
    cfg = config_from_args(argv + ["--draft-model", str(tmp_path / "d")])
    assert cfg.draft_model == str(tmp_path / "d")


def test_no_draft_pool_by_default_and_the_projects_draft_by_name(argv):
    from memd import defaults

    assert config_from_args(argv).draft_model is None
    assert config_from_args(argv + ["--draft-model", "default"]).draft_model == str(defaults.default_draft_dir())


def test_dflash_is_the_default_on_cuda_for_the_default_target(monkeypatch):
    """On CUDA with the default target and no draft flags: the shipped draft's bounded pool (ratio 0.25, the draft's
    own window, 256); any draft flag, another target or the CPU keep the old defaults."""
    from memd import defaults

    monkeypatch.delenv("MEMD_STRICT", raising=False)
    cuda = ["--device", "cuda", "--listen", "127.0.0.1:5555"]
    cfg = config_from_args(cuda)
    assert (cfg.draft_model, cfg.draft_kv_ratio, cfg.draft_window) == (str(defaults.default_draft_dir()), 0.25, 256)
    assert config_from_args(cuda + ["--draft-model", "none"]).draft_model is None
    assert config_from_args(cuda + ["--draft-kv-ratio", "0.5"]).draft_kv_ratio == 0.5
    explicit = config_from_args(cuda + ["--draft-model", "default"])
    assert (explicit.draft_kv_ratio, explicit.draft_window) == (1.0, None)  # asked for by name: the old default ratio
    assert config_from_args(cuda + ["--target-model", "/models/other"]).draft_model is None
    assert config_from_args(["--device", "cpu", "--listen", "127.0.0.1:5555"]).draft_model is None


def test_args_reach_the_config(argv):
    cfg = config_from_args(
        argv
        + ["--draft-kv-ratio", "0.25", "--draft-window", "64", "--page-size", "16", "--metrics-port", "0.0.0.0:9100"]
    )
    assert cfg.draft_kv_ratio == 0.25
    assert cfg.draft_window == 64
    assert cfg.page_size == 16
    assert (cfg.metrics_host, cfg.metrics_port) == ("0.0.0.0", 9100)
    assert cfg.listen == "127.0.0.1:5555"
    assert cfg.device == "cpu"
    assert cfg.strict is False


@pytest.mark.parametrize(
    "value,address", [("9100", ("127.0.0.1", 9100)), ("[::1]:0", ("::1", 0)), ("10.0.0.2:80", ("10.0.0.2", 80))]
)
def test_the_metrics_address_takes_an_optional_host(argv, value, address):
    cfg = config_from_args(argv + ["--metrics-port", value])
    assert (cfg.metrics_host, cfg.metrics_port) == address


@pytest.mark.parametrize("value", ["", "host:", "70000", "a:b", ":9100"])
def test_a_bad_metrics_address_is_refused(argv, value, capsys):
    with pytest.raises(SystemExit):
        config_from_args(argv + ["--metrics-port", value])
    assert "[HOST:]PORT" in capsys.readouterr().err


@pytest.mark.parametrize("value,strict", [("1", True), ("yes", True), ("0", False), ("", False)])
def test_memd_strict_env(argv, monkeypatch, value, strict):
    monkeypatch.setenv("MEMD_STRICT", value)
    assert config_from_args(argv).strict is strict


def test_strict_flag(argv):
    assert config_from_args(argv + ["--strict"]).strict is True


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--page-size", "0"], "--page-size must be >= 1"),
        (["--max-running-requests", "0"], "--max-running-requests must be >= 1"),
        (["--mem-fraction", "1.5"], r"--mem-fraction must be in \(0, 1\)"),
        (["--draft-window", "0"], "--draft-window must be > 0"),
        (["--kv-budget-bytes", "0"], "--kv-budget-bytes must be > 0"),
    ],
)
def test_bad_values_raise_value_error(argv, flags, message):
    with pytest.raises(ValueError, match=message):
        config_from_args(argv + flags)


@pytest.mark.parametrize(
    "flags,lookahead",
    [
        ([], 32),  # plain decoding
        (["--draft-model", "default"], 96),  # a draft pool: a replay of four verify blocks of 16 fits the spare
        (["--draft-model", "default", "--decode-lookahead", "32"], 32),
        (["--decode-lookahead", "0"], 0),
    ],
)
def test_decode_lookahead_defaults_by_the_draft(argv, flags, lookahead):
    assert config_from_args(argv + flags).decode_lookahead == lookahead
