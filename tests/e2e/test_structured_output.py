"""Constrained generation and log probabilities end to end: memd (--strict) with the default model's DFLASH draft,
and two modelds on it, DFLASH (verifying at every step) and plain: on the CPU in fp32, and on CUDA in bf16 (marked gpu).

- Every output of every schema of tests/modeld/grammar/schemas.py is valid JSON that its schema accepts, greedy and
  sampled, with DFLASH and without; greedy output with a constraint is the same with DFLASH as without it.
- Regex and "any JSON object" constraints; bad constraints get INVALID_ARGUMENT saying what is wrong.
- Log probabilities equal Hugging Face's log-softmax at the same positions (after temperature; after the grammar's
  mask under a constraint), streamed and in the complete message alike.
memd's pools are free (but for the prefix cache) after every test."""

import concurrent.futures
import json
from collections import Counter

import jsonschema
import pytest
import torch

import client
from memd.defaults import default_draft_dir
from tests.daemons import run_memd, run_modeld
from tests.modeld.grammar.schemas import SCHEMAS

MAX_NEW = 96
TIMEOUT = 600
# fp32 on the CPU, bf16 on CUDA on both sides; the batch shapes differ (a verify block against HF's one forward)
LOGPROB_TOLERANCE = {"cpu": 2e-3, "cuda": 0.1}


