"""Decode steps chained on the device (modeld.runner.steps_ahead.decode_chain: each step's inputs made from the one before, one copy of
the tokens at the end) against the same steps one at a time, each packed on the host, from the same pools and
generators: the same tokens per step (greedy and seeded sampled requests in one batch), the same target K/V and,
with a DFLASH draft, the same draft context K/V. On the CPU the forward is eager; on the GPU it replays the one-step
graph of a padded bucket, and the padding request writes nothing. On the GPU, greedy requests of a target with a
draft also have one graph of k decode steps that writes the draft's context: it matches the steps one at a time too."""

import pathlib

import pytest
import torch

from modeld.engine.loop import make_generator
from modeld.engine.step_items import StepItem
from modeld.model.loader import load_target
from modeld.request import Request
from modeld.runner.graphs import GraphRunner
from modeld.runner.inputs import FIELDS
from modeld.runner.model_runner import ModelRunner
from modeld.runner.steps_ahead import decode_chain
from modeld.sampling_params import SamplingParams
from modeld.spec.draft import load_draft
from modeld.spec.worker import DflashWorker
from tests.modeld.runner.paged import PagedPools

ROOT = pathlib.Path(__file__).resolve().parents[3]
TARGET = ROOT / "bench" / "configs" / "smollm2-135m"
DRAFT = ROOT / "modeld" / "default_draft"
STEPS = 4
gpu = pytest.mark.gpu


@pytest.fixture(scope="module", params=["cpu", pytest.param("cuda", marks=gpu)])
def setup(request, tmp_path_factory):
    device = request.param
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    folder = tmp_path_factory.mktemp("draft")
    (folder / "config.json").write_text((DRAFT / "config.json").read_text())  # dummy weights from the config
    model, _, cfg = load_target(str(TARGET), str(dtype).removeprefix("torch."), device, load_format="dummy")
    draft = load_draft(str(folder), cfg, dtype, device, dummy=True)
    pools = PagedPools(cfg, pages=64, page_size=16, max_requests=12, dtype=dtype)
    rows = pools.kv.shape[2]
    bound = {
        "target_kv": pools.kv.to(device).nan_to_num_(0.0),
        "req_to_token": pools.req_to_token.to(device),
        "draft_kv": torch.zeros(
            (draft.config.num_hidden_layers, 2, rows, draft.config.num_key_value_heads, draft.config.head_dim),
            dtype=dtype,
            device=device,
        ),
        "target_to_draft": torch.arange(rows, dtype=torch.int32, device=device),  # slot s <-> draft slot s (0: none)
    }
    pools.kv, pools.req_to_token = bound["target_kv"], bound["req_to_token"]
    worker = DflashWorker(draft, model, bound)
    graphs = None
    if device == "cuda":  # one-step graphs only for the draft's taps: a chain serves several steps
        graphs = GraphRunner(
            8, (1, worker.block), FIELDS, "cuda", steps_per_replay=STEPS, several_from=1, cycles_from=1
        )
    runner = ModelRunner(model, bound, device, taps=worker.taps, graphs=graphs)
    if graphs is not None:
        worker.use_graphs(graphs)
    return device, model, cfg, pools, bound, worker, runner


def prefilled(setup, rows, lengths, params):
    """Requests whose prompts went through the target, leaving draft K/V, each holding STEPS positions ahead."""
    device, model, cfg, pools, bound, worker, runner = setup
    gen = torch.Generator().manual_seed(5)
    reqs = []
    for row, n, p in zip(rows, lengths, params):
        req = Request(
            rid=f"r{row}", prompt_ids=torch.randint(0, cfg.vocab_size, (n,), generator=gen).tolist(), params=p
        )
        req.row = row
        inputs = runner.prepare([StepItem(req, n, row, pools.grow(row, n))])
        out = runner.forward(inputs)
        worker.after_forward(inputs, out, None, None)
        req.output_ids.append(int(model.logits(out.hidden[-1:]).argmax()))
        req.computed = n
        pools.grow(row, STEPS)  # memd's grant: the positions the steps reach, in req_to_token
        req.held = n + STEPS
        reqs.append(req)
    return reqs


def decode_items(reqs, pools):
    return [StepItem(r, 1, r.row, pools.req_to_token[r.row, r.computed : r.computed + 1].tolist()) for r in reqs]


def one_at_a_time(runner, dflash, reqs, pools, params, gens) -> list[list[int]]:
    """The same steps as a chain of one step each, each packed on the host: the tokens per request."""
    single = [[] for _ in reqs]
    for _ in range(STEPS):
        inputs = runner.prepare(decode_items(reqs, pools))
        tokens = decode_chain(runner, dflash, inputs, params, gens, 1)[0].tolist()
        for r, t, out in zip(reqs, tokens, single):
            r.computed += 1
            r.output_ids.append(t)
            out.append(t)
    return single


