"""A stream sends the chunks queued behind one as one message: nothing lost, nothing reordered, the complete
event last; a stream that keeps up sends each chunk as it comes."""

import queue
import threading

from modeld.output import stream_events


def events_of(*items) -> queue.Queue:
    q = queue.Queue()
    for item in items:
        q.put(item)
    return q


def test_queued_chunks_go_out_as_one_then_the_complete():
    q = events_of(("chunk", [1], "a"), ("chunk", [2, 3], "bc"), ("chunk", [], "d"), ("complete", "req"))
    assert list(stream_events(q)) == [("chunk", ([1, 2, 3], "abcd")), ("complete", ["req"])]
    assert q.empty()


def test_a_complete_with_nothing_before_it():
    assert list(stream_events(events_of(("complete", "req")))) == [("complete", ["req"])]


def test_a_stream_that_keeps_up_gets_each_chunk_as_it_comes():
    q = queue.Queue()
    stream = stream_events(q)
    q.put(("chunk", [1], "a"))
    assert next(stream) == ("chunk", ([1], "a"))  # nothing queued behind it: sent alone, at once
    q.put(("chunk", [2], "b"))
    assert next(stream) == ("chunk", ([2], "b"))
    q.put(("complete", "req"))
    assert list(stream) == [("complete", ["req"])]


def test_every_token_arrives_in_order_while_the_engine_keeps_producing():
    q = queue.Queue()
    total = 5000

    def engine():
        for i in range(total):
            q.put(("chunk", [i], f"{i},"))
        q.put(("complete", "req"))

    producer = threading.Thread(target=engine)
    producer.start()
    out = list(stream_events(q))
    producer.join()
    chunks = [payload for kind, payload in out if kind == "chunk"]
    assert [t for ids, _ in chunks for t in ids] == list(range(total))
    assert "".join(text for _, text in chunks) == "".join(f"{i}," for i in range(total))
    assert out[-1] == ("complete", ["req"]) and len(chunks) <= total
