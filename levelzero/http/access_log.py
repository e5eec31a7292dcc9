"""The access log (`server.access_log = true`): one structured event per HTTP request.

uvicorn's own access log is a line of text; this one is an event like every other log line,
so with `logging.format = "json"` its method, path, status, size and latency are JSON fields:
`msg="http request" method=POST path=/v1/topics/t/partitions/0/records status=200 bytes=52
duration_ms=12.4 client=127.0.0.1:53122`. The query string is left out (it is data, and the
token never travels there anyway); the path is the route as the client sent it.
"""

from __future__ import annotations

import logging
import time
from typing import Any

log = logging.getLogger("levelzero.access")

Scope = dict[str, Any]


class AccessLogMiddleware:
    """ASGI middleware: time each HTTP request from its arrival to its last response byte."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status: int | None = None
        size = 0

        async def sending(message: dict[str, Any]) -> None:
            nonlocal status, size
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                size += len(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            client = scope.get("client")
            log.info(
                "http request",
                extra={
                    "method": scope["method"],
                    "path": scope["path"],
                    "status": status,  # None: the client went away before an answer
                    "bytes": size,
                    "duration_ms": round((time.perf_counter() - started) * 1000, 3),
                    "client": f"{client[0]}:{client[1]}" if client else None,
                },
            )
