"""Incremental text for streaming, with stop strings cut and never half-streamed.

Each call decodes only a short window of the output (the tokens since the last stable point, against the same window
without the newest tokens), so the work per chunk does not grow with the output's length. Text is appended only once
it is stable: a window that ends in an incomplete UTF-8 sequence waits for its next token.

A request with stop strings is detokenized on the engine thread (the text decides when it stops); any other request's
text is made by its gRPC stream in modeld's front process from the token ids it streams (modeld.front.service), off the
engine's process."""

from modeld.request import Finish


def plain_decoder(tokenizer):
    """ids -> text as `tokenizer.decode(ids, skip_special_tokens=True)` gives it. A fast (Rust) tokenizer that cleans
    up no spaces gives the same text from its backend alone, without the Python around it (about a third of a
    streamed token's cost)."""
    if tokenizer is None:
        return lambda ids: ""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and getattr(tokenizer, "clean_up_tokenization_spaces", True) is False:
        return lambda ids: backend.decode(ids, skip_special_tokens=True)
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=True)


class TextStream:
    """The text of a growing list of token ids (`ids`, which the owner appends to), handed out in stable pieces."""

    def __init__(self, tokenizer, ids: list[int], stops: tuple[str, ...] = ()):
        self.ids, self.stops = ids, stops
        self._decode = plain_decoder(tokenizer)
        self.text = ""  # stable text of ids[:read_offset]
        self.prefix_offset = 0  # the decode window starts here
        self.read_offset = 0
        self.sent = ""  # text already handed out

    def _advance(self, finished: bool) -> None:
        """Appends the text of the new ids to self.text (all of it once `finished`)."""
        if self.read_offset == len(self.ids):
            return
        before = self._decode(self.ids[self.prefix_offset : self.read_offset])
        window = self._decode(self.ids[self.prefix_offset :])
        if len(window) > len(before) and (finished or not window.endswith("\ufffd")):
            self.text += window[len(before) :]
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)

    def add(self, ids: list[int], finished: bool) -> str:
        """Appends streamed ids (a handler's own list, no stop strings) and returns the text to hand out now."""
        self.ids.extend(ids)
        return self.take(finished)[0]

    def take(self, finished: bool) -> tuple[str, Finish | None]:
        """Text to hand out now (counted as sent), and a STOP finish when a stop string appeared (the text then ends
        before it). While not finished, the last (longest stop - 1) characters are held back, so a stop string is
        never handed out in part."""
        self._advance(finished)
        text = self.text
        for stop in self.stops:
            at = text.find(stop, max(0, len(self.sent) - len(stop)))
            if at >= 0:
                piece = text[len(self.sent) : at]
                self.sent += piece
                return piece, Finish("stop", matched_stop=stop)
        if finished:
            end = len(text)
        else:
            end = max(len(text) - max((len(s) - 1 for s in self.stops), default=0), len(self.sent))
        piece = text[len(self.sent) : end]
        self.sent += piece
        return piece, None
