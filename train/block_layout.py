"""Where every anchor's block reads, for one draft forward over a whole batch of blocks.

A training batch is laid out as two runs of rows:
- context rows: the batch's sequences one after another (position 0..n-1 of each), padded to a multiple of TILE;
  each row's K/V is the draft's context K/V of that token, projected once per position;
- block rows: every anchor's block (anchor a: the token at a, then block - 1 mask tokens at positions a+1 ..),
  anchors in (sequence, position) order, padded to a multiple of TILE with anchors of no sequence.

The queries are the block rows; the keys are the context rows followed by the block rows. The mask is exactly what
the draft sees at inference (modeld/spec/draft.py): a block row of anchor a at position a + k sees
- the context of its own sequence strictly before a (a is the last committed token: the target has not run
  there yet) and, on a sliding layer, within the window: (a + k) - p < window;
- its own block's rows, all of them (bidirectional), or those up to k when the draft is causal.
Padding anchors see only their own block, so no query row is fully masked.

The mask goes to flex attention as a BlockMask built from the tiles each query tile needs (its anchors' context
windows and its own block rows: about four key tiles of 128 where a dense mask would have thousands), so neither
the mask nor the scores are ever materialised in full.
"""

from dataclasses import dataclass

import numpy as np
import torch

TILE = 128  # flex attention's query and key tile (its BLOCK_SIZE)
NO_SEQUENCE_CONTEXT, NO_SEQUENCE_ANCHOR = -1, -2  # padding rows: a padding anchor never matches padding context
CONTEXT = "context"  # DeviceLayout's key (beside the draft's windows) of the target's mask over the context rows


@dataclass(frozen=True)
class BlockLayout:
    """Host arrays of one batch's layout (see the module's docstring)."""

    block: int
    context_seq: np.ndarray  # [context rows] sequence of each context row (NO_SEQUENCE_CONTEXT: padding)
    context_pos: np.ndarray  # [context rows] its position in the sequence
    anchor_seq: np.ndarray  # [anchors] sequence of each anchor (NO_SEQUENCE_ANCHOR: padding)
    anchor_pos: np.ndarray  # [anchors] the anchor's position in its sequence
    starts: np.ndarray  # [sequences] the first context row of each sequence
    real_anchors: int  # anchors before the padding

    @property
    def context_rows(self) -> int:
        return len(self.context_seq)

    @property
    def query_rows(self) -> int:
        return len(self.anchor_seq) * self.block


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def anchor_multiple(block: int) -> int:
    """The fewest anchors whose block rows fill whole tiles."""
    return TILE // np.gcd(TILE, block)


