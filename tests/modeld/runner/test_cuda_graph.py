"""CUDA graphs of decode and verify steps against the eager forward (GPU only).

A small Llama with random bf16 weights over paged pools laid out as memd lays them out. Three requests are
prefilled eagerly, then each decode / verify step runs twice over the same slots: eagerly, and as a graph padded into
a bucket of 4. Hidden states agree to bf16 rounding (the padded GEMMs may pick other kernels) and the greedy tokens are
the same; padding rows write no K/V. Re-binding to new pools (memd re-attached) captures the graphs again, and the
replays read the new pools. One request's prompt chunk replays a graph of one request, padded.
"""

import json

import pytest
import torch

from modeld.engine.step_items import StepItem
from modeld.model.loader import load_target
from modeld.request import Request
from modeld.runner.graphs import GraphRunner, batch_buckets, graph_shape, lone_sizes, replay_repeats
from modeld.runner.inputs import FIELDS
from modeld.runner.model_runner import ModelRunner
from modeld.sampling_params import SamplingParams
from tests.modeld.runner.paged import PagedPools

gpu = pytest.mark.gpu

CONFIG = dict(
    architectures=["LlamaForCausalLM"],
    model_type="llama",
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    hidden_act="silu",
    max_position_embeddings=1024,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    tie_word_embeddings=False,
    vocab_size=1000,
)
BLOCK = 4


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("graph-llama")
    (folder / "config.json").write_text(json.dumps(CONFIG))
    ours, _, cfg = load_target(str(folder), "bfloat16", "cuda", load_format="dummy")
    return ours, cfg


def cuda_pools(cfg):
    pools = PagedPools(cfg, pages=64, page_size=16, max_requests=8, dtype=torch.bfloat16)
    pools.kv, pools.req_to_token = pools.kv.cuda(), pools.req_to_token.cuda()
    return pools


def prefilled(model, pools, lengths=(9, 21, 5)):
    ours, cfg = model
    gen = torch.Generator().manual_seed(7)
    reqs = []
    for i, n in enumerate(lengths):
        prompt = torch.randint(0, cfg.vocab_size, (n,), generator=gen).tolist()
        req = Request(rid=f"r{i}", prompt_ids=prompt, params=SamplingParams(temperature=0))
        req.row = i + 1
        batch = pools.batch([(req.row, prompt)])
        for name, value in vars(batch).items():
            if isinstance(value, torch.Tensor):
                setattr(batch, name, value.cuda())
        hidden, _ = ours(batch, pools.kv)
        req.output_ids.append(int(ours.logits(hidden[-1:]).argmax()))
        req.computed = n
        reqs.append(req)
    return reqs


def step_items(pools, reqs, n):
    return [StepItem(r, n, r.row, pools.grow(r.row, n), verify=n > 1) for r in reqs]


def runners(model, pools):
    ours, _ = model
    bound = {"target_kv": pools.kv, "req_to_token": pools.req_to_token}
    eager = ModelRunner(ours, bound, "cuda", taps=(1, 2))
    graphs = ModelRunner(ours, bound, "cuda", taps=(1, 2), graphs=GraphRunner(8, (1, BLOCK), FIELDS, "cuda"))
    return eager, graphs


def run_both(eager, graphs, items, drafts=None):
    outs = []
    for runner in (eager, graphs):
        inputs = runner.prepare(items)
        if drafts is not None:
            inputs.put_drafts(drafts)
        outs.append((inputs.graph, runner.forward(inputs)))
    return outs


def assert_same_step(model, outs):
    ours, _ = model
    (g_eager, eager), (g_graph, graph) = outs
    assert g_eager is None and g_graph is not None
    torch.testing.assert_close(graph.hidden.float(), eager.hidden.float(), atol=3e-2, rtol=3e-2)
    for a, b in zip(graph.captured, eager.captured):
        torch.testing.assert_close(a.float(), b.float(), atol=3e-2, rtol=3e-2)
    assert torch.equal(ours.logits(graph.hidden).argmax(-1), ours.logits(eager.hidden).argmax(-1))
    if graph.greedy is not None:  # a decode graph's own argmax of every row
        assert torch.equal(graph.greedy, ours.logits(graph.hidden).argmax(-1))
    return ours.logits(graph.hidden).argmax(-1).tolist()


