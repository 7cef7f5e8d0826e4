"""A stream sends the chunks queued for it as one message: nothing lost, nothing reordered, the complete event
last; a stream that keeps up sends each chunk as it comes. A request nobody streams (in-process bulk
generation) finishes exactly as a streamed one, without detokenisation (unless a stop string needs it) and
without chunk events."""

import queue
import threading

from modeld.engine.output import take_events
from modeld.request import TokenLogprob


def events_of(*items) -> queue.SimpleQueue:
    q = queue.SimpleQueue()
    for item in items:
        q.put(item)
    return q


def test_queued_chunks_go_out_as_one_with_the_complete():
    q = events_of(
        ("chunk", [1], "a", False, None),
        ("chunk", [2, 3], "bc", False, None),
        ("chunk", [], "d", True, None),
        ("complete", "req"),
    )
    assert take_events(q) == (([1, 2, 3], "abcd", True, None), True)
    assert q.empty()


def test_chunks_without_text_merge_their_ids_and_keep_the_last_finished_flag():
    q = events_of(("chunk", [1], None, False, None), ("chunk", [2, 3], None, True, None))
    assert take_events(q) == (([1, 2, 3], None, True, None), False)


def test_a_complete_with_nothing_before_it_and_an_empty_queue():
    assert take_events(events_of(("complete", "req"))) == (None, True)
    assert take_events(queue.SimpleQueue()) == (None, False)


def test_the_merged_chunk_does_not_alias_the_engines_list():
    first = [1]
    q = events_of(("chunk", first, None, False, None), ("chunk", [2], None, False, None))
    assert take_events(q) == (([1, 2], None, False, None), False)
    assert first == [1]  # the engine's own list (a request's output slice) is left as it was


def test_log_probabilities_merge_with_their_ids():
    first, second = [TokenLogprob(-0.5)], [TokenLogprob(-1.0, ((4, -1.0),)), TokenLogprob(-2.0)]
    q = events_of(("chunk", [1], None, False, first), ("chunk", [2, 3], None, True, second))
    assert take_events(q) == (([1, 2, 3], None, True, first + second), False)
    assert len(first) == 1  # the engine's own list is left as it was


def test_a_stream_that_keeps_up_gets_each_chunk_as_it_comes():
    q = queue.SimpleQueue()
    q.put(("chunk", [1], "a", False, None))
    assert take_events(q) == (([1], "a", False, None), False)  # nothing queued behind it: sent alone, at once
    q.put(("chunk", [2], "b", True, None))
    assert take_events(q) == (([2], "b", True, None), False)
    q.put(("complete", "req"))
    assert take_events(q) == (None, True)


def test_every_token_arrives_in_order_while_the_engine_keeps_producing():
    q = queue.SimpleQueue()
    total = 5000

    def engine():
        for i in range(total):
            q.put(("chunk", [i], f"{i},", i == total - 1, None))
        q.put(("complete", "req"))

    producer = threading.Thread(target=engine)
    producer.start()
    chunks, complete = [], False
    while not complete:
        chunk, complete = take_events(q)
        if chunk is not None:
            chunks.append(chunk)
    producer.join()
    assert [t for ids, _, _, _ in chunks for t in ids] == list(range(total))
    assert "".join(text for _, text, _, _ in chunks) == "".join(f"{i}," for i in range(total))
    assert [finished for _, _, finished, _ in chunks][-1] and not any(finished for _, _, finished, _ in chunks[:-1])
    assert len(chunks) <= total and q.empty()


class CountingTokenizer:
    """Counts decode calls (what the engine thread pays per step for text)."""

    def __init__(self, inner):
        self.inner, self.calls = inner, 0

    def decode(self, ids, skip_special_tokens=True):
        self.calls += 1
        return self.inner.decode(ids, skip_special_tokens=skip_special_tokens)


def run_output(tokenizer, ids, stream: bool, stop=(), eos=frozenset({2}), max_new=64, interval=1):
    from modeld.engine.output import OutputProcessor
    from modeld.request import Request
    from modeld.sampling_params import SamplingParams

    req = Request(
        rid="r", prompt_ids=[1], params=SamplingParams(max_new_tokens=max_new, stop=tuple(stop)), stream=stream
    )
    out = OutputProcessor(tokenizer, set(eos), context_len=4096, stream_interval=interval)
    for token in ids:
        if out.append(req, [token]):
            break
    chunks = []
    while not req.events.empty():
        chunks.append(req.events.get())
    return req, chunks


