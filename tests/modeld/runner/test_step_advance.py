"""The next step's inputs made on the device (modeld.runner.inputs.advance_inputs), against the values the host would pack: every
request moves on by what it committed, feeds back its last token, and reads its new positions' slots from
req_to_token; padding requests keep slot -1 and write nothing."""

import torch

from modeld.engine.step_items import StepItem
from modeld.request import Request
from modeld.runner.inputs import (
    FIELDS,
    IDS,
    KV_LENS,
    LENS,
    POSITIONS,
    ROWS,
    SLOTS,
    STARTS,
    advance_inputs,
    advances_on_device,
)
from modeld.sampling_params import SamplingParams


def packed(bucket, q, rows, starts, table):
    """Packed inputs as modeld.runner.model_runner packs a graph's step: the real requests first, then padding (row 0, slot -1)."""
    static = torch.zeros((FIELDS, bucket * q), dtype=torch.int64)
    static[SLOTS] = -1
    static[LENS, :bucket] = q
    for i, (row, start) in enumerate(zip(rows, starts)):
        static[ROWS, i], static[STARTS, i] = row, start
        static[POSITIONS, i * q : (i + 1) * q] = torch.arange(start, start + q)
        static[SLOTS, i * q : (i + 1) * q] = table[row, start : start + q].long()
    static[KV_LENS, :bucket] = static[STARTS, :bucket] + q
    return static


def table_of(rows=4, context=64):
    """Every (row, position) of rows 1.. a distinct slot (row 0 unused: zeros, as memd keeps it)."""
    table = torch.zeros((rows, context), dtype=torch.int32)
    table[1:] = torch.arange(1000, 1000 + (rows - 1) * context, dtype=torch.int32).view(rows - 1, context)
    return table


def test_a_verify_batch_moves_on_by_its_committed_lengths():
    table, q = table_of(), 4
    static = packed(4, q, rows=[1, 3, 2], starts=[5, 9, 0], table=table)
    committed = torch.tensor([3, 1, 4, 0])  # the padding request commits nothing
    last = torch.tensor([71, 72, 73, 99])
    advance_inputs(static, 4, q, committed, last, table)
    expected = packed(4, q, rows=[1, 3, 2], starts=[8, 10, 4], table=table)
    for field in (ROWS, STARTS, LENS, KV_LENS):
        assert torch.equal(static[field, :4], expected[field, :4]), field
    for field in (POSITIONS, SLOTS):  # the real requests' tokens
        assert torch.equal(static[field, : 3 * q], expected[field, : 3 * q]), field
    assert static[IDS].view(4, q)[:3, 0].tolist() == [71, 72, 73]
    assert static[SLOTS, 3 * q :].tolist() == [-1] * q, "a padding request got slots"
    assert static[POSITIONS, 3 * q :].tolist() == list(range(q)), "a padding request left row 0's first positions"


def test_decode_steps_feed_back_their_tokens_over_granted_slots():
    table = table_of()
    static = packed(2, 1, rows=[2], starts=[17], table=table)
    for step in range(3):
        advance_inputs(static, 2, 1, torch.ones(2, dtype=torch.int64), torch.tensor([40 + step, 0]), table)
        assert static[POSITIONS, 0] == 18 + step and static[STARTS, 0] == 18 + step
        assert static[SLOTS, 0] == table[2, 18 + step] and static[KV_LENS, 0] == 19 + step
        assert static[IDS, 0] == 40 + step
        assert static[SLOTS, 1] == -1


def test_only_decodes_verifies_and_a_prompts_last_token_advance_on_the_device():
    """The gate of several steps a replay (ModelRunner.steps_ahead): a prompt chunk as long as a DFLASH block
    replays the block's verify graph, but its next step is the rest of the prompt or a decode, not itself fed
    back; several steps of it ran a decode chain over a prompt."""
    block = 16
    prompt = Request(rid="p", prompt_ids=list(range(1, block + 1)), params=SamplingParams(temperature=0))
    chunk = StepItem(prompt, block, 1, list(range(block)))  # the whole prompt, block-long
    assert not advances_on_device([chunk])
    decoding = Request(rid="d", prompt_ids=[5, 6, 7], params=SamplingParams(temperature=0))
    decoding.output_ids.append(9)
    decoding.computed = 3  # the sampled token is pending
    decode = StepItem(decoding, 1, 2, [40])
    verify = StepItem(decoding, block, 2, list(range(40, 40 + block)), verify=True)
    last = Request(rid="l", prompt_ids=[5, 6, 7], params=SamplingParams(temperature=0))
    last.computed = 2  # the prompt's last token, alone
    assert advances_on_device([decode]) and advances_on_device([verify])
    assert advances_on_device([StepItem(last, 1, 3, [50])])
    assert not advances_on_device([decode, chunk]), "one prompt chunk in the batch still stepped on"
    last.computed = 1  # two prompt tokens left: a chunk of two
    assert not advances_on_device([StepItem(last, 2, 3, [50, 51])])
