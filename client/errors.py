"""Errors raised by the client: one class per gRPC status code that callers act on.

Every error keeps the status code name (`code`, e.g. "INVALID_ARGUMENT") and the server's
message, so `except client.errors.ResourceExhausted:` and `err.code == "RESOURCE_EXHAUSTED"`
both work. Codes without a class of their own raise the base `ClientError`.
"""

import grpc


class ClientError(Exception):
    """A failed call: `code` is the gRPC status code name, `message` the details."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class InvalidArgument(ClientError):
    """The request was rejected as malformed (bad sampling parameter, prompt too long, ...)."""


class BadArgument(InvalidArgument, ValueError):
    """An argument the client refuses before sending anything: a wrong type, a value its field cannot carry, an
    impossible combination. An InvalidArgument (as modeld's own refusals are) and a ValueError."""

    def __init__(self, message: str):
        super().__init__("INVALID_ARGUMENT", message)


class NotFound(ClientError):
    """The named object (e.g. a request id) does not exist."""


class AlreadyExists(ClientError):
    """The object to create exists already (e.g. a request id that is running)."""


class ResourceExhausted(ClientError):
    """The server has no room for the request now (KV pages, queue)."""


class FailedPrecondition(ClientError):
    """The server is not in a state to serve the call."""


class Unavailable(ClientError):
    """The server could not be reached or is not ready; retried before being raised."""


class DeadlineExceeded(ClientError):
    """The call did not finish within its timeout."""


class Cancelled(ClientError):
    """The call was cancelled."""


class Internal(ClientError):
    """The server (or the stream it sent) broke an invariant."""


ERROR_CLASSES = {
    "INVALID_ARGUMENT": InvalidArgument,
    "NOT_FOUND": NotFound,
    "ALREADY_EXISTS": AlreadyExists,
    "RESOURCE_EXHAUSTED": ResourceExhausted,
    "FAILED_PRECONDITION": FailedPrecondition,
    "UNAVAILABLE": Unavailable,
    "DEADLINE_EXCEEDED": DeadlineExceeded,
    "CANCELLED": Cancelled,
    "INTERNAL": Internal,
}


def error_for(code: str, message: str) -> ClientError:
    """The ClientError subclass for a status code name, holding `message`."""
    return ERROR_CLASSES.get(code, ClientError)(code, message)


def from_rpc_error(exc: grpc.RpcError) -> ClientError:
    """Translate a grpc.RpcError (sync or aio) into the matching ClientError."""
    return error_for(exc.code().name, exc.details() or "")
