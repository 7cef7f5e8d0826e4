"""DFLASH speculative decoding end to end, black box: memd (--strict) and modeld as separate processes on
the CPU in fp32, tiny random models written to disk by tests/tiny_models.py, requests by token ids.

- Greedy losslessness: with --speculative-algorithm dflash the output equals plain decoding (the same
  target, --speculative-algorithm none) token for token, one request at a time and six at once, at page
  size 1 and 64, draft KV ratio 1 and 0.25 (sliding-window draft pool), with a random draft that is
  almost never accepted and with a "friendly" draft that is accepted often.
- A generation of many windows at ratio 0.25 holds a bounded number of draft slots (memd's Capacity,
  polled while it streams) while its target slots grow, and still equals plain decoding.
- Sampling losslessness: distributions of sampled continuations with and without DFLASH agree
  (chi-square tests, significance 1e-4 each; see test_sampling_distribution_is_unchanged).
- Speculation metrics of GenerateResult and GetInfo.
- modeld refuses drafts that do not fit the target, with a message.
memd's pools are fully free after every test (autouse check) and when each memd stops (run_memd).
"""

import concurrent.futures
import contextlib
import math
import pathlib
import random
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass

import pytest
import torch

import client
from tests import tiny_models as tm
from tests.daemons import run_memd, run_modeld

MAX_NEW = 40
PROMPT_LENGTHS = (5, 16, 27, 38, 49, 60)
CHUNK = 32  # memd's prefill chunk, and so modeld's: prompts longer than this are prefilled in pieces
MAX_RUNNING = 16
LOOKAHEAD = 32  # the pools below are sized for it (memd's default with a draft, 96, needs larger ones)
EVICTION_INTERVAL = 1
TIMEOUT = 600


# --- models and daemons --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Setup:
    target: str  # key of `models`
    draft: str  # key of `models`
    page: int
    ratio: float
    window: int | None  # --draft-window (needed below ratio 1)
    tokens: int  # --max-total-tokens (target pool)


SETUPS = {
    # ratio 1: a draft slot per target slot; the draft's own sliding window (64) is not enforced by memd.
    "random-page1-ratio1": Setup("random", "random-w64-b4", page=1, ratio=1.0, window=None, tokens=8192),
    # ratio 0.25: the draft pool holds a window of 32 per request, block 8.
    "random-page64-ratio0.25": Setup("random", "random-w32-b8", page=64, ratio=0.25, window=32, tokens=16384),
    "random-page1-ratio0.25": Setup("random", "random-w32-b8", page=1, ratio=0.25, window=32, tokens=8192),
    # the friendly draft is accepted often: whole blocks and parts of blocks are committed.
    "friendly-page1-ratio0.25": Setup("friendly", "friendly-w32-b4", page=1, ratio=0.25, window=32, tokens=8192),
    "friendly-page16-ratio1": Setup("friendly", "friendly-w32-b4", page=16, ratio=1.0, window=None, tokens=8192),
}
BOUNDED = [name for name, s in SETUPS.items() if s.ratio < 1 and s.page == 1]
FRIENDLY = [name for name, s in SETUPS.items() if s.target == "friendly"]
PLAIN_DRAFT = {"random": "random-w64-b4", "friendly": "friendly-w32-b4"}  # the draft memd has for the baseline


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, pathlib.Path]:
    root = tmp_path_factory.mktemp("dflash-models")
    random_target = tm.write_random_target(root / "random-target")
    friendly_target = tm.write_friendly_target(root / "friendly-target")
    return {
        "random": random_target,
        "friendly": friendly_target,
        "random-w64-b4": tm.write_draft(
            root / "random-w64-b4", random_target, layers=2, block_size=4, sliding_window=64
        ),
        "random-w32-b8": tm.write_draft(
            root / "random-w32-b8", random_target, layers=2, block_size=8, sliding_window=32
        ),
        "friendly-w32-b4": tm.write_draft(
            root / "friendly-w32-b4",
            friendly_target,
            layers=2,
            block_size=4,
            sliding_window=32,
            mask_token_id=tm.FRIENDLY_MASK,
        ),
    }


def vocab_of(target: str) -> int:
    return tm.FRIENDLY_VOCAB if target == "friendly" else 512


