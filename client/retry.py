"""The deadline and retry rule of one client call, shared by the sync and async clients.

A call has one deadline for all its attempts. Only UNAVAILABLE is retried, after 0.1 s, 0.2 s,
0.4 s, ... (at most max_retries times, and never past the deadline). A Generate stream that has
delivered a message is never retried: its callers raise instead of asking for a delay.
"""

import time

import grpc

from client import arguments, errors

FIRST_BACKOFF_S = 0.1


class CallBudget:
    """Deadline and remaining retries of one call."""

    def __init__(self, timeout: float, max_retries: int):
        arguments.positive("timeout", timeout)
        self.deadline = time.monotonic() + timeout
        self.retries_left = max_retries
        self.backoff = FIRST_BACKOFF_S

    def remaining(self) -> float:
        """Seconds left before the deadline; DeadlineExceeded when none are."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise errors.error_for("DEADLINE_EXCEEDED", "the call's deadline passed between attempts")
        return left

    def retry_delay(self, code: grpc.StatusCode) -> float | None:
        """Seconds to wait before the next attempt after a failure with `code`, or None to give up."""
        if code != grpc.StatusCode.UNAVAILABLE or self.retries_left == 0:
            return None
        if time.monotonic() + self.backoff >= self.deadline:
            return None
        delay = self.backoff
        self.retries_left -= 1
        self.backoff *= 2
        return delay
