"""KV geometry read from a Hugging Face style folder's config.json, never guessed."""

import dataclasses
import json
import pathlib
from dataclasses import dataclass

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


class GeometryError(ValueError):
    """A model folder whose KV geometry cannot be read."""


@dataclass(frozen=True)
class ModelGeometry:
    path: str
    layers: int
    kv_heads: int
    head_dim: int
    dtype: str
    layer_types: tuple[str, ...]
    sliding_window: int | None
    block_size: int | None  # DFLASH drafts only

    def kv_bytes_per_token(self, dtype: str) -> int:
        """K and V rows over every layer, in `dtype`."""
        return 2 * self.layers * self.kv_heads * self.head_dim * DTYPE_BYTES[dtype]

    def shard(self, ranks: int, role: str) -> "ModelGeometry":
        """One tensor-parallel rank's share: kv_heads / ranks heads (GeometryError when they do not split evenly)."""
        if self.kv_heads % ranks:
            raise GeometryError(
                f"the {role}'s {self.kv_heads} KV heads do not split evenly over {ranks} tensor-parallel ranks "
                f"({self.path}): use a tensor-parallel size that divides {self.kv_heads}"
            )
        return dataclasses.replace(self, kv_heads=self.kv_heads // ranks)

    @property
    def has_sliding_layers(self) -> bool:
        return "sliding_attention" in self.layer_types

    @property
    def all_sliding(self) -> bool:
        return bool(self.layer_types) and all(t == "sliding_attention" for t in self.layer_types)


def _require_int(cfg: dict, key: str, where: str) -> int:
    value = cfg.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise GeometryError(f"{where}: config.json needs a positive integer '{key}', got {value!r}")
    return value


def _config_dtype(cfg: dict) -> str:
    dtype = cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"
    if dtype not in DTYPE_BYTES:
        raise GeometryError(f"unsupported dtype {dtype!r} in config.json")
    return dtype


def _layer_types(cfg: dict, layers: int, where: str) -> tuple[str, ...]:
    """Explicit layer_types when given; else derived from the sliding-window keys."""
    types = cfg.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != layers:
            raise GeometryError(f"{where}: layer_types must list one type per layer ({layers}), got {types!r}")
        return tuple(types)
    window = cfg.get("sliding_window")
    # Qwen2/Qwen3 carry sliding_window with use_sliding_window: false; Mistral-style
    # configs carry sliding_window alone and slide on every layer.
    slides = window is not None and cfg.get("use_sliding_window", True)
    return ("sliding_attention" if slides else "full_attention",) * layers


def read_config(folder: str | pathlib.Path) -> dict:
    path = pathlib.Path(folder) / "config.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise GeometryError(f"no config.json in {folder}") from None
    except json.JSONDecodeError as exc:
        raise GeometryError(f"{path} is not valid JSON: {exc}") from None


def read_geometry(folder: str | pathlib.Path, *, draft: bool = False) -> ModelGeometry:
    """Geometry of a target (draft=False) or a DFLASH draft (draft=True)."""
    cfg = read_config(folder)
    where = f"{'draft' if draft else 'target'} {folder}"
    layers = _require_int(cfg, "num_hidden_layers", where)
    heads = _require_int(cfg, "num_attention_heads", where)
    kv_heads = cfg.get("num_key_value_heads", heads)
    if not isinstance(kv_heads, int) or kv_heads <= 0:
        raise GeometryError(f"{where}: bad num_key_value_heads {kv_heads!r}")
    head_dim = cfg.get("head_dim") or _require_int(cfg, "hidden_size", where) // heads
    window = cfg.get("sliding_window")
    block_size = None
    if draft:
        dflash = cfg.get("dflash_config") or {}
        block_size = dflash.get("block_size", cfg.get("block_size"))
        if not isinstance(block_size, int) or block_size <= 0:
            raise GeometryError(f"{where}: a DFLASH draft needs dflash_config.block_size, got {block_size!r}")
    return ModelGeometry(
        path=str(folder),
        layers=layers,
        kv_heads=kv_heads,
        head_dim=int(head_dim),
        dtype=_config_dtype(cfg),
        layer_types=_layer_types(cfg, layers, where),
        sliding_window=window if isinstance(window, int) else None,
        block_size=block_size,
    )
