"""Incremental text for streaming, with stop strings cut and never half-streamed.

Each step decodes only a short window of the output (the tokens since the last stable point, against the same window
without the newest tokens), so the host's work per step does not grow with the output's length. Text is appended
only once it is stable: a window that ends in an incomplete UTF-8 sequence waits for its next token."""

from modeld.request import Finish, Request


def _decode(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=True) if tokenizer is not None else ""


def advance_text(tokenizer, req: Request) -> None:
    """Appends the text of the request's new output tokens to req.text (all of it once the request finished)."""
    ids = req.output_ids
    if req.read_offset == len(ids):
        return
    before = _decode(tokenizer, ids[req.prefix_offset : req.read_offset])
    window = _decode(tokenizer, ids[req.prefix_offset :])
    if len(window) > len(before) and (req.finish is not None or not window.endswith("\ufffd")):
        req.text += window[len(before) :]
        req.prefix_offset, req.read_offset = req.read_offset, len(ids)


def new_text(tokenizer, req: Request) -> tuple[str, Finish | None]:
    """Text to stream now, and a STOP finish when a stop string appeared.

    While running, the last (longest stop - 1) characters are held back, so a stop string is
    never streamed in part."""
    advance_text(tokenizer, req)
    text = req.text
    for stop in req.params.stop:
        at = text.find(stop, max(0, len(req.sent_text) - len(stop)))
        if at >= 0:
            return text[len(req.sent_text) : at], Finish("stop", matched_stop=stop)
    if req.finish is not None:
        return text[len(req.sent_text) :], None
    hold = max((len(s) - 1 for s in req.params.stop), default=0)
    end = len(text) - hold
    return text[len(req.sent_text) : max(end, len(req.sent_text))], None
