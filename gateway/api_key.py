"""An optional API key on the OpenAI routes (an ASGI middleware, outside every other): with one set, a request to
/v1/... must carry `Authorization: Bearer <key>` (what the openai package sends for its api_key), or it gets 401 in
OpenAI's error shape before its body is read. /health and /livez stay open: probes carry no key.

The trade-off: without a key, anyone who can reach the gateway's port can generate, where modeld's and memd's Unix
sockets are owner-only; the gateway listens on loopback by default, so that is every local user. A key closes that
for a gateway on a shared host or beyond loopback. It is compared in constant time; it travels in clear over plain
HTTP, so beyond one host put TLS in front (a proxy or the ingress)."""

import hmac

from fastapi.responses import JSONResponse

from gateway.errors import error_body

UNAUTHORIZED = 401
PROTECTED_PREFIX = "/v1/"


class ApiKey:
    def __init__(self, app, key: str):
        self.app, self.expected = app, f"Bearer {key}".encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(PROTECTED_PREFIX) and not self._authorized(scope):
            response = JSONResponse(
                error_body(
                    "a valid API key is required: send it as 'Authorization: Bearer <key>'",
                    "invalid_request_error",
                    code="invalid_api_key",
                ),
                status_code=UNAUTHORIZED,
                headers={"www-authenticate": "Bearer", "connection": "close"},
            )
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _authorized(self, scope) -> bool:
        given = next((value for name, value in scope["headers"] if name == b"authorization"), b"")
        return hmac.compare_digest(given, self.expected)