def memd_cli(
    draft: pathlib.Path | None, *, page: int = 1, ratio: float = 1.0, window: int | None = None, tokens: int = 8192
) -> list[str]:
    args = [
        "--draft-model",
        str(draft) if draft else "none",
        "--draft-kv-ratio",
        str(ratio),
        "--page-size",
        str(page),
        "--max-running-requests",
        str(MAX_RUNNING),
        "--max-total-tokens",
        str(tokens),
        "--kv-cache-dtype",
        "float32",
        "--chunked-prefill-size",
        str(CHUNK),
        "--draft-eviction-interval",
        str(EVICTION_INTERVAL),
        "--decode-lookahead",
        str(LOOKAHEAD),
        "--strict",
    ]
    if window is not None:
        args += ["--draft-window", str(window)]
    return args


def tail(path: pathlib.Path, lines: int) -> str:
    try:
        return "\n".join(path.read_text().splitlines()[-lines:])
    except OSError as exc:
        return f"({exc})"


@dataclass
class Pair:
    name: str
    memd: object
    modeld: object
    client: client.Client

    def logs(self, lines: int = 40) -> str:
        return (
            f"--- {self.name}: modeld log (last {lines} lines) ---\n{tail(self.modeld.log_path, lines)}\n"
            f"--- {self.name}: memd log (last {lines} lines) ---\n{tail(self.memd.log_path, lines)}"
        )


class Daemons:
    """memd + modeld pairs, started on first use and kept until the module ends. A pair that failed to
    start is not tried again: its error is raised at once."""

    def __init__(self, models: dict[str, pathlib.Path]):
        self.models = models
        self.stack = contextlib.ExitStack()
        self.pairs: dict[str, Pair] = {}
        self.failed: dict[str, BaseException] = {}
        self.plain_mode: dict[str, str] = {}
        self.baselines: dict[tuple, tuple[int, ...]] = {}

    def _start(self, name: str, target: str, memd_args: list[str], modeld_args: list[str], tuning: str = "") -> Pair:
        stack = contextlib.ExitStack()
        try:
            memd = stack.enter_context(run_memd(self.models[target], *memd_args))
            modeld = stack.enter_context(
                run_modeld(memd, "--target-model", str(self.models[target]), *modeld_args, tuning=tuning)
            )
            c = stack.enter_context(client.Client(modeld.address, timeout=TIMEOUT))
        except BaseException:
            stack.close()
            raise
        self.stack.push(stack.__exit__)
        return Pair(name, memd, modeld, c)

    def _cached(self, name: str, start) -> Pair:
        if name in self.failed:
            raise RuntimeError(f"{name} failed to start earlier: {self.failed[name]}")
        if name not in self.pairs:
            try:
                self.pairs[name] = start()
            except Exception as exc:
                self.failed[name] = exc
                raise
        return self.pairs[name]

    def spec(self, name: str) -> Pair:
        """The pair of setup `name`, DFLASH on."""
        s = SETUPS[name]
        draft = self.models[s.draft]
        return self._cached(
            name,
            lambda: self._start(
                name,
                s.target,
                memd_cli(draft, page=s.page, ratio=s.ratio, window=s.window, tokens=s.tokens),
                ["--draft-model", str(draft), "--speculative-algorithm", "dflash"],
                # every decode step verifies a block (modeld's default: where its policy measures that it pays)
                tuning="adaptive_speculation=false",
            ),
        )

    def plain(self, target: str) -> Pair:
        """DFLASH off: memd with a draft pool (ratio 1, page 1), modeld with --draft-model and
        --speculative-algorithm none; if modeld refuses that, modeld without --draft-model
        (self.plain_mode tells which ran)."""
        draft = self.models[PLAIN_DRAFT[target]]

        def start() -> Pair:
            margs = memd_cli(draft)
            try:
                pair = self._start(
                    f"plain-{target}", target, margs, ["--draft-model", str(draft), "--speculative-algorithm", "none"]
                )
                self.plain_mode[target] = "draft given"
            except RuntimeError as exc:
                self.plain_mode[target] = f"without --draft-model (with it: {str(exc)[:2000]})"
                pair = self._start(f"plain-{target}", target, margs, ["--speculative-algorithm", "none"])
            return pair

        return self._cached(f"plain-{target}", start)

    def baseline(self, target: str, prompts: list[list[int]], max_new: int = MAX_NEW) -> list[tuple[int, ...]]:
        """Greedy outputs (ignore_eos) of plain decoding, memoised; the missing ones run concurrently."""
        missing = [ids for ids in prompts if (target, tuple(ids), max_new) not in self.baselines]
        if missing:
            c = self.plain(target).client
            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                results = list(pool.map(lambda ids: greedy(c, ids, max_new), missing))
            for ids, result in zip(missing, results):
                assert result.spec_verify_ct == 0 and len(result.output_ids) == max_new, result
                self.baselines[(target, tuple(ids), max_new)] = tuple(result.output_ids)
        return [self.baselines[(target, tuple(ids), max_new)] for ids in prompts]

    def live(self) -> list[Pair]:
        return list(self.pairs.values())

    def close(self) -> None:
        self.stack.close()


