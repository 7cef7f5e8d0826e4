"""The prefix cache belongs to a model identity, end to end: memd (--strict) and three modelds on the CPU in fp32,
on tiny random Qwen3 targets of one shape (tests/tiny_models.py): `first`, `second` (other weights), and a
copy of `first` in another folder. modeld sends a fingerprint of its config, dtypes and weights at Attach
(modeld.model.fingerprint), and memd matches a session's prompts only against its own model's cached prefixes: `second`
finds nothing of `first`'s prompt and gives its own model's output, while the copy of `first` hits it. Capacity
shows a keyed digest of each model's fingerprint, never the fingerprint: a client that attaches under a digest it
read there caches its prefixes in a tree of its own, which no modeld reads."""

import random
import shutil

import pytest
import torch

import client
from memd.attach import MemdSession
from tests import tiny_models as tm
from tests.daemons import memd_args, run_memd, run_modeld

NEW_TOKENS = 8
PROMPT = random.Random(10).choices(range(1, 512), k=48)


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    root = tmp_path_factory.mktemp("identity-models")
    first = tm.write_random_target(root / "first", seed=0)
    second = tm.write_random_target(root / "second", seed=1)
    return first, second, shutil.copytree(first, root / "copy-of-first")


@torch.no_grad()
def hf_greedy(target, ids: list[int]) -> list[int]:
    """Argmax decoding past EOS by Hugging Face (the whole sequence each step): the model's own correct output."""
    model, out = tm.load_hf(target), []
    for _ in range(NEW_TOKENS):
        out.append(int(model(torch.tensor([ids + out])).logits[0, -1].argmax()))
    return out


def generate(address: str):
    """(cached tokens, output ids) of the prompt, greedy."""
    with client.Client(address, timeout=300) as c:
        result = c.generate(input_ids=PROMPT, max_new_tokens=NEW_TOKENS, temperature=0, ignore_eos=True)
    return result.cached_tokens, list(result.output_ids)


def test_a_model_matches_only_its_own_models_cached_prefixes(targets):
    first, second, copy = targets
    expected_first, expected_second = hf_greedy(first, PROMPT), hf_greedy(second, PROMPT)
    assert expected_first != expected_second, "the two models must disagree, or a served foreign prefix would not show"
    reusable = len(PROMPT) - 1  # at page 1, the whole prompt but its last token (always computed for its logits)
    with (
        run_memd(first, *memd_args(budget=4_000_000, max_running=4, chunk=64)) as memd,
        run_modeld(memd, "--target-model", str(first), name="first") as a,
        run_modeld(memd, "--target-model", str(second), name="second") as b,
        run_modeld(memd, "--target-model", str(copy), name="copy") as c,
    ):
        digests = {h.client_name + h.label: h.model_digest for h in memd.capacity().session_holdings}
        assert len(digests) == 3 and all(digests.values()) and len(set(digests.values())) == 2
        second_digest = next(d for d in digests.values() if list(digests.values()).count(d) == 1)

        assert generate(a.address) == (0, expected_first)
        assert generate(a.address) == (reusable, expected_first)  # first's prefix is cached for first
        with MemdSession(memd.address, "impostor", model_fingerprint=second_digest) as impostor:
            impostor.match_prefix("planted", PROMPT)  # what it cached would be its own KV for second's prompt
            impostor.alloc(extends=[("planted", 0, len(PROMPT))])
            impostor.free(finishes=["planted"], cache=[("planted", PROMPT)])
        assert generate(b.address) == (0, expected_second)  # never first's KV, nor the impostor's
        assert generate(b.address) == (reusable, expected_second)  # its own prefix, cached by itself now
        assert generate(c.address) == (reusable, expected_first)  # the same model from another folder
        memd.assert_idle_then_flush(timeout=10)
