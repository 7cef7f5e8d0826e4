"""Incremental text for streaming, with stop strings cut and never half-streamed."""

from modeld.request import Finish, Request


def text_of(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=True) if tokenizer is not None else ""


def new_text(tokenizer, req: Request) -> tuple[str, Finish | None]:
    """Text to stream now, and a STOP finish when a stop string appeared.

    While running, the last (longest stop - 1) characters and an incomplete UTF-8 tail are
    held back, so a stop string is never streamed in part."""
    text = text_of(tokenizer, req.output_ids)
    for stop in req.params.stop:
        at = text.find(stop, max(0, len(req.sent_text) - len(stop)))
        if at >= 0:
            return text[len(req.sent_text) : at], Finish("stop", matched_stop=stop)
    if req.finish is not None:
        return text[len(req.sent_text) :], None
    hold = max((len(s) - 1 for s in req.params.stop), default=0)
    end = len(text) - hold
    if text.endswith("\ufffd"):
        end = min(end, len(text) - 1)
    return text[len(req.sent_text) : max(end, len(req.sent_text))], None
