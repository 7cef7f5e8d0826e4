"""memd's bounds on what one call may carry, all in one place.

Each bound is one that no call a client needs can pass, so refusing past it (INVALID_ARGUMENT, before any work) turns
away nothing of use:
- a session holds at most --max-running-requests requests and may name each at most once per op list, so no op list
  of Alloc or Free (commits, trims, finish, cache; extends and grows together) is longer;
- a request holds at most the context, so a Translate needs no more slots than the running requests hold together;
- session and request ids, and model fingerprints, are at most MAX_ID_BYTES (modeld bounds its request ids, which it
  uses as memd's, the same; a session id is 32 hex digits, modeld's fingerprint 32);
- a client name is at most MAX_CLIENT_NAME_CHARS.
A message longer than max_request_bytes() is refused by gRPC itself (RESOURCE_EXHAUSTED) before it is parsed.
"""

from dataclasses import dataclass
from itertools import chain

from memd.errors import InvalidArgument

MAX_ID_BYTES = 256
MAX_CLIENT_NAME_CHARS = 256
VARINT_BYTES = 5  # the most bytes one int32 token id or slot takes on the wire (ids and slots are never negative)
OP_BYTES = 32  # one op's fields and framing, besides its id
OP_LISTS = 6  # commits, trims, finish, cache, extends, grows
MESSAGE_SLACK_BYTES = 4 << 20  # gRPC's own default bound: headroom for the rest of any message


def max_request_bytes(max_running_requests: int, context_len: int) -> int:
    """The gRPC receive bound of memd's server: every op list full with ids of the longest, and a whole context of
    token ids (or slots) for every running request (the cache ops of a Free, or one Translate)."""
    ops = OP_LISTS * max_running_requests * (MAX_ID_BYTES + OP_BYTES)
    return MESSAGE_SLACK_BYTES + ops + max_running_requests * context_len * VARINT_BYTES


def check_id(kind: str, value: str) -> None:
    if len(value) > MAX_ID_BYTES or len(value.encode()) > MAX_ID_BYTES:  # len(str) <= its UTF-8 bytes: cheap first
        raise InvalidArgument(f"{kind} is {len(value.encode())} bytes: at most {MAX_ID_BYTES}")


def check_attach(request) -> None:
    """An AttachRequest: its client name and model fingerprint."""
    if len(request.client_name) > MAX_CLIENT_NAME_CHARS:
        raise InvalidArgument(f"client_name is {len(request.client_name)} characters: at most {MAX_CLIENT_NAME_CHARS}")
    check_id("model_fingerprint", request.model_fingerprint)


@dataclass(frozen=True)
class CallLimits:
    max_ops: int  # per op list: the request cap (--max-running-requests)
    max_slots: int  # in one Translate: request cap x context

    def check_release(self, request, call: str = "Free") -> None:
        """A FreeRequest, alone or as an AllocRequest's release."""
        check_id("session_id", request.session_id)
        for name, ops in (
            ("commits", request.commits),
            ("trims", request.trims),
            ("finish", request.finish),
            ("cache", request.cache),
        ):
            self._check_count(call, f"{name} ops", len(ops))
        for rid in chain(
            (op.rid for op in request.commits),
            (op.rid for op in request.trims),
            request.finish,
            (op.rid for op in request.cache),
        ):
            check_id("a request id", rid)

    def check_alloc(self, request) -> None:
        check_id("session_id", request.session_id)
        self.check_release(request.release, "Alloc")
        self._check_count("Alloc", "extends and grows", len(request.extends) + len(request.grows))
        for op in chain(request.extends, request.grows):
            check_id("a request id", op.rid)

    def check_match(self, request) -> None:
        check_id("session_id", request.session_id)
        check_id("a request id", request.rid)

    def check_match_batch(self, request) -> None:
        check_id("session_id", request.session_id)
        self._check_count("MatchPrefixBatch", "items", len(request.items))
        for item in request.items:
            check_id("a request id", item.rid)

    def check_translate(self, request) -> None:
        if len(request.target_slots) > self.max_slots:
            raise InvalidArgument(
                f"Translate carries {len(request.target_slots)} slots: at most {self.max_slots} "
                "(the request cap times the context)"
            )

    def _check_count(self, call: str, what: str, count: int) -> None:
        if count > self.max_ops:
            raise InvalidArgument(
                f"{call} carries {count} {what}: at most {self.max_ops} in one call (memd's --max-running-requests)"
            )
