"""Python client of modeld (sync and asyncio) and read-only tools for memd."""

from client.aio import AsyncClient, AsyncStreamHandle
from client.client import Client, StreamHandle
from client.connection import default_modeld_address
from client.errors import (
    AlreadyExists,
    BadArgument,
    Cancelled,
    ClientError,
    DeadlineExceeded,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unavailable,
)
from client.messages import Chunk, GenerateResult, TokenLogprob, TopLogprob

__all__ = [
    "AlreadyExists",
    "AsyncClient",
    "AsyncStreamHandle",
    "BadArgument",
    "Cancelled",
    "Chunk",
    "Client",
    "ClientError",
    "DeadlineExceeded",
    "FailedPrecondition",
    "GenerateResult",
    "Internal",
    "InvalidArgument",
    "NotFound",
    "ResourceExhausted",
    "StreamHandle",
    "TokenLogprob",
    "TopLogprob",
    "Unavailable",
    "default_modeld_address",
]
