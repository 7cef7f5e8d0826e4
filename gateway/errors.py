"""Errors in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, with the HTTP status of each cause."""

from fastapi.responses import JSONResponse

from client.errors import ClientError

# modeld's gRPC status -> (HTTP status, OpenAI error type)
STATUS_OF_CODE = {
    "INVALID_ARGUMENT": (400, "invalid_request_error"),
    "NOT_FOUND": (404, "invalid_request_error"),
    "ALREADY_EXISTS": (409, "invalid_request_error"),
    "RESOURCE_EXHAUSTED": (429, "rate_limit_error"),
    "UNAVAILABLE": (503, "service_unavailable"),
    "DEADLINE_EXCEEDED": (504, "timeout"),
}
SERVER_ERROR = (500, "server_error")
RETRY_STATUSES = (429, 503)  # answers that tell the client when to come back (Retry-After)


class ApiError(Exception):
    """A refusal the gateway answers itself."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        retry_after: int | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.kind, self.code, self.param = status, message, kind, code, param
        self.retry_after = retry_after  # seconds, sent as Retry-After (every 429 and 503 carries one)


def error_body(message: str, kind: str, code: str | None = None, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def api_error_response(exc: ApiError) -> JSONResponse:
    headers = {"Retry-After": str(exc.retry_after)} if exc.retry_after is not None else None
    return JSONResponse(error_body(exc.message, exc.kind, exc.code, exc.param), status_code=exc.status, headers=headers)


def from_client_error(exc: ClientError, retry_after: int) -> ApiError:
    """modeld's refusal as the gateway answers it; `retry_after` goes with a 429 or 503."""
    status, kind = STATUS_OF_CODE.get(exc.code, SERVER_ERROR)
    return ApiError(
        status,
        exc.message or exc.code,
        kind,
        code=exc.code.lower(),
        retry_after=retry_after if status in RETRY_STATUSES else None,
    )
