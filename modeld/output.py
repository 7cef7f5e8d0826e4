"""Output processing: a step's sampled tokens join a request's output; stop rules (EOS, stop tokens, stop strings,
max_new_tokens, the context) end it; new tokens and text are streamed to its gRPC handler."""

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
        text, stop = new_text(self.tokenizer, req)
        if stop is not None:
            req.finish = stop
        new_ids = req.output_ids[req.sent_ids :]
        if text or new_ids:
            req.events.put(("chunk", new_ids, text))
            req.sent_ids = len(req.output_ids)
            req.sent_text += text
        return req.finish is not None