@pytest.fixture(scope="module")
def daemons(models):
    registry = Daemons(models)
    yield registry
    registry.close()


@pytest.fixture(autouse=True)
def pools_free_after_each_test(daemons):
    yield
    for pair in daemons.live():
        if pair.memd.proc.poll() is not None:
            pytest.fail(f"{pair.name}: memd exited with {pair.memd.proc.returncode}\n{pair.logs()}")
        try:
            pair.memd.assert_idle_then_flush(timeout=10)
        except AssertionError as exc:
            raise AssertionError(f"{pair.name}: {exc}\n{pair.logs()}") from None


# --- helpers ---------------------------------------------------------------------------------------------------


def prompts_for(target: str, seed: int = 1234) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab_of(target)) for _ in range(n)] for n in PROMPT_LENGTHS]


def greedy(c: client.Client, ids: list[int], max_new: int = MAX_NEW):
    return c.generate(input_ids=ids, max_new_tokens=max_new, temperature=0, ignore_eos=True)


def assert_same_tokens(got, want, what: str, pair: Pair) -> None:
    got, want = list(got), list(want)
    if got == want:
        return
    first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    pytest.fail(
        f"{what}: {len(got)} tokens with DFLASH, {len(want)} without; they part at token {first}: "
        f"DFLASH {got[first : first + 8]}, plain {want[first : first + 8]}\n{pair.logs()}"
    )


SPEC_COUNTERS = ("spec_drafts", "spec_draft_tokens", "spec_accepted_tokens")


def counters(c: client.Client) -> dict[str, int]:
    info = c.info()
    return {k: int(info[k]) for k in SPEC_COUNTERS}


# --- 1. greedy losslessness ------------------------------------------------------------------------------------


@pytest.mark.parametrize("setup", SETUPS)
def test_greedy_one_at_a_time_equals_plain_decoding(setup, daemons):
    s = SETUPS[setup]
    prompts = prompts_for(s.target)
    expected = daemons.baseline(s.target, prompts)
    pair = daemons.spec(setup)
    for n, (ids, want) in enumerate(zip(prompts, expected)):
        result = greedy(pair.client, ids)
        assert_same_tokens(result.output_ids, want, f"{setup}, prompt {n} ({len(ids)} tokens)", pair)
        assert result.completion_tokens == MAX_NEW and result.finish_reason == "length"


@pytest.mark.parametrize("setup", SETUPS)
def test_greedy_six_concurrent_equals_plain_decoding(setup, daemons):
    s = SETUPS[setup]
    prompts = prompts_for(s.target)
    expected = daemons.baseline(s.target, prompts)
    pair = daemons.spec(setup)
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        results = list(pool.map(lambda ids: greedy(pair.client, ids), prompts))
    for n, (ids, want, result) in enumerate(zip(prompts, expected, results)):
        assert_same_tokens(result.output_ids, want, f"{setup}, concurrent prompt {n} ({len(ids)} tokens)", pair)


# --- 2. a long generation at ratio 0.25: bounded draft slots ----------------------------------------------------


class CapacityMonitor:
    """Polls memd's Capacity in a thread; keeps the most draft and target slots held by requests."""

    def __init__(self, memd, period: float = 0.004):
        self.memd, self.period = memd, period
        self.max_draft = self.max_target = self.samples = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                cap = self.memd.capacity()
            except Exception as exc:  # recorded, reported by the test
                self.errors.append(repr(exc))
                return
            self.max_draft = max(self.max_draft, cap.draft.held_by_requests)
            self.max_target = max(self.max_target, cap.target.held_by_requests)
            self.samples += 1
            time.sleep(self.period)

    def __enter__(self) -> "CapacityMonitor":
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join()


