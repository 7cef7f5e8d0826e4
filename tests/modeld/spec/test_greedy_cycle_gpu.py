"""The greedy cycle graph (draft, target, argmax, acceptance and draft K/V of a whole verify step in one replay)
against the split path it replaces for greedy requests (draft graph, verify graph, the argmax of the target's
logits, acceptance, commit graph), on the same pools and inputs (GPU only): the same tokens, committed lengths,
target K/V and draft K/V; padding requests commit nothing and write nowhere. The decode graph's argmax of every row
equals the argmax of the logits of its hidden states."""

import pathlib

import pytest
import torch

from modeld.engine.step_items import StepItem
from modeld.model.loader import load_target
from modeld.request import Request
from modeld.runner.graphs import GraphRunner
from modeld.runner.inputs import FIELDS
from modeld.runner.model_runner import ModelRunner
from modeld.sampling_params import SamplingParams
from modeld.spec.draft import load_draft
from modeld.spec.worker import DflashWorker
from tests.modeld.runner.paged import PagedPools

pytestmark = pytest.mark.gpu

ROOT = pathlib.Path(__file__).resolve().parents[3]
TARGET = ROOT / "bench" / "configs" / "smollm2-135m"
DRAFT = ROOT / "modeld" / "default_draft"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    folder = tmp_path_factory.mktemp("draft")
    (folder / "config.json").write_text((DRAFT / "config.json").read_text())  # dummy weights from the config
    model, _, cfg = load_target(str(TARGET), "bfloat16", "cuda", load_format="dummy")
    draft = load_draft(str(folder), cfg, torch.bfloat16, "cuda", dummy=True)
    pools = PagedPools(cfg, pages=64, page_size=16, max_requests=8, dtype=torch.bfloat16)
    rows = pools.kv.shape[2]
    bound = {
        "target_kv": pools.kv.cuda().nan_to_num_(0.0),
        "req_to_token": pools.req_to_token.cuda(),
        "draft_kv": torch.zeros(
            (draft.config.num_hidden_layers, 2, rows, draft.config.num_key_value_heads, draft.config.head_dim),
            dtype=torch.bfloat16,
            device="cuda",
        ),
        "target_to_draft": torch.arange(rows, dtype=torch.int32, device="cuda"),  # slot s <-> draft slot s (0: none)
    }
    pools.kv, pools.req_to_token = bound["target_kv"], bound["req_to_token"]
    worker = DflashWorker(draft, model, bound)
    graphs = GraphRunner(8, (1, worker.block), FIELDS, "cuda", steps_per_replay=4, several_from=1, cycles_from=1)
    runner = ModelRunner(model, bound, "cuda", taps=worker.taps, graphs=graphs, spec=worker)
    worker.use_graphs(graphs)
    return model, cfg, pools, bound, worker, runner


def prefill(setup, rows, lengths):
    """Requests (in these req_to_token rows) whose prompts went through the target eagerly, leaving draft K/V."""
    model, cfg, pools, bound, worker, runner = setup
    gen = torch.Generator().manual_seed(3)
    reqs = []
    for row, n in zip(rows, lengths):
        prompt = torch.randint(0, cfg.vocab_size, (n,), generator=gen).tolist()
        req = Request(rid=f"r{row}", prompt_ids=prompt, params=SamplingParams(temperature=0))
        req.row = row
        items = [StepItem(req, n, req.row, pools.grow(req.row, n))]
        inputs = runner.prepare(items)
        out = runner.forward(inputs)
        worker.after_forward(inputs, out, None, None)
        req.output_ids.append(int(model.logits(out.hidden[-1:]).argmax()))
        req.computed = n
        reqs.append(req)
    return reqs


def split_path(setup, items):
    """The graphs of the split path; the LM head over the bucket's every row, as the cycle computes it (a GEMM of
    other rows may round a near-tie the other way)."""
    model, _, _, _, worker, runner = setup
    inputs = runner.prepare(items)
    drafts = worker.propose_into(inputs, max(item.req.computed for item in items))
    out = runner.forward(inputs)
    padded_hidden = runner.graphs.graphs[inputs.graph][1]
    target = model.logits(padded_hidden).argmax(dim=-1)[: len(out.hidden)]
    lengths = worker.after_forward(inputs, out, drafts, target)
    return target, lengths