@pytest.fixture(scope="module", params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def modelds(request, default_model):
    device = request.param
    args = [
        "--page-size",
        "16",
        "--max-running-requests",
        "8",
        "--max-total-tokens",
        "32768",
        "--draft-model",
        str(default_draft_dir()),
        "--kv-cache-dtype",
        "float32" if device == "cpu" else "bfloat16",
        "--strict",
    ]
    target = ["--target-model", str(default_model)]
    dflash = ["--draft-model", str(default_draft_dir())]
    with (
        run_memd(default_model, *args, device=device) as memd,
        run_modeld(memd, *target, *dflash, device=device, tuning="adaptive_speculation=false") as a,
        run_modeld(memd, *target, "--speculative-algorithm", "none", device=device, name="plain") as b,
    ):
        with client.Client(a.address, timeout=TIMEOUT) as dflash, client.Client(b.address, timeout=TIMEOUT) as plain:
            yield memd, {"dflash": dflash, "plain": plain}, device


@pytest.fixture
def reference(modelds, hf_models):
    """The Hugging Face model in the daemons' precision (fp32 on the CPU, bf16 on CUDA)."""
    return hf_models(modelds[2])


@pytest.fixture(autouse=True)
def idle_then_free_after(modelds):
    yield
    modelds[0].assert_idle_then_flush(timeout=10)


def ask(schema: dict) -> list[dict]:
    return [{"role": "user", "content": f"Answer with JSON matching this schema: {json.dumps(schema)}"}]


def run_all(c: client.Client, **sampling) -> dict[str, client.GenerateResult]:
    def one(name: str) -> client.GenerateResult:
        schema = SCHEMAS[name][0]
        return c.generate(messages=ask(schema), json_schema=schema, max_new_tokens=MAX_NEW, **sampling)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        return dict(zip(SCHEMAS, pool.map(one, SCHEMAS)))


@pytest.fixture(scope="module")
def greedy_outputs(modelds) -> dict[str, dict[str, client.GenerateResult]]:
    return {kind: run_all(c, temperature=0) for kind, c in modelds[1].items()}


def assert_valid(results: dict[str, client.GenerateResult]) -> None:
    """Every output ended where its grammar did and is a JSON value its schema accepts (all failures listed)."""
    assert len(results) >= 20
    failures = []
    for name, result in results.items():
        try:
            assert result.finish_reason == "stop", f"finish {result.finish_reason}"
            jsonschema.validate(json.loads(result.text), SCHEMAS[name][0])
        except (AssertionError, ValueError, jsonschema.ValidationError) as exc:
            failures.append(f"{name}: {result.text!r}: {str(exc).splitlines()[0]}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("kind", ["dflash", "plain"])
def test_greedy_outputs_match_their_schemas(greedy_outputs, kind):
    assert_valid(greedy_outputs[kind])


@pytest.mark.parametrize("kind", ["dflash", "plain"])
def test_sampled_outputs_match_their_schemas(modelds, kind):
    assert_valid(run_all(modelds[1][kind], temperature=1.0, seed=7))


def test_greedy_output_with_a_constraint_is_the_same_with_dflash(greedy_outputs):
    dflash, plain = greedy_outputs["dflash"], greedy_outputs["plain"]
    assert {name: r.output_ids for name, r in dflash.items()} == {name: r.output_ids for name, r in plain.items()}
    verified = sum(r.spec_verify_ct for r in dflash.values())
    drafted = sum(r.completion_tokens for r in dflash.values())
    assert verified > 0 and drafted > verified, "DFLASH verified no block, or accepted no draft under the grammars"


@pytest.mark.parametrize("kind", ["dflash", "plain"])
def test_regex_and_any_json_object(modelds, kind):
    c = modelds[1][kind]
    ask_code = [{"role": "user", "content": "Give me a product code."}]
    coded = c.generate(messages=ask_code, regex="[A-Z]{2}-[0-9]{3}", temperature=0, max_new_tokens=16)
    assert coded.finish_reason == "stop" and len(coded.text) == 6 and coded.text[2] == "-", coded.text
    assert coded.text[:2].isupper() and coded.text[3:].isdigit(), coded.text
    anything = c.generate(messages=ask({"type": "object"}), json_object=True, temperature=0, max_new_tokens=MAX_NEW)
    assert anything.finish_reason == "stop" and isinstance(json.loads(anything.text), dict), anything.text


BAD = {
    "not JSON": (dict(json_schema="{not json"), "json_schema is not JSON"),
    "not an object": (dict(json_schema="[1, 2]"), "json_schema must be a JSON object"),
    "unknown type": (dict(json_schema={"type": "frobnicate"}), 'Unsupported type "frobnicate"'),
    "dangling ref": (dict(json_schema={"$ref": "#/nowhere"}), "does not compile"),
    "bad regex": (dict(regex="(yes|no"), "regex constraint does not compile"),
    "too large": (dict(regex="a" * (65 << 10)), "more than 65536"),
    "with ignore_eos": (dict(json_object=True, ignore_eos=True), "ignore_eos"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_constraints_are_invalid_argument(modelds, case):
    memd, clients, _ = modelds
    arguments, message = BAD[case]
    for c in clients.values():
        with pytest.raises(client.InvalidArgument, match=message):
            c.generate(messages=ask({}), max_new_tokens=8, **arguments)
    cap = memd.capacity()
    assert cap.target.held_by_requests == 0 and cap.draft.held_by_requests == 0, cap


def hf_logprobs(hf_model, prompt: list[int], output: list[int], temperature: float, masks=None) -> torch.Tensor:
    """Hugging Face's log-softmax [len(output), V] (fp32 model, float64 softmax) at each output position, after
    temperature and, where masks ([len(output), V] bool) are given, the mask."""
    with torch.no_grad():
        ids = torch.tensor([prompt + output], device=hf_model.device)
        logits = hf_model(ids).logits[0, len(prompt) - 1 : -1].double().cpu() / temperature
    if masks is not None:
        logits = logits.masked_fill(~masks, float("-inf"))
    return torch.log_softmax(logits, dim=-1)


def assert_logprobs_match(result: client.GenerateResult, reference: torch.Tensor, top: int, tolerance: float) -> None:
    assert len(result.logprobs) == len(result.output_ids) > 0
    for position, (token, entry) in enumerate(zip(result.output_ids, result.logprobs)):
        assert entry.token_id == token
        assert abs(entry.logprob - float(reference[position, token])) < tolerance, (position, entry)
        assert len(entry.top) == min(top, int(torch.isfinite(reference[position]).sum()))
        for rank, alternative in enumerate(entry.top):
            assert abs(alternative.logprob - float(reference[position, alternative.token_id])) < tolerance, (
                position,
                rank,
            )
        expected = reference[position].topk(len(entry.top)).values.tolist()
        assert [a.logprob for a in entry.top] == pytest.approx(expected, abs=tolerance)
    assert "".join(entry.token for entry in result.logprobs).startswith(result.text)  # (then a stop token's text)


@pytest.mark.parametrize("kind", ["dflash", "plain"])
@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_logprobs_equal_hf_log_softmax(modelds, reference, chat_ids, kind, temperature):
    c = modelds[1][kind]
    prompt = chat_ids[1]
    result = c.generate(
        input_ids=prompt, max_new_tokens=24, temperature=temperature, seed=3, logprobs=True, top_logprobs=5
    )
    tolerance = LOGPROB_TOLERANCE[modelds[2]]
    expected = hf_logprobs(reference, prompt, list(result.output_ids), temperature or 1.0)
    assert_logprobs_match(result, expected, 5, tolerance)
    with c.stream(
        input_ids=prompt, max_new_tokens=24, temperature=temperature, seed=3, logprobs=True, top_logprobs=5
    ) as handle:
        chunks = list(handle)
    streamed = [entry for chunk in chunks for entry in chunk.logprobs]
    assert streamed == list(handle.result.logprobs)  # the chunks' entries are the complete message's
    assert [e.token_id for e in streamed] == list(result.output_ids)  # the prompt came from the cache this time
    assert_logprobs_match(handle.result, expected, 5, tolerance)


@pytest.mark.parametrize("kind", ["dflash", "plain"])
def test_logprobs_under_a_constraint_are_of_the_masked_distribution(modelds, reference, tokenizer, kind):
    from modeld.grammar.compiler import GrammarCompiler
    from modeld.grammar.mask import apply_bitmask
    from modeld.grammar.matcher import RequestGrammar, bitmask_rows
    from modeld.sampling_params import Constraint

    schema = SCHEMAS["person"][0]
    messages = ask(schema)
    result = modelds[1][kind].generate(
        messages=messages, json_schema=schema, max_new_tokens=MAX_NEW, temperature=0, logprobs=True, top_logprobs=3
    )
    vocab = reference.config.vocab_size
    compiler = GrammarCompiler(tokenizer, vocab, {tokenizer.eos_token_id})
    grammar = RequestGrammar(compiler.compile(Constraint("json_schema", json.dumps(schema))))
    output = list(result.output_ids)
    bitmask = bitmask_rows(len(output), vocab)
    for position, token in enumerate(output):
        grammar.fill(bitmask, position)
        grammar.advance([token])
    masks = torch.isfinite(apply_bitmask(torch.zeros(len(output), vocab), bitmask))
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    expected = hf_logprobs(reference, list(prompt), output, 1.0, masks)
    assert_logprobs_match(result, expected, 3, LOGPROB_TOLERANCE[modelds[2]])
    assert any(int(m.sum()) < 50 for m in masks), "the grammar masked nothing: the test did not exercise the mask"


CHOICES = "(yes|no|maybe)"
N_SAMPLES = 600  # requests per modeld


def exact_choice_probs(hf_model, tokenizer, prompt: list[int], temperature: float) -> dict[str, float]:
    """The masked target's exact distribution of the answer: every token path the grammar allows, each step's
    probability from Hugging Face's logits (fp32, float64 softmax) under the grammar's mask at temperature."""
    from modeld.grammar.compiler import GrammarCompiler
    from modeld.grammar.mask import apply_bitmask
    from modeld.grammar.matcher import RequestGrammar, bitmask_rows
    from modeld.sampling_params import Constraint

    vocab = hf_model.config.vocab_size
    stop = {tokenizer.eos_token_id}
    grammar = RequestGrammar(GrammarCompiler(tokenizer, vocab, stop).compile(Constraint("regex", CHOICES)))
    probs: dict[str, float] = {}

    def walk(path: list[int], mass: float) -> None:
        bitmask = bitmask_rows(1, vocab)
        grammar.fill(bitmask, 0)
        with torch.no_grad():
            logits = hf_model(torch.tensor([prompt + path])).logits[0, -1:].double() / temperature
        p = torch.softmax(apply_bitmask(logits, bitmask), dim=-1)[0]
        for token in torch.nonzero(p > 1e-12).flatten().tolist():
            if token in stop:
                text = tokenizer.decode(path)
                probs[text] = probs.get(text, 0.0) + mass * float(p[token])
                continue
            assert grammar.matcher.accept_token(token)
            walk(path + [token], mass * float(p[token]))
            grammar.matcher.rollback(1)

    walk([], 1.0)
    return probs


def test_sampling_under_a_constraint_keeps_the_masked_distribution(modelds, hf_model, tokenizer):
    """N_SAMPLES answers constrained to yes/no/maybe at temperature 1, with distinct seeds, with DFLASH and without:
    chi-square tests at significance ALPHA (two-sample, and each against the exact masked distribution)."""
    from tests.modeld.spec.test_dflash_e2e import ALPHA, goodness_of_fit, two_sample_chi2

    messages = [{"role": "user", "content": "Will it rain tomorrow? Answer yes, no or maybe."}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)

    def answers(c: client.Client, seeds: range) -> Counter:
        def one(seed: int) -> str:
            return c.generate(input_ids=prompt, regex=CHOICES, temperature=1.0, seed=seed, max_new_tokens=8).text

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            return Counter(pool.map(one, seeds))

    dflash = answers(modelds[1]["dflash"], range(1000, 1000 + N_SAMPLES))
    plain = answers(modelds[1]["plain"], range(5000, 5000 + N_SAMPLES))
    exact = exact_choice_probs(hf_model, tokenizer, list(prompt), 1.0)
    assert set(dflash) | set(plain) <= {"yes", "no", "maybe"} and abs(sum(exact.values()) - 1) < 1e-6, exact
    checks = {
        "dflash vs plain": two_sample_chi2(dflash, plain),
        "dflash vs exact": goodness_of_fit(dflash, exact),
        "plain vs exact": goodness_of_fit(plain, exact),
    }
    table = f"dflash {dict(dflash)}, plain {dict(plain)}, exact {exact}\n" + "\n".join(
        f"{name}: chi2 {stat:.2f}, df {df}, p {p:.4g}" for name, (stat, df, p) in checks.items()
    )
    print(table)
    assert all(df >= 1 for _, df, _ in checks.values()), f"one answer dominates: nothing was tested\n{table}"
    assert all(p >= ALPHA for _, _, p in checks.values()), table