def test_buckets_cover_every_batch_size():
    for max_requests in (1, 3, 16, 64, 100, 300):
        buckets = batch_buckets(max_requests)
        assert buckets[-1] == max_requests and buckets == sorted(set(buckets))
        assert all(1 <= b <= max_requests for b in buckets)


def test_a_step_gets_the_smallest_graph_that_holds_it():
    """Which graph a step replays (graph_shape; no GPU needed): decodes and verify blocks of one count in a bucket,
    one request's prompt chunk padded up to a prompt graph or a verify block's, anything else eager."""
    buckets, per_request = batch_buckets(40), (1, BLOCK)
    lone = lone_sizes(per_request)
    assert lone == sorted({BLOCK, 16, 32, 64, 128})

    def shape(*q_lens):
        return graph_shape(list(q_lens), buckets, per_request, lone)

    assert shape(1) == (1, 1) and shape(*[1] * 3) == (4, 1) and shape(*[1] * 17) == (24, 1)
    assert shape(*[BLOCK] * 5) == (8, BLOCK)
    assert shape(2) == (1, BLOCK) and shape(BLOCK) == (1, BLOCK)  # a short chunk, and a lone verify block
    assert shape(BLOCK + 1) == (1, 16) and shape(33) == (1, 64) and shape(128) == (1, 128)
    assert shape(129) is None, "a chunk longer than the largest prompt graph"
    assert shape(1, BLOCK) is None and shape(3, 3) is None, "mixed counts, or several prompt chunks"
    assert shape(*[1] * 41) is None, "more requests than the largest bucket"
    assert shape() is None


@gpu
def test_padded_decode_and_verify_graphs_equal_eager(model):
    pools = cuda_pools(model[1])
    reqs = prefilled(model, pools)
    eager, graphs = runners(model, pools)
    sink_before = pools.kv[:, :, 0].clone()
    for _ in range(3):  # decode steps: 3 requests in the bucket of 4
        items = step_items(pools, reqs, 1)
        tokens = assert_same_step(model, run_both(eager, graphs, items))
        for r, t in zip(reqs, tokens):
            r.computed += 1
            r.output_ids.append(t)
    # a verify step: [last token, 3 drafts] per request, drafts placed on the device
    drafts = torch.randint(0, model[1].vocab_size, (len(reqs), BLOCK - 1), device="cuda")
    assert_same_step(model, run_both(eager, graphs, step_items(pools, reqs, BLOCK), drafts))
    assert torch.equal(pools.kv[:, :, 0].nan_to_num(7.0), sink_before.nan_to_num(7.0)), (
        "a padding row wrote K/V into the sink slot"
    )


@gpu
def test_a_prompt_chunk_padded_into_a_graph_of_one_request_equals_eager(model):
    """One request's prompt chunks (after what it computed already, as after a cached prefix) replay the smallest
    graph of one request that holds them, padded: the same hidden states and taps as eager; padding rows write no
    K/V; a chunk longer than the largest such graph runs eagerly."""
    pools = cuda_pools(model[1])
    prefilled(model, pools)  # rows 1-3
    eager, graphs = runners(model, pools)
    prompt = torch.randint(0, model[1].vocab_size, (160,), generator=torch.Generator().manual_seed(11)).tolist()
    req = Request(rid="chunked", prompt_ids=prompt, params=SamplingParams(temperature=0))
    req.row = 4
    sink_before = pools.kv[:, :, 0].clone()
    for n, shape in ((20, (1, 32)), (3, (1, BLOCK)), (37, (1, 64)), (100, (1, 128))):
        outs = run_both(eager, graphs, [StepItem(req, n, req.row, pools.grow(req.row, n))])
        assert outs[1][0] == shape
        assert_same_step(model, outs)
        req.computed += n
    assert graphs.graphs.shape_for([129]) is None
    assert torch.equal(pools.kv[:, :, 0].nan_to_num(7.0), sink_before.nan_to_num(7.0)), (
        "a padding row wrote K/V into the sink slot"
    )


