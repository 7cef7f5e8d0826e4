"""Output processing: a step's sampled tokens join a request's output; stop rules (EOS, stop tokens, stop strings,
max_new_tokens, the context) end it; new tokens and text are streamed to its gRPC handler, which sends the
chunks queued behind one as one message (`stream_events`)."""

import queue

from modeld.detokenize import new_text
from modeld.request import Finish, Request


class OutputProcessor:
    def __init__(self, tokenizer, eos_ids: set[int], context_len: int):
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        self.context_len = context_len

    def append(self, req: Request, tokens: list[int]) -> bool:
        """Commits tokens to the output, stopping at the first that finishes the request, and streams what is
        new. True when the request finished."""
        p = req.params
        for token in tokens:
            req.output_ids.append(token)
            if not p.ignore_eos and token in self.eos_ids:
                req.finish = Finish("stop")
            elif token in p.stop_token_ids:
                req.finish = Finish("stop", matched_stop=str(token))
            elif len(req.output_ids) >= p.max_new_tokens or len(req.prompt_ids) + len(req.output_ids) >= self.context_len:
                req.finish = Finish("length")
            if req.finish is not None:
                break
        if not req.stream and not p.stop:
            return req.finish is not None  # nobody reads the text, no stop string needs it: no detokenisation
        text, stop = new_text(self.tokenizer, req)
        if stop is not None:
            req.finish = stop
        new_ids = req.output_ids[req.sent_ids :]
        if text or new_ids:
            if req.stream:
                req.events.put(("chunk", new_ids, text))
            req.sent_ids = len(req.output_ids)
            req.sent_text += text
        return req.finish is not None


def stream_events(events: queue.Queue):
    """A request's events for its stream, ending with its "complete": every "chunk" merged with the chunks queued
    behind it. A stream that keeps up with the engine sends each step's tokens as they come; one that lags (many
    requests in flight, one Python handler each) sends fewer, larger messages instead of falling further behind."""
    while True:
        kind, *payload = events.get()
        if kind != "chunk":
            yield kind, payload
            return
        ids, text = list(payload[0]), payload[1]
        after = None
        while after is None:
            try:
                after = events.get_nowait()
            except queue.Empty:
                break
            if after[0] == "chunk":
                ids += after[1]
                text += after[2]
                after = None
        yield "chunk", (ids, text)
        if after is not None:
            yield after[0], list(after[1:])
            return