def build_layout(lengths, anchors, block: int, pad_anchors: int = 0, pad_context: int = 0) -> BlockLayout:
    """The layout of sequences of these lengths with these sorted anchors per sequence; the anchors padded to at
    least `pad_anchors` and the context rows to at least `pad_context` (fixed shapes, so that a compiled step is
    compiled once), each to a whole number of tiles."""
    lengths = np.asarray(lengths, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    total = int(lengths.sum())
    rows = round_up(max(total, pad_context, 1), TILE)
    context_seq = np.full(rows, NO_SEQUENCE_CONTEXT, dtype=np.int64)
    context_pos = np.zeros(rows, dtype=np.int64)
    context_seq[:total] = np.repeat(np.arange(len(lengths)), lengths)
    context_pos[:total] = np.arange(total) - np.repeat(starts, lengths)
    counts = [len(a) for a in anchors]
    real = sum(counts)
    count = round_up(max(real, pad_anchors, 1), anchor_multiple(block))
    anchor_seq = np.full(count, NO_SEQUENCE_ANCHOR, dtype=np.int64)
    anchor_pos = np.zeros(count, dtype=np.int64)
    if real:
        anchor_seq[:real] = np.repeat(np.arange(len(anchors)), counts)
        anchor_pos[:real] = np.concatenate([np.asarray(a, dtype=np.int64) for a in anchors])
    return BlockLayout(block, context_seq, context_pos, anchor_seq, anchor_pos, starts, real)


def key_tiles(layout: BlockLayout, window: int | None) -> tuple[np.ndarray, np.ndarray]:
    """(tiles per query tile [Q], their indices [Q, K]): the key tiles each query tile may read (the union of its
    anchors' context tiles, and the tiles of its own block rows), first in each row of K, the number of key tiles
    (BlockMask's layout: the rest of a row is ignored)."""
    block = layout.block
    index = np.arange(len(layout.anchor_seq))
    real = layout.anchor_seq >= 0
    has = real & (layout.anchor_pos > 0)  # an anchor at a sequence's first position sees no context
    seq = layout.anchor_seq[has]
    pos = layout.anchor_pos[has]
    first = layout.starts[seq] if len(seq) else np.zeros(0, dtype=np.int64)
    back = pos if window is None else np.minimum(pos, window - 1)
    lo_tile, hi_tile = (first + pos - back) // TILE, (first + pos - 1) // TILE
    span = int((hi_tile - lo_tile).max()) + 1 if len(seq) else 0
    tiles = lo_tile[:, None] + np.arange(span)
    wanted = tiles <= hi_tile[:, None]
    query_tiles, key_tiles_total = layout.query_rows // TILE, (layout.context_rows + layout.query_rows) // TILE
    listed = np.zeros((query_tiles, key_tiles_total), dtype=bool)  # which key tiles each query tile reads
    for query_row in (index * block, index * block + block - 1):  # a block may straddle two query tiles
        query_tile = np.broadcast_to((query_row[has] // TILE)[:, None], tiles.shape)
        listed[query_tile[wanted], tiles[wanted]] = True
    own = layout.context_rows // TILE  # the first key tile of the block rows: they lie as the query rows do
    rows = np.arange(layout.query_rows)
    listed[rows // TILE, own + (rows // block * block) // TILE] = True
    listed[rows // TILE, own + ((rows // block + 1) * block - 1) // TILE] = True
    query_tile, key_tile = np.nonzero(listed)  # row by row, each row's tiles in order
    counts = np.bincount(query_tile, minlength=query_tiles).astype(np.int32)
    indices = np.zeros(listed.shape, dtype=np.int32)
    slot = np.arange(len(query_tile)) - np.repeat(np.cumsum(counts) - counts, counts)
    indices[query_tile, slot] = key_tile
    return counts, indices


def context_tiles(layout: BlockLayout) -> tuple[np.ndarray, np.ndarray]:
    """key_tiles' tables for the target's attention over the context rows: each row sees the rows of its own sequence
    up to itself (padding rows: the padding up to themselves), so query tile t reads the key tiles from the one
    holding its first row's sequence start up to t."""
    real = int((layout.context_seq >= 0).sum())  # the real rows come first, then the padding
    starts = np.where(layout.context_seq >= 0, layout.starts[np.maximum(layout.context_seq, 0)], real)
    tiles = layout.context_rows // TILE
    t = np.arange(tiles)
    lo = starts[t * TILE] // TILE  # a tile's first row belongs to its earliest sequence
    counts = (t - lo + 1).astype(np.int32)
    indices = np.zeros((tiles, tiles), dtype=np.int32)  # BlockMask needs rows as wide as the key tiles
    slot = np.arange(tiles)
    indices[:] = np.where(slot <= t[:, None] - lo[:, None], lo[:, None] + slot, 0)
    return counts, indices


class DeviceLayout:
    """A layout's lookup tables on the device, the mask of each window over them, and each window's BlockMask.
    `update` copies another layout of the same shapes into the same tensors: the mask functions and the tensors
    they read keep their identity from step to step, so that compiled attention is compiled once."""

    def __init__(self, layout: BlockLayout, to_device, causal: bool):
        self.layout, self.to_device, self.causal = layout, to_device, causal
        self.context_seq, self.context_pos = to_device(layout.context_seq), to_device(layout.context_pos)
        self.anchor_seq, self.anchor_pos = to_device(layout.anchor_seq), to_device(layout.anchor_pos)
        self.visible: dict = {}  # window -> mask function (CONTEXT: the target's, over the context rows)
        self.tiles: dict = {}  # window -> (tiles per query tile, their indices) on the device
        self.masks: dict = {}  # window -> this layout's BlockMask

    def fits(self, layout: BlockLayout) -> bool:
        return (layout.block, layout.context_rows, len(layout.anchor_seq)) == (
            self.layout.block,
            self.layout.context_rows,
            len(self.layout.anchor_seq),
        )

    def update(self, layout: BlockLayout) -> None:
        assert self.fits(layout), "a layout of other shapes needs a DeviceLayout of its own"
        for name in ("context_seq", "context_pos", "anchor_seq", "anchor_pos"):
            getattr(self, name).copy_(self.to_device(getattr(layout, name)), non_blocking=True)
        self.layout, self.masks = layout, {}

    def mask_mod(self, window: int | None):
        if window not in self.visible:
            self.visible[window] = self._mask_mod(window)
        return self.visible[window]

    def _mask_mod(self, window: int | None):
        if window == CONTEXT:
            context_seq = self.context_seq

            def causal_within_sequence(b, h, q, kv):
                return (context_seq[q] == context_seq[kv]) & (kv <= q)

            return causal_within_sequence
        block, rows, causal = self.layout.block, self.layout.context_rows, self.causal
        context_seq, context_pos = self.context_seq, self.context_pos
        anchor_seq, anchor_pos = self.anchor_seq, self.anchor_pos

        def visible(b, h, q, kv):
            anchor, offset = q // block, q % block
            is_context = kv < rows
            c = torch.clamp(kv, max=rows - 1)
            p = context_pos[c]
            seen = is_context & (context_seq[c] == anchor_seq[anchor]) & (p < anchor_pos[anchor])
            if window is not None:
                seen = seen & (anchor_pos[anchor] + offset - p < window)
            j = torch.clamp(kv - rows, min=0)
            own = (~is_context) & (j // block == anchor)
            if causal:
                own = own & (j % block <= offset)
            return seen | own

        return visible

    def block_mask(self, window: int | None):
        if window not in self.masks:
            from torch.nn.attention.flex_attention import BlockMask

            counts, indices = context_tiles(self.layout) if window == CONTEXT else key_tiles(self.layout, window)
            held = self.tiles.get(window)
            if held is not None and held[1].shape == indices.shape:
                held[0].copy_(self.to_device(counts), non_blocking=True)
                held[1].copy_(self.to_device(indices), non_blocking=True)
            else:
                held = self.tiles[window] = (self.to_device(counts), self.to_device(indices))
            query, key = self.layout.query_rows, self.layout.context_rows + self.layout.query_rows
            if window == CONTEXT:
                query = key = self.layout.context_rows
            self.masks[window] = BlockMask.from_kv_blocks(
                held[0][None, None],
                held[1][None, None],
                BLOCK_SIZE=TILE,
                mask_mod=self.mask_mod(window),
                seq_lengths=(query, key),
            )
        return self.masks[window]