LONG_NEW = 200


@pytest.mark.parametrize("setup", BOUNDED)
def test_long_generation_holds_a_bounded_draft_window(setup, daemons):
    """200 new tokens after a 16-token prompt (shorter than the window, so prefill stays within the bound
    too) at window 32: the draft slots held stay within window + eviction_interval * block + 2 * page +
    block + decode lookahead while the target's grow past several windows; the output equals plain decoding."""
    s = SETUPS[setup]
    ids = prompts_for(s.target)[1]
    [want] = daemons.baseline(s.target, [ids], LONG_NEW)
    pair = daemons.spec(setup)
    block = pair.client.info()["block_size"]
    assert block > 0, pair.client.info()
    with CapacityMonitor(pair.memd) as monitor:
        with pair.client.stream(input_ids=ids, max_new_tokens=LONG_NEW, temperature=0, ignore_eos=True) as handle:
            chunks = list(handle)
        result = handle.result
    assert not monitor.errors, monitor.errors
    assert_same_tokens(result.output_ids, want, f"{setup}, long generation", pair)
    assert [t for chunk in chunks for t in chunk.token_ids] == list(result.output_ids)
    # memd's request cap also holds the decode slots a request may take ahead of need (memd's lookahead)
    bound = s.window + EVICTION_INTERVAL * block + 2 * s.page + block + LOOKAHEAD
    report = (
        f"{monitor.samples} Capacity samples: max draft slots held {monitor.max_draft} (bound {bound}), "
        f"max target slots held {monitor.max_target}"
    )
    print(report)
    assert monitor.samples >= 20, report
    assert 0 < monitor.max_draft <= bound, f"{report}\n{pair.logs()}"
    assert monitor.max_target >= 4 * s.window, report  # the request really ran past several windows


# --- 3. sampling losslessness ------------------------------------------------------------------------------------

ALPHA = 1e-4  # significance of each chi-square comparison (22 of them: a chance failure < 0.3 %)
N_SAMPLES = 2000  # requests per temperature, with DFLASH and without
SAMPLING_PROMPT = [4, 8, 12, 1, 10, 13]
SAMPLED_TOKENS = 3


def chi2_sf(x: float, df: int) -> float:
    """P(X >= x) for X ~ chi-square(df): the regularised upper incomplete gamma Q(df/2, x/2)
    (series below a + 1, Lentz's continued fraction above)."""
    if x <= 0:
        return 1.0
    a, z = df / 2.0, x / 2.0
    log_front = a * math.log(z) - z - math.lgamma(a)
    if z < a + 1:
        term = total = 1.0 / a
        n = a
        while abs(term) > 1e-15 * abs(total):
            n += 1
            term *= z / n
            total += term
        return max(0.0, 1.0 - total * math.exp(log_front))
    tiny = 1e-300
    b = z + 1.0 - a
    c, d = 1.0 / tiny, 1.0 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1.0 / d
        step = d * c
        h *= step
        if abs(step - 1.0) < 1e-15:
            break
    return math.exp(log_front) * h


def pool_rare(weights: dict, keys, minimum: float) -> list[list]:
    """Bins of categories: each category whose weight reaches `minimum` alone, the others pooled into
    one bin; a pooled bin still below `minimum` joins the lightest other bin."""
    keys = sorted(keys, key=lambda k: (weights.get(k, 0), str(k)))
    bins = [[k] for k in keys if weights.get(k, 0) >= minimum]
    rare = [k for k in keys if weights.get(k, 0) < minimum]
    if rare:
        if sum(weights.get(k, 0) for k in rare) >= minimum or not bins:
            bins.append(rare)
        else:
            bins[0] = bins[0] + rare
    return bins