@gpu
def test_rebind_to_new_pools_captures_again(model):
    pools = cuda_pools(model[1])
    reqs = prefilled(model, pools)
    eager, graphs = runners(model, pools)
    old = dict(graphs.graphs.graphs)  # held, so a new graph cannot take an old one's place
    moved = {"target_kv": pools.kv.clone(), "req_to_token": pools.req_to_token.clone()}
    pools.kv.fill_(float("nan"))  # the old pools die with the old memd: nothing may read them any more
    pools.kv, pools.req_to_token = moved["target_kv"], moved["req_to_token"]
    for runner in (eager, graphs):
        runner.bind(moved)
    assert all(graphs.graphs.graphs[shape][0] is not entry[0] for shape, entry in old.items())
    items = step_items(pools, reqs, 1)
    outs = run_both(eager, graphs, items)
    assert torch.isfinite(outs[1][1].hidden.float()).all()
    assert_same_step(model, outs)


@gpu
def test_decode_steps_in_one_replay_equal_single_replays(model):
    """Four greedy decode steps in one replay (inputs of steps 2-4 made on the device) against four replays of
    the single-step graph from the same K/V: the same tokens, the same K/V; one padding request writes nothing."""
    ours, _ = model
    pools = cuda_pools(model[1])
    reqs = prefilled(model, pools)
    bound = {"target_kv": pools.kv, "req_to_token": pools.req_to_token}
    runner = ModelRunner(
        ours, bound, "cuda", graphs=GraphRunner(8, (1,), FIELDS, "cuda", steps_per_replay=4, several_from=3)
    )
    assert sorted(runner.graphs.decode_steps) == [(b, k) for b in batch_buckets(8) for k in (2, 4)]
    for r in reqs:
        pools.grow(r.row, 4)  # memd's grant: four positions ahead, in req_to_token
        r.held = r.computed + 4
    start = [(r.computed, len(r.output_ids)) for r in reqs]
    before = pools.kv.clone()
    items = [StepItem(r, 1, r.row, pools.req_to_token[r.row, r.computed : r.computed + 1].tolist()) for r in reqs]
    inputs = runner.prepare(items)
    assert runner.steps_ahead(items, inputs) == 4
    reqs[0].held -= 1
    assert runner.steps_ahead(items, inputs) == 2, "a request short of slots still ran four steps"
    assert runner.steps_ahead(items[:2], inputs) == 1, "a batch under several_from ran several steps"
    multi = runner.graphs.replay_decode_steps(inputs.graph[0], 4)[:, : len(reqs)].T.tolist()
    after = pools.kv.clone()
    pools.kv.copy_(before)  # in place: the graphs hold its address
    single = [[] for _ in reqs]
    for _ in range(4):
        items = [StepItem(r, 1, r.row, pools.req_to_token[r.row, r.computed : r.computed + 1].tolist()) for r in reqs]
        inputs = runner.prepare(items)
        tokens = runner.forward(inputs).greedy.tolist()
        for r, t, out in zip(reqs, tokens, single):
            r.computed += 1
            r.output_ids.append(t)
            out.append(t)
    assert multi == single
    assert torch.equal(pools.kv.nan_to_num(7.0), after.nan_to_num(7.0))
    assert [(r.computed, len(r.output_ids)) for r in reqs] == [(c + 4, n + 4) for c, n in start]


def test_replays_run_powers_of_two_up_to_the_limit():
    assert replay_repeats(1) == [] and replay_repeats(2) == [2]
    assert replay_repeats(4) == [2, 4] and replay_repeats(6) == [2, 4, 6]
