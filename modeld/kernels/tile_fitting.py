"""Launching a Triton kernel with a tile the card's shared memory holds: the fused kernels (norm_linear,
norm_qkv_rotary) stage the residual's tiles beside the projection's, so a tile measured on one card (their
FUSED_TILES, ATTENTION_TILES) may need fewer pipeline stages on another."""

import logging

from triton.runtime.errors import OutOfResources

log = logging.getLogger(__name__)

# (kernel, N, K, its variant) -> the tile that compiled within this card's shared memory, or None if none did
_TILE_THAT_FITS: dict[tuple, tuple[int, int, int, int] | None] = {}


def launch_fitting(key: tuple, tile: tuple[int, int, int, int], launch):
    """launch(tile), or where the card's shared memory does not hold the tile, launch with fewer stages (down to 2);
    the tile that fitted is kept per key and used from then on. None (and a warning, once) where none fits: the
    caller runs the ops apart. A launch that does not fit fails when its kernel loads, before anything runs (in a
    CUDA graph's eager run, before its capture)."""
    if key in _TILE_THAT_FITS:
        kept = _TILE_THAT_FITS[key]
        return None if kept is None else launch(kept)
    block_n, block_k, warps, stages = tile
    for fewer in range(stages, 1, -1):
        try:
            out = launch((block_n, block_k, warps, fewer))
        except OutOfResources:
            continue
        _TILE_THAT_FITS[key] = (block_n, block_k, warps, fewer)
        return out
    log.warning("the fused kernel %s does not fit this GPU's shared memory: its ops run apart", key)
    _TILE_THAT_FITS[key] = None
    return None


def tile_in_use(key: tuple):
    """The tile launch_fitting settled on for this key after its first launch, or None where none fitted."""
    return _TILE_THAT_FITS[key]
