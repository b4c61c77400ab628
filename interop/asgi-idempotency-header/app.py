"""Demo app for idem-conformance: asgi-idempotency-header 0.2.0 on FastAPI, served by uvicorn.

Deployed as the package's README shows (the `Middleware(IdempotencyHeaderMiddleware,
backend=...)` form; the README's first form, `app.add_middleware(IdempotencyHeaderMiddleware(
backend=backend))`, does not construct) with the in-memory backend and default options:
header `Idempotency-Key`, replay header `Idempotent-Replayed`, no UUID enforcement, methods
POST and PATCH.

Env: PORT (default 0: the OS chooses), DELAY_MS (default 100), IDEMPOTENCY_EXPIRY_S (unset:
the backend's default expiry, 24 h; set it to run the CLI's expiry cases).

Body "outcome": "decline" -> 402, "unavailable" -> 503, and (beyond the common brief, for
lease/1's --crash-body) "crash" -> the first attempt under a given key raises (Starlette
answers 500); a later attempt with that key, were one to reach the handler, succeeds as usual.

The middleware has no way to scope keys by principal (no key function, no prefix hook), so
none is configured: one key is shared by every caller and every route.
"""

import asyncio
import os
import signal
import socket
import sys
from typing import Any, Dict, Optional

import uvicorn
from fastapi import Body, FastAPI, Header
from fastapi.middleware import Middleware
from fastapi.responses import JSONResponse
from idempotency_header_middleware import IdempotencyHeaderMiddleware
from idempotency_header_middleware.backends import MemoryBackend

PORT = int(os.environ.get("PORT", "0"))
DELAY_MS = int(os.environ.get("DELAY_MS", "100"))

backend = MemoryBackend()
if os.environ.get("IDEMPOTENCY_EXPIRY_S"):
    backend = MemoryBackend(expiry=int(os.environ["IDEMPOTENCY_EXPIRY_S"]))

app = FastAPI(middleware=[Middleware(IdempotencyHeaderMiddleware, backend=backend)])

executions = 0
crashed_keys: set = set()


def first_attempt(key: Optional[str]) -> bool:
    """True the first time `key` is seen (always true without a key)."""
    if key is None:
        return True
    if key in crashed_keys:
        return False
    crashed_keys.add(key)
    return True


@app.get("/count")
async def count() -> dict:
    # GET is not in the middleware's applicable_methods: not behind it.
    return {"count": executions}


@app.post("/orders")
async def create_order(
    body: Optional[Dict[str, Any]] = Body(default=None),
    idempotency_key: Optional[str] = Header(default=None),
) -> JSONResponse:
    # FastAPI reads and parses the body before the handler runs, as for any body parameter.
    global executions
    executions += 1
    n = executions
    await asyncio.sleep(DELAY_MS / 1000)
    outcome = body.get("outcome") if isinstance(body, dict) else None
    if outcome == "decline":
        return JSONResponse({"error": "card_declined", "execution": n}, status_code=402)
    if outcome == "unavailable":
        return JSONResponse({"error": "unavailable", "execution": n}, status_code=503)
    if outcome == "crash" and first_attempt(idempotency_key):
        raise RuntimeError(f"handler crashed (execution {n})")
    return JSONResponse(
        {"id": f"ord_{n}", "execution": n},
        status_code=201,
        headers={"Location": f"/orders/ord_{n}"},
    )


def main() -> None:
    # Bind first, so that the chosen port is known before the line is printed.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", PORT))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", access_log=False)
    server = uvicorn.Server(config)

    async def serve() -> None:
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:
            if task.done():
                await task
                return
            await asyncio.sleep(0.01)
        print(f"listening on http://127.0.0.1:{port}", flush=True)
        await task

    # uvicorn handles SIGTERM/SIGINT while it serves (a graceful shutdown), then restores the
    # previous handlers and raises the signal again: with these, that ends the process with
    # status 0 instead of death by signal.
    def leave(signum: int, frame: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, leave)
    signal.signal(signal.SIGINT, leave)
    asyncio.run(serve())
    sys.exit(0)


if __name__ == "__main__":
    main()