def two_sample_chi2(a: Counter, b: Counter) -> tuple[float, int, float]:
    """Chi-square test that two samples come from one distribution; categories with fewer than 10
    observations in both samples together (5 expected per sample) are pooled. Returns (stat, df, p)."""
    na, nb = sum(a.values()), sum(b.values())
    both = a + b
    bins = pool_rare(both, both.keys(), 10)
    stat = 0.0
    for cats in bins:
        x, y = sum(a[k] for k in cats), sum(b[k] for k in cats)
        stat += (math.sqrt(nb / na) * x - math.sqrt(na / nb) * y) ** 2 / (x + y)
    df = len(bins) - 1
    return stat, df, chi2_sf(stat, df) if df > 0 else 1.0


def goodness_of_fit(sample: Counter, probs: dict) -> tuple[float, int, float]:
    """Chi-square test of a sample against exact probabilities; categories expected fewer than 5
    times are pooled. Returns (stat, df, p)."""
    n = sum(sample.values())
    expected = {k: n * p for k, p in probs.items() if p > 0}
    unexpected = [k for k in sample if k not in expected]
    if unexpected:
        return math.inf, 0, 0.0
    bins = pool_rare(expected, expected.keys(), 5)
    stat = sum(
        (sum(sample[k] for k in cats) - sum(expected[k] for k in cats)) ** 2 / sum(expected[k] for k in cats)
        for cats in bins
    )
    df = len(bins) - 1
    return stat, df, chi2_sf(stat, df) if df > 0 else 1.0


def exact_joint(target: pathlib.Path, prompt: list[int], temperature: float) -> torch.Tensor:
    """P(t1, t2, t3) of the target (Hugging Face, fp32) sampled at `temperature`: [V, V, V]."""
    model = tm.load_hf(target)
    V = model.config.vocab_size
    with torch.no_grad():
        p1 = torch.softmax(model(torch.tensor([prompt])).logits[0, -1].double() / temperature, -1)
        p2 = torch.softmax(
            model(torch.tensor([prompt + [a] for a in range(V)])).logits[:, -1].double() / temperature, -1
        )
        prefixes = torch.tensor([prompt + [a, b] for a in range(V) for b in range(V)])
        p3 = torch.softmax(model(prefixes).logits[:, -1].double() / temperature, -1).view(V, V, V)
    return p1[:, None, None] * p2[:, :, None] * p3


VIEWS = {  # what of the 3 sampled tokens each comparison looks at
    "t1": lambda s: s[0],
    "t2": lambda s: s[1],
    "t3": lambda s: s[2],
    "(t1,t2)": lambda s: s[:2],
    "(t2,t3)": lambda s: s[1:],
    "(t1,t2,t3)": lambda s: s,
}
GOF_VIEWS = ("t2", "t3", "(t1,t2)")


def view_probs(joint: torch.Tensor, view: str) -> dict:
    V = joint.shape[0]
    probs: dict = {}
    for a in range(V):
        for b in range(V):
            for c in range(V):
                key = VIEWS[view]((a, b, c))
                probs[key] = probs.get(key, 0.0) + float(joint[a, b, c])
    return probs


def sample_many(c: client.Client, seeds: range, temperature: float) -> list[tuple[int, ...]]:
    def one(seed: int) -> tuple[int, ...]:
        r = c.generate(
            input_ids=SAMPLING_PROMPT,
            max_new_tokens=SAMPLED_TOKENS,
            temperature=temperature,
            top_p=1.0,
            top_k=0,
            seed=seed,
            ignore_eos=True,
        )
        return tuple(r.output_ids)

    with concurrent.futures.ThreadPoolExecutor(MAX_RUNNING) as pool:
        return list(pool.map(one, seeds))