def check_pools(bound, before, after, with_draft: bool) -> None:
    """The pools as the steps one at a time left them equal `after`; the draft's context written with a draft only;
    nothing wrote the sink slot."""
    for k in after:
        assert torch.equal(bound[k], after[k]), f"{k} after the chain differs from the steps one at a time"
    if with_draft:
        assert not torch.equal(bound["draft_kv"], before["draft_kv"]), "the steps wrote no draft context"
    else:
        assert torch.equal(bound["draft_kv"], before["draft_kv"]), "a chain without a draft wrote draft K/V"
    assert bound["draft_kv"][:, :, 0].eq(0).all() and bound["target_kv"][:, :, 0].eq(0).all(), (
        "something wrote the sink slot (a padding request writes nothing)"
    )


def restore(bound, before) -> None:
    for k in before:
        bound[k].copy_(before[k])  # in place: the graphs hold these addresses


@pytest.mark.parametrize("with_draft", [True, False], ids=["draft-context", "plain"])
def test_chained_steps_equal_steps_one_at_a_time(setup, with_draft):
    device, model, cfg, pools, bound, worker, runner = setup
    sampled = SamplingParams(temperature=0.8, top_p=0.95)
    params = [SamplingParams(temperature=0), sampled, SamplingParams(temperature=1.0, top_k=20)]
    first = 1 if with_draft else 4
    reqs = prefilled(setup, rows=(first, first + 1, first + 2), lengths=(20, 37, 9), params=params)
    seeds = (None, 11, 12)

    def generators():
        return [None if s is None else make_generator(s, device) for s in seeds]

    dflash = worker if with_draft else None
    before = {k: bound[k].clone() for k in ("target_kv", "draft_kv")}
    inputs = runner.prepare(decode_items(reqs, pools))
    if device == "cuda":
        assert inputs.graph == (4, 1), "3 requests padded into the bucket of 4"
        assert runner.steps_ahead(decode_items(reqs, pools), inputs) == STEPS
    chained = decode_chain(runner, dflash, inputs, params, generators(), STEPS).T.tolist()
    after = {k: bound[k].clone() for k in before}
    restore(bound, before)
    assert chained == one_at_a_time(runner, dflash, reqs, pools, params, generators())
    check_pools(bound, before, after, with_draft)


def test_one_graph_of_greedy_steps_writes_the_draft_context(setup):
    """Greedy requests of a target with a draft (speculation off for a large batch): one replay of the graph of
    STEPS decode steps gives the tokens, target K/V and draft context K/V of the steps one at a time."""
    device, model, cfg, pools, bound, worker, runner = setup
    if device != "cuda":
        pytest.skip("graphs of k decode steps exist on CUDA only")
    params = [SamplingParams(temperature=0)] * 3
    reqs = prefilled(setup, rows=(7, 8, 9), lengths=(33, 5, 18), params=params)
    before = {k: bound[k].clone() for k in ("target_kv", "draft_kv")}
    inputs = runner.prepare(decode_items(reqs, pools))
    assert inputs.graph == (4, 1) and runner.graphs.has_decode_steps(inputs.graph[0], STEPS)
    fused = runner.graphs.replay_decode_steps(inputs.graph[0], STEPS)[:, :3].T.tolist()
    after = {k: bound[k].clone() for k in before}
    restore(bound, before)
    assert fused == one_at_a_time(runner, worker, reqs, pools, params, [None] * 3)
    check_pools(bound, before, after, with_draft=True)


def test_a_decode_replay_writes_the_draft_context_through_its_graph(setup):
    """A one-step decode replay of a target with a draft: the context graph writes the same draft K/V as the eager
    write of the step's rows (it did that eagerly before: about 25 launches a step)."""
    device, model, cfg, pools, bound, worker, runner = setup
    if device != "cuda":
        pytest.skip("graphs exist on CUDA only")
    reqs = prefilled(setup, rows=(10, 11), lengths=(21, 6), params=[SamplingParams(temperature=0)] * 2)
    before = bound["draft_kv"].clone()
    inputs = runner.prepare(decode_items(reqs, pools))
    assert inputs.graph == (2, 1)
    out = runner.forward(inputs)
    worker.after_forward(inputs, out, None, None)
    graphed = bound["draft_kv"].clone()
    bound["draft_kv"].copy_(before)
    rows = out.rows_of([0, 1])
    worker.write_context([c[rows] for c in out.captured], out.positions[rows], out.slots[rows])
    assert not torch.equal(graphed, before), "the context graph wrote nothing"
    assert torch.equal(bound["draft_kv"], graphed)
    assert graphed[:, :, 0].eq(0).all(), "a padding row wrote the sink slot"
