"""A request's grammar state: the bitmask of the tokens it allows next, for one position or along a DFLASH block's
drafts, and its advance by the committed tokens.

Under DFLASH, verify row j of a block is sampled from the target's distribution masked by the state after the
committed tokens and drafts d_1..d_j. A draft the grammar refuses cannot be accepted (the target's token at the row
before it is masked, so it never equals the draft), so the walk stops there: the rows after it are never committed
and take no mask. The walk's drafts are rolled back, and the matcher advances by what verify committed."""

import time

import torch

ALL_ALLOWED = -1  # an int32 word of set bits
# One step's masks of one request on the host: past this the request ends (RESOURCE_EXHAUSTED). The engine thread
# builds every constrained request's masks inside the step, so a grammar whose masks are slow to compute would hold
# up every other request; a usual schema's take tens of microseconds a position (BENCHMARKS.md).
MAX_MASK_SECONDS = 0.05


def bitmask_rows(rows: int, vocab_size: int) -> torch.Tensor:
    """[rows, words] int32 on the host, every token allowed: the rows without a grammar stay so."""
    return torch.full((rows, (vocab_size + 31) // 32), ALL_ALLOWED, dtype=torch.int32)


class RequestGrammar:
    def __init__(self, compiled):
        """compiled: an xgrammar CompiledGrammar (modeld.grammar.compiler)."""
        import xgrammar  # imported with the first constraint: a modeld that serves none never loads it

        self.matcher = xgrammar.GrammarMatcher(compiled)
        self.step_seconds = 0.0  # the host time of its last step's masks

    @property
    def too_slow(self) -> bool:
        return self.step_seconds > MAX_MASK_SECONDS

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        """The tokens allowed at the next position, into bitmask[row] (a step's one mask)."""
        began = time.perf_counter()
        self._fill(bitmask, row)
        self.step_seconds = time.perf_counter() - began

    def fill_block(self, bitmask: torch.Tensor, first_row: int, drafts: list[int]) -> None:
        """The masks of a verify block [t, d_1..d_{B-1}] into rows first_row.. : row j is the state after the
        drafts before it; the walk stops at the first draft the grammar refuses, and is rolled back."""
        began = time.perf_counter()
        self._fill(bitmask, first_row)
        walked = 0
        for j, draft in enumerate(drafts, start=1):
            if self.matcher.is_terminated() or not self.matcher.accept_token(draft):
                break
            walked += 1
            self._fill(bitmask, first_row + j)
        if walked:
            self.matcher.rollback(walked)
        self.step_seconds = time.perf_counter() - began

    def _fill(self, bitmask: torch.Tensor, row: int) -> None:
        """A finished grammar is asked for no mask: its stop token ended the request (or, inside a block, the rows
        after it are never committed), so its row stays as it was."""
        if not self.matcher.is_terminated():
            self.matcher.fill_next_token_bitmask(bitmask, row)

    def advance(self, tokens: list[int]) -> None:
        """Commits the step's tokens (each drawn under this grammar's mask, so each is allowed; a finished grammar
        takes nothing more: its stop token ended the request)."""
        for token in tokens:
            if self.matcher.is_terminated():
                return
            if not self.matcher.accept_token(token):
                raise RuntimeError(f"token {token} was committed against its grammar's mask")
