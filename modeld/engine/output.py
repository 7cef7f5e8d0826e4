"""Output processing: a step's sampled tokens join a request's output; stop rules (EOS, stop tokens, stop strings,
max_new_tokens, the context) end it; new tokens are streamed to its gRPC handler as ("chunk", ids, text, finished,
logprobs) events (logprobs: a TokenLogprob per id, or None when the request asked for none), which it sends, merged with
the chunks queued behind them, as one message (`take_events`); with a stream interval above 1, a chunk waits until it
holds that many new tokens (or the request ends). The engine thread detokenizes only requests with stop strings (their
text decides when they stop; `text` is then their new text); for any other request `text` is None and its handler makes
the text from the ids (modeld.detokenize)."""

import queue

from modeld.detokenize import TextStream
from modeld.request import Finish, Request, TokenLogprob


class OutputProcessor:
    def __init__(self, tokenizer, eos_ids: set[int], context_len: int, stream_interval: int = 1):
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        self.context_len = context_len
        self.stream_interval = stream_interval  # new tokens a chunk waits for (a finished request's last goes at once)

    def append(self, req: Request, tokens: list[int], logprobs: list[TokenLogprob] | None = None) -> bool:
        """Commits tokens (and their log probabilities, when the request asked for them) to the output, stopping at
        the first that finishes the request, and streams what is new. True when the request finished."""
        p = req.params
        for i, token in enumerate(tokens):
            req.output_ids.append(token)
            if logprobs is not None:
                req.output_logprobs.append(logprobs[i])
            if not p.ignore_eos and token in self.eos_ids:
                req.finish = Finish("stop")
            elif token in p.stop_token_ids:
                req.finish = Finish("stop", matched_stop=str(token))
            elif (
                len(req.output_ids) >= p.max_new_tokens or len(req.prompt_ids) + len(req.output_ids) >= self.context_len
            ):
                req.finish = Finish("length")
            if req.finish is not None:
                break
        if p.stop:  # the text decides: detokenized here
            if req.text_stream is None:
                req.text_stream = TextStream(self.tokenizer, req.output_ids, p.stop)
            text, stop = req.text_stream.take(req.finish is not None)
            req.unsent_text += text
            if stop is not None:
                req.finish = stop
        if req.finish is not None or len(req.output_ids) - req.sent_ids >= self.stream_interval:
            self.flush(req)
        return req.finish is not None

    def flush(self, req: Request) -> None:
        """Streams what the request has not streamed yet (its new ids; with stop strings, their text) as one chunk,
        finished when the request is."""
        new_ids = req.output_ids[req.sent_ids :]
        text = req.unsent_text if req.params.stop else None
        logprobs = req.output_logprobs[req.sent_ids :] if req.params.logprobs else None
        if req.stream and (text or new_ids):
            req.events.put(("chunk", new_ids, text, req.finish is not None, logprobs))
        req.sent_ids, req.unsent_text = len(req.output_ids), ""


def take_events(events: queue.SimpleQueue) -> tuple[tuple | None, bool]:
    """Everything queued for a request's stream, without waiting: its chunks merged into one (ids, text or None,
    finished, logprobs or None), or None without a chunk; and whether its "complete" (always the last event) came.
    A stream that keeps up gets each step's tokens as they come; one that lags (hundreds of requests in flight) sends
    fewer, larger messages instead of falling behind."""
    merged, complete = None, False
    while not complete:
        try:
            kind, *payload = events.get_nowait()
        except queue.Empty:
            break
        if kind != "chunk":
            complete = True
        elif merged is None:
            ids, text, finished, logprobs = payload
            merged = (list(ids), text, finished, None if logprobs is None else list(logprobs))
        else:
            ids, text, _, logprobs = merged
            ids += payload[0]
            if logprobs is not None:
                logprobs += payload[3]
            merged = (ids, None if text is None else text + payload[1], payload[2], logprobs)
    return merged, complete