def test_greedy_cycle_equals_the_split_path(setup):
    model, cfg, pools, bound, worker, runner = setup
    reqs = prefill(setup, rows=(1, 2, 3), lengths=(40, 75, 9))
    for step in range(3):
        items = [StepItem(r, worker.block, r.row, pools.grow(r.row, worker.block), verify=True) for r in reqs]
        before = {k: bound[k].clone() for k in ("target_kv", "draft_kv")}
        want_tokens, want_lengths = split_path(setup, items)
        after = {k: bound[k].clone() for k in ("target_kv", "draft_kv")}
        for k in before:
            bound[k].copy_(before[k])  # in place: the graphs hold these addresses
        inputs = runner.prepare(items)
        assert inputs.graph == (4, worker.block)  # 3 requests padded into the bucket of 4
        out = worker.replay_greedy_cycles(inputs, 1)[0]
        n, b = len(items), worker.block
        assert out.shape == (4 * b + 4,)
        assert torch.equal(out[: n * b], want_tokens)
        assert torch.equal(out[4 * b : 4 * b + n], want_lengths)
        assert out[4 * b + n :].tolist() == [0], "a padding request committed tokens"
        for k in after:
            assert torch.equal(bound[k], after[k]), f"{k} differs from the split path's after step {step}"
        blocks = want_tokens.view(n, b).tolist()
        for r, block, length in zip(reqs, blocks, want_lengths.tolist()):  # commit; drop the rejected positions' pages
            r.output_ids += block[:length]
            r.computed += length
            pools.lengths[r.row] = r.computed
            pools.pages[r.row] = pools.pages[r.row][: (r.computed + pools.P - 1) // pools.P]
    assert bound["draft_kv"][:, :, 0].eq(0).all(), "something wrote the sink slot's draft K/V"


def test_decode_graph_argmax_equals_the_logits_argmax(setup):
    model, cfg, pools, bound, worker, runner = setup
    reqs = prefill(setup, rows=(4, 5), lengths=(12, 30))
    items = [StepItem(r, 1, r.row, pools.grow(r.row, 1)) for r in reqs]
    inputs = runner.prepare(items)
    out = runner.forward(inputs)
    assert out.greedy is not None and out.greedy.shape == (2,)
    assert torch.equal(out.greedy, model.logits(out.hidden).argmax(dim=-1))


def test_cycles_in_one_replay_equal_single_cycles(setup):
    """Four greedy verify steps in one replay (each step's inputs made on the device from the one before) against
    four replays of the single-cycle graph from the same pools: the same tokens and committed lengths per step, the
    same target and draft K/V after; padding commits nothing."""
    model, cfg, pools, bound, worker, runner = setup
    reqs = prefill(setup, rows=(6, 7, 8), lengths=(20, 50, 11))
    b = worker.block
    for r in reqs:
        pools.grow(r.row, 4 * b)  # memd's grant: four blocks ahead, in req_to_token
        r.held = r.computed + 4 * b

    def items():
        return [
            StepItem(r, b, r.row, pools.req_to_token[r.row, r.computed : r.computed + b].tolist(), verify=True)
            for r in reqs
        ]

    before = {k: bound[k].clone() for k in ("target_kv", "draft_kv")}
    state = [(r.computed, list(r.output_ids)) for r in reqs]
    inputs = runner.prepare(items())
    assert runner.steps_ahead(items(), inputs) == 4
    multi = worker.replay_greedy_cycles(inputs, 4).clone()
    after = {k: bound[k].clone() for k in before}
    for k in before:
        bound[k].copy_(before[k])
    n = len(reqs)
    for step in range(4):  # the real requests' rows (a padding request's tokens are those of whatever it reads)
        out = worker.replay_greedy_cycles(runner.prepare(items()), 1)[0]
        assert torch.equal(multi[step, : n * b], out[: n * b]), f"step {step}'s tokens differ from a single cycle's"
        assert torch.equal(multi[step, 4 * b :], out[4 * b :]), f"step {step}'s lengths differ from a single cycle's"
        assert out[4 * b + n :].tolist() == [0], "a padding request committed tokens"
        blocks, lengths = out[: n * b].view(n, b).tolist(), out[4 * b : 4 * b + n].tolist()
        for r, block, length in zip(reqs, blocks, lengths):
            r.output_ids += block[:length]
            r.computed += length
    for k in after:
        assert torch.equal(bound[k].nan_to_num(7.0), after[k].nan_to_num(7.0)), f"{k} differs after the replay"
    assert all(r.computed > c for r, (c, _) in zip(reqs, state))


def test_a_block_long_prompt_replays_the_verify_graph_one_step_at_a_time(setup):
    """A prompt chunk exactly one block long has the verify graph's shape, and its request holds the positions of
    several blocks; still it runs one step (the step after a prompt chunk is not that chunk fed back)."""
    model, cfg, pools, bound, worker, runner = setup
    b = worker.block
    req = Request(rid="whole", prompt_ids=list(range(1, b + 1)), params=SamplingParams(temperature=0))
    req.row, req.held = 1, 4 * b
    items = [StepItem(req, b, req.row, [-1] * b)]  # packed only: nothing runs, nothing is written
    inputs = runner.prepare(items)
    assert inputs.graph == (1, b) and not inputs.verify
    assert runner.steps_ahead(items, inputs) == 1
