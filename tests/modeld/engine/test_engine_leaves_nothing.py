"""A long-running engine keeps nothing of the requests it served: after a workload that queues, finishes at EOS and at
max_new_tokens, samples, speculates (a DFLASH draft's verify blocks and trims) and aborts requests both while they
wait and while they run, the engine's and the scheduler's per-request state is empty once memd is idle, before the
engine stops (a stop fails and flushes whatever is left, which would hide a leak). On the CPU, through a real memd
and the default model."""

from modeld.config import ModeldConfig
from modeld.engine.build import build_engine
from modeld.engine.loop import make_generator
from modeld.request import Request
from modeld.sampling_params import SamplingParams
from tests.daemons import memd_args, run_memd
from tests.modeld.engine.workloads import wait_until_released
from tests.tiny_models import write_draft


def request(rid: str, ids: list[int], i: int) -> Request:
    if i % 3 == 0:
        params = SamplingParams(max_new_tokens=10, temperature=0.8, top_p=0.95, seed=i)
    else:
        params = SamplingParams(max_new_tokens=1 if i % 5 == 1 else 12, temperature=0)
    return Request(
        rid=rid,
        prompt_ids=list(ids),
        params=params,
        generator=None if params.greedy else make_generator(params.seed, "cpu"),
    )


def test_nothing_of_a_served_workload_stays_in_the_engine(default_model, chat_ids, tmp_path):
    draft = write_draft(
        tmp_path / "draft", default_model, layers=1, block_size=4, target_layer_ids=(1, 15, 27), sliding_window=64
    )
    with run_memd(
        default_model, *memd_args(max_running=3, budget=60_000_000, chunk=512, draft=draft, window=64)
    ) as memd:
        built = build_engine(
            ModeldConfig(
                memd=memd.address,
                target_model=str(default_model),
                draft_model=str(draft),
                speculative_algorithm="dflash",
            ),
            lambda serving: None,
        )
        engine, sched = built.engine, built.engine.scheduler
        engine.start()
        try:
            reqs = [request(f"r{i}", chat_ids[i % len(chat_ids)], i) for i in range(10)]
            for req in reqs:
                assert engine.submit(req)
            assert engine.abort("r9"), "the last request, still waiting behind three running ones"
            while reqs[0].events.get(timeout=120)[0] != "chunk":
                pass
            engine.abort("r0")  # running: it has streamed a chunk (it may have finished meanwhile: then a no-op)
            for req in reqs:
                while req.events.get(timeout=120)[0] != "complete":
                    pass
            assert reqs[9].finish.reason == "abort"
            assert {req.finish.reason for req in reqs[1:9]} <= {"stop", "length"}
            assert any(req.spec_verify_ct for req in reqs), "no request was verified by the draft"
            wait_until_released(memd, engine)
            assert engine.requests == {} and engine.live == {}
            assert sched.running == [] and not sched.waiting
            memd = sched.memd
            assert memd.releases == [] and memd.cache == {} and memd.commits == {} and memd.trims == {}
            assert sched.left_out == {} and memd.in_flight is None
        finally:
            engine.stop()
            built.link.close()