@pytest.mark.parametrize("temperature", [0.7, 1.3])
def test_sampling_distribution_is_unchanged(temperature, daemons, models):
    """N_SAMPLES continuations of 3 tokens of one prompt on the 16-token friendly target (its draft's
    proposal is the target's likeliest token often enough for drafts to be accepted), with distinct
    seeds, with DFLASH (friendly-page1-ratio0.25) and without. Each comparison is a chi-square test at
    significance ALPHA = 1e-4 (p-value from the chi-square distribution with (bins - 1) degrees of
    freedom; categories with fewer than 5 expected observations are pooled):
    - two-sample, DFLASH against plain, of t1, t2, t3, (t1,t2), (t2,t3), (t1,t2,t3);
    - goodness of fit to the exact distribution (Hugging Face, fp32) of t2, t3, (t1,t2), for DFLASH and,
      to check the reference itself, for plain decoding.
    11 comparisons per temperature: by chance alone all pass with probability >= 1 - 11 * ALPHA."""
    plain = daemons.plain("friendly")
    pair = daemons.spec("friendly-page1-ratio0.25")
    before = counters(pair.client)
    started = time.monotonic()
    with_dflash = sample_many(pair.client, range(10_000, 10_000 + N_SAMPLES), temperature)
    dflash_seconds = time.monotonic() - started
    without = sample_many(plain.client, range(20_000, 20_000 + N_SAMPLES), temperature)
    after = counters(pair.client)
    assert all(len(s) == SAMPLED_TOKENS for s in with_dflash + without)
    joint = exact_joint(models["friendly"], SAMPLING_PROMPT, temperature)
    rows, failures = [], []
    for view, pick in VIEWS.items():
        a, b = Counter(map(pick, with_dflash)), Counter(map(pick, without))
        checks = [("dflash vs plain", two_sample_chi2(a, b))]
        if view in GOF_VIEWS:
            probs = view_probs(joint, view)
            checks += [("dflash vs exact", goodness_of_fit(a, probs)), ("plain vs exact", goodness_of_fit(b, probs))]
        for name, (stat, df, p) in checks:
            rows.append(f"{view:>11} {name:>16}: chi2 {stat:8.2f}, df {df:3d}, p {p:.4g}")
            if p < ALPHA:
                failures.append(rows[-1])
    table = "\n".join(rows)
    accepted = after["spec_accepted_tokens"] - before["spec_accepted_tokens"]
    print(
        f"T={temperature}: {N_SAMPLES} requests with DFLASH in {dflash_seconds:.1f} s, "
        f"{accepted} draft tokens accepted\n{table}"
    )
    assert not failures, f"distributions differ at significance {ALPHA}:\n" + "\n".join(failures) + f"\n\nall:\n{table}"
    assert after["spec_drafts"] > before["spec_drafts"], (before, after)
    assert accepted > 0, f"no draft token was accepted: the test did not exercise acceptance ({before} -> {after})"


# --- 4. speculation metrics --------------------------------------------------------------------------------------


@pytest.mark.parametrize("setup", SETUPS)
def test_speculation_metrics(setup, daemons):
    s = SETUPS[setup]
    pair = daemons.spec(setup)
    info = pair.client.info()
    assert info["speculative_algorithm"] == "dflash" and info["block_size"] > 0, info
    before = counters(pair.client)
    result = greedy(pair.client, prompts_for(s.target)[2])
    after = counters(pair.client)
    assert result.completion_tokens == len(result.output_ids) == MAX_NEW
    assert 0 < result.spec_verify_ct <= result.completion_tokens, result
    assert result.spec_accept_length == pytest.approx(result.completion_tokens / result.spec_verify_ct, rel=1e-5)
    assert result.spec_accept_length >= 1
    grew = {k: after[k] - before[k] for k in SPEC_COUNTERS}
    assert grew["spec_drafts"] > 0, (before, after)
    assert grew["spec_draft_tokens"] >= grew["spec_drafts"], (before, after)
    assert 0 <= grew["spec_accepted_tokens"] <= grew["spec_draft_tokens"], (before, after)


@pytest.mark.parametrize("target", ["random", "friendly"])
def test_plain_decoding_reports_no_speculation(target, daemons):
    pair = daemons.plain(target)
    assert daemons.plain_mode[target] == "draft given", (
        f"modeld refused --draft-model with --speculative-algorithm none; the baseline runs without it: "
        f"{daemons.plain_mode[target]}"
    )
    info = pair.client.info()
    assert info["speculative_algorithm"] == "none", info
    result = greedy(pair.client, prompts_for(target)[0])
    assert result.spec_verify_ct == 0 and result.spec_accept_length == 0, result
    assert counters(pair.client) == dict.fromkeys(SPEC_COUNTERS, 0)


def sink_verify_steps(output: list[int], block: int, proposal: int) -> int:
    """Verify steps greedy DFLASH needs for `output` (after the prefill's first token) when every
    drafted token is `proposal`: each step accepts drafts while the output continues with `proposal`
    (at most block - 1), plus the target's bonus token."""
    committed, steps = 1, 0
    while committed < len(output):
        accepted = 0
        while accepted < block - 1 and committed + accepted < len(output) and output[committed + accepted] == proposal:
            accepted += 1
        committed += accepted + 1
        steps += 1
    return steps


