"""Sessions as capabilities.

A session's id is a secret: 128 random bits, made at Attach and sent only on that Attach stream. Every call
of the session (Alloc, Free, MatchPrefix, MatchPrefixBatch) carries it, and it is the only thing that names the
session to memd, so a caller that does not hold it cannot act in the session. memd never shows it: logs, Capacity and
the
allocator know the session by its label ("session 3", a serial number, public), and a call with an id that
names no open session gets NOT_FOUND whether or not the id is someone's label, so labels tell nothing.
"""

import itertools
import secrets
from dataclasses import dataclass

from memd.errors import NotFound

SECRET_BYTES = 16  # 128 bits


@dataclass(frozen=True)
class Session:
    label: str  # public: logs, Capacity, and the allocator's key for the session
    client_name: str
    model: str  # the model identity the client sent ("": no prefix cache)


class SessionTable:
    def __init__(self):
        self._by_secret: dict[str, Session] = {}
        self._serials = itertools.count(1)

    def open(self, client_name: str, model: str) -> tuple[str, Session]:
        """A new session: (its secret, the session)."""
        secret = secrets.token_hex(SECRET_BYTES)
        session = Session(f"session {next(self._serials)}", client_name, model)
        self._by_secret[secret] = session
        return secret, session

    def close(self, secret: str) -> None:
        self._by_secret.pop(secret, None)

    def resolve(self, secret: str) -> Session:
        """The open session whose secret this is; NOT_FOUND (the id is not repeated) otherwise."""
        session = self._by_secret.get(secret)
        if session is None:
            raise NotFound("unknown session: session_id must be the secret that Attach returned to this client")
        return session

    def __iter__(self):
        return iter(list(self._by_secret.values()))

    def __len__(self) -> int:
        return len(self._by_secret)
