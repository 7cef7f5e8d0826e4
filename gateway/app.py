"""The HTTP application: OpenAI's routes, readiness (/health) and liveness (/livez), and errors in OpenAI's shape."""

import logging
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from gateway.api_key import ApiKey
from gateway.backends import Backends
from gateway.body_limit import BodyLimit
from gateway.config import GatewayConfig
from gateway.discovery import RESOLVE_INTERVAL, Resolver, resolve
from gateway.errors import ApiError, api_error_response, error_body
from gateway.generation import generate
from gateway.router import Router
from gateway.schemas import ChatRequest, CompletionRequest

log = logging.getLogger("gateway")


def create_app(cfg: GatewayConfig, resolver: Resolver = resolve, resolve_interval: float = RESOLVE_INTERVAL) -> FastAPI:
    """The app over cfg's modelds; DNS names among them are resolved by `resolver` every `resolve_interval` s."""
    router = Router(cfg.affinity_block_chars, cfg.affinity_entries, cfg.affinity_max_imbalance)
    state = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        backends = Backends(
            cfg.modelds,
            cfg.request_timeout,
            cfg.poll_interval,
            cfg.max_queued,  # grpc.aio: in the loop
            cfg.queue_timeout,
            resolver=resolver,
            resolve_interval=resolve_interval,
        )
        await backends.start()
        state["backends"] = backends
        log.info(
            "gateway ready: %d modeld(s), serving %s", len(backends.all), ", ".join(backends.models()) or "nothing yet"
        )
        yield
        await backends.close()

    app = FastAPI(title="dflash-serve gateway", lifespan=lifespan)
    app.add_middleware(BodyLimit, max_bytes=cfg.max_body_bytes, timeout=cfg.body_timeout)  # before any route runs
    if cfg.api_key is not None:  # added last, so outermost: an unauthorized body is never read
        app.add_middleware(ApiKey, key=cfg.api_key)

    @app.exception_handler(ApiError)
    async def on_api_error(request: Request, exc: ApiError):
        return api_error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def on_invalid(request: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        if first.get("type") == "json_invalid":  # its loc is a character offset of the body, not a field
            reason = first.get("ctx", {}).get("error", "not JSON")
            offset = first.get("loc", ("body", "?"))[-1]
            message = f"the request body is not valid JSON: {reason} at character {offset}"
            return JSONResponse(error_body(message, "invalid_request_error"), status_code=400)
        where = ".".join(str(part) for part in first.get("loc", ())[1:])
        message = f"{where}: {first.get('msg', 'invalid request')}" if where else first.get("msg", "invalid request")
        return JSONResponse(error_body(message, "invalid_request_error", param=where or None), status_code=400)

    @app.exception_handler(HTTPException)
    async def on_http_error(request: Request, exc: HTTPException):
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return JSONResponse(error_body(str(exc.detail), kind), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def on_bug(request: Request, exc: Exception):
        log.exception("request failed")
        return JSONResponse(error_body(f"internal error: {exc}", "server_error"), status_code=500)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatRequest, request: Request):
        return await generate(request, state["backends"], router, body, chat=True)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        return await generate(request, state["backends"], router, body, chat=False)

    @app.get("/v1/models")
    async def models():
        names = state["backends"].models()
        return {
            "object": "list",
            "data": [{"id": name, "object": "model", "created": 0, "owned_by": "dflash-serve"} for name in names],
        }

    @app.get("/health")
    async def health():
        """Readiness: 200 while at least one modeld answered SERVING at the last poll (no RPC here), else 503."""
        backends = state["backends"]
        ready = backends.ready()
        body = {
            "status": "ok" if ready else "unavailable",
            "modelds": len(ready),
            "backends": [{"index": b.index, "health": b.health, "ready": b.ready} for b in backends.all],
        }
        if not ready:
            body["message"] = f"no modeld is ready: none of {len(backends.all)} answers SERVING to grpc.health"
        return JSONResponse(body, status_code=200 if ready else 503)

    @app.get("/livez")
    async def livez():
        """Liveness: 200 while the gateway's process runs and answers, whatever its modelds do."""
        return {"status": "alive"}

    return app
