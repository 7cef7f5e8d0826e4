"""Errors the allocator raises; the gRPC layer maps each to its status code."""


class MemdError(Exception):
    code = "INTERNAL"


class InvalidArgument(MemdError):
    code = "INVALID_ARGUMENT"


class NotFound(MemdError):
    code = "NOT_FOUND"


class ResourceExhausted(MemdError):
    code = "RESOURCE_EXHAUSTED"


class FailedPrecondition(MemdError):
    code = "FAILED_PRECONDITION"


class InvariantViolation(MemdError):
    """The leak invariant or a structural invariant broke: a bug in memd."""

    code = "INTERNAL"