def test_a_request_nobody_streams_finishes_alike_without_text_or_events(tokenizer):
    ids = tokenizer("The answer is 42. STOP here and nothing after.")["input_ids"]
    for stop, eos, max_new in [((), frozenset({2}), 64), ((), frozenset({ids[5]}), 64), ((), frozenset(), 4)]:
        counting = CountingTokenizer(tokenizer)
        quiet, quiet_events = run_output(counting, ids, False, stop, eos, max_new)
        loud, loud_events = run_output(tokenizer, ids, True, stop, eos, max_new)
        assert quiet.output_ids == loud.output_ids and quiet.finish == loud.finish
        assert quiet_events == [] and counting.calls == 0 and loud_events
    # A stop string still needs the text: it is found, and still nothing is queued.
    quiet, quiet_events = run_output(tokenizer, ids, False, stop=["STOP"])
    loud, _ = run_output(tokenizer, ids, True, stop=["STOP"])
    assert quiet.finish.matched_stop == "STOP" and quiet.finish == loud.finish
    assert quiet.output_ids == loud.output_ids and quiet_events == []


def test_the_engine_thread_detokenizes_only_requests_with_stop_strings(tokenizer):
    from modeld.detokenize import TextStream

    ids = tokenizer("Hello, the café in 東京 serves 🙂 crème brûlée.")["input_ids"]
    counting = CountingTokenizer(tokenizer)
    _, chunks = run_output(counting, ids, True, eos=frozenset(), max_new=len(ids))
    assert counting.calls == 0 and len(chunks) == len(ids)
    assert all(text is None for _, _, text, _, _ in chunks)
    assert chunks[-1][3] and not any(finished for _, _, _, finished, _ in chunks[:-1])
    # the handler's side (modeld.front.service): a TextStream over the streamed ids hands out the whole text
    handler_text = TextStream(tokenizer, [])
    pieces = []
    for _, new_ids, _, finished, _ in chunks:
        pieces.append(handler_text.add(new_ids, finished))
    assert "".join(pieces) == handler_text.sent == tokenizer.decode(ids, skip_special_tokens=True)
    counting = CountingTokenizer(tokenizer)  # a stop string: the engine thread must read the text
    _, chunks = run_output(counting, ids, True, stop=["zzz"], eos=frozenset(), max_new=len(ids))
    assert counting.calls > 0 and "".join(text for _, _, text, _, _ in chunks) == tokenizer.decode(
        ids, skip_special_tokens=True
    )


def test_a_stream_interval_sends_chunks_of_that_many_tokens_and_the_rest_at_the_end(tokenizer):
    ids = tokenizer("Hello, the café in 東京 serves 🙂 crème brûlée, and nothing after this.")["input_ids"]
    _, chunks = run_output(tokenizer, ids, True, eos=frozenset(), max_new=len(ids), interval=4)
    assert [len(new_ids) for _, new_ids, _, _, _ in chunks] == [4] * (len(ids) // 4) + (
        [len(ids) % 4] if len(ids) % 4 else []
    )
    assert [t for _, new_ids, _, _, _ in chunks for t in new_ids] == ids
    assert chunks[-1][3] and not any(finished for _, _, _, finished, _ in chunks[:-1])
    # with a stop string the engine thread's text is held back with its tokens, and all of it reaches the stream
    req, chunks = run_output(tokenizer, ids, True, stop=["nothing"], eos=frozenset(), max_new=len(ids), interval=4)
    assert req.finish.matched_stop == "nothing"
    assert all(len(new_ids) == 4 for _, new_ids, _, _, _ in chunks[:-1]) and chunks[-1][3]
    streamed = "".join(text for _, _, text, _, _ in chunks)
    assert streamed == tokenizer.decode(req.output_ids, skip_special_tokens=True).split("nothing")[0]


def test_an_aborted_request_gets_the_tokens_its_stream_interval_held_back(tokenizer):
    from modeld.engine.output import OutputProcessor
    from modeld.request import Finish, Request
    from modeld.sampling_params import SamplingParams

    req = Request(rid="r", prompt_ids=[1], params=SamplingParams(max_new_tokens=64), stream=True)
    out = OutputProcessor(tokenizer, set(), context_len=4096, stream_interval=8)
    assert not out.append(req, [5, 6, 7])
    assert req.events.empty(), "a chunk went before the interval filled"
    req.finish = Finish("abort")
    out.flush(req)
    assert req.events.get_nowait() == ("chunk", [5, 6, 7], None, True, None)
    out.flush(req)
    assert req.events.empty(), "the held-back tokens were sent twice"