@pytest.mark.parametrize("setup", FRIENDLY)
def test_friendly_draft_is_accepted_where_the_target_agrees(setup, daemons):
    """The friendly draft's layers are small next to the target's embeddings, so every drafted token is
    the target's bigram successor of the mask token, SINK; greedy DFLASH then accepts exactly the runs of
    SINK in the output, and the number of verify steps follows from the plain output."""
    s = SETUPS[setup]
    prompts = prompts_for(s.target)
    expected = daemons.baseline(s.target, prompts)
    pair = daemons.spec(setup)
    block = pair.client.info()["block_size"]
    steps = [sink_verify_steps(list(out), block, tm.SINK) for out in expected]
    assert sum(MAX_NEW / n for n in steps) / len(steps) > 1.3, f"the friendly target is not friendly: {steps}"
    got = []
    for ids, want in zip(prompts, expected):
        result = greedy(pair.client, ids)
        assert_same_tokens(result.output_ids, want, setup, pair)
        got.append(result.spec_verify_ct)
    assert got == steps, (
        f"verify steps {got}, expected {steps} (block {block}) if every draft were {tm.SINK}\n{pair.logs()}"
    )


@pytest.mark.parametrize("setup", FRIENDLY)
def test_stop_token_inside_an_accepted_block(setup, daemons):
    """A stop token id that the draft proposes (SINK): the request ends at its first occurrence, which
    DFLASH often reaches as an accepted draft in the middle of a block; the drafts after it are dropped.
    The result equals plain decoding's for the same request."""
    s = SETUPS[setup]
    prompts = prompts_for(s.target)
    plain, pair = daemons.plain(s.target), daemons.spec(setup)
    ask = lambda c, ids: c.generate(input_ids=ids, max_new_tokens=MAX_NEW, temperature=0, stop_token_ids=[tm.SINK])  # noqa: E731
    for n, ids in enumerate(prompts):
        want, got = ask(plain.client, ids), ask(pair.client, ids)
        assert_same_tokens(got.output_ids, want.output_ids, f"{setup}, prompt {n}, stop token {tm.SINK}", pair)
        assert (got.finish_reason, got.matched_stop, got.completion_tokens) == (
            want.finish_reason,
            want.matched_stop,
            want.completion_tokens,
        )
        if tm.SINK in want.output_ids:
            assert got.output_ids[-1] == tm.SINK and got.finish_reason == "stop"


# --- 5. loader errors ----------------------------------------------------------------------------------------------

BAD_DRAFTS = {
    # draft hidden size 48 != the target's 64 (fc maps 2*48 -> 48)
    "hidden-size": (dict(hidden_size=48), r"hidden"),
    # fc.weight [64, 192] while target_layer_ids has 2 layers: 2 * 64 = 128 wide
    "fc-width": (dict(fc_in=3 * 64), r"\bfc\b|fc\.weight|target_layer_ids"),
    # mask_token_id 512 in a vocabulary of 512
    "mask-token": (dict(mask_token_id=512), r"mask"),
}


@pytest.mark.parametrize("case", BAD_DRAFTS)
def test_modeld_refuses_a_draft_that_does_not_fit(case, models, tmp_path):
    kwargs, pattern = BAD_DRAFTS[case]
    target = models["random"]
    draft = tm.write_draft(tmp_path / case, target, block_size=4, sliding_window=64, **kwargs)
    with run_memd(target, *memd_cli(draft)) as memd:
        with pytest.raises(RuntimeError, match="modeld exited") as failure:
            with run_modeld(
                memd,
                "--target-model",
                str(target),
                "--draft-model",
                str(draft),
                "--speculative-algorithm",
                "dflash",
                ready_timeout=120,
            ):
                pass
    text = str(failure.value)
    code = int(re.match(r"modeld exited with (-?\d+)", text).group(1))
    assert code > 0, text
    error_lines = [line for line in text.splitlines() if re.search(r"error", line, re.I)]
    print("\n".join(error_lines))
    assert any(re.search(pattern, line, re.I) for line in error_lines), (
        f"no error line names the problem ({pattern!r}):\n{text}"
    )
