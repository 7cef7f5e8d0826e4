"""Incremental detokenization: text streamed token by token equals the decode of the whole output, for text with
multi-byte characters split across tokens, and no step decodes more than a short window of the output."""

import random

from modeld.detokenize import TextStream, plain_decoder

SAMPLES = [
    "Hello, world! The café serves crème brûlée. 東京は大きい都市です。 🙂🚀 naïve résumé",
    "def f(x):\n    return x ** 2  # ∑ of squares\n",
    "Ünïcödé ✓ and emoji 👩‍🔬 in one line",
]


class CountingTokenizer:
    def __init__(self, inner):
        self.inner, self.longest = inner, 0

    def decode(self, ids, skip_special_tokens=True):
        self.longest = max(self.longest, len(ids))
        return self.inner.decode(ids, skip_special_tokens=skip_special_tokens)


def stream(tokenizer, ids, stop=()):
    """The pieces a TextStream hands out as ids arrive one at a time, the last one finishing."""
    out = []
    text = TextStream(tokenizer, out, tuple(stop))
    sent = ""
    for i, token in enumerate(ids):
        out.append(token)
        piece, finish = text.take(finished=i == len(ids) - 1)
        sent += piece
        if finish is not None:
            return sent, finish
    assert sent == text.sent
    return sent, None


def test_streamed_text_equals_the_whole_decode(tokenizer):
    rng = random.Random(0)
    for sample in SAMPLES * 3:
        ids = tokenizer(sample)["input_ids"] * rng.randint(1, 4)
        counting = CountingTokenizer(tokenizer)
        text, _ = stream(counting, ids)
        assert text == tokenizer.decode(ids, skip_special_tokens=True)
    long_ids = tokenizer(" ".join(SAMPLES * 20))["input_ids"]
    counting = CountingTokenizer(tokenizer)
    assert stream(counting, long_ids)[0] == tokenizer.decode(long_ids, skip_special_tokens=True)
    assert counting.longest < 16, f"a step decoded {counting.longest} tokens of a {len(long_ids)}-token output"


def test_stop_string_is_cut_and_never_streamed_in_part(tokenizer):
    ids = tokenizer("The answer is 42. STOP here and nothing after.")["input_ids"]
    text, finish = stream(tokenizer, ids, stop=["STOP"])
    assert finish is not None and finish.matched_stop == "STOP"
    assert text == "The answer is 42. "


def test_the_backend_alone_decodes_as_the_tokenizer_does(tokenizer):
    """The default (fast) tokenizer cleans up no spaces, so its Rust backend decodes the streamed windows without
    the Python around it: the same text as decode(), special tokens skipped, for any window of a chat."""
    assert tokenizer.is_fast and tokenizer.clean_up_tokenization_spaces is False
    decode = plain_decoder(tokenizer)
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": " ".join(SAMPLES)}], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    rng = random.Random(1)
    for _ in range(200):
        start = rng.randrange(len(ids))
        window = ids[start : start + rng.randint(1, 8)]
        assert decode(window) == tokenizer.decode(window, skip_special_tokens=True)


def test_a_tokenizer_that_may_clean_up_spaces_decodes_through_its_own_decode(tokenizer):
    """The backend is used alone only when the tokenizer says it cleans up nothing; otherwise (or when it does not
    say) its own decode() runs, whatever that does."""

    class Cleaning:
        backend_tokenizer = tokenizer.backend_tokenizer
        clean_up_tokenization_spaces = True

        def decode(self, ids, skip_special_tokens):
            return "decode() " + tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    ids = tokenizer("Yes , it is .")["input_ids"]
    assert plain_decoder(Cleaning())(ids) == "decode() Yes , it is ."
    del Cleaning.clean_up_tokenization_spaces
    assert plain_decoder(Cleaning())(ids) == "decode() Yes , it is ."
