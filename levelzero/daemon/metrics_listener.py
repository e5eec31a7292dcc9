"""The optional metrics listener (`metrics.listen`): `GET /metrics` alone, without the token.

A Prometheus that scrapes many services often cannot present a per-service bearer token, and
the API's listener may sit on a public address that needs one. This second listener (bind it to
a private or loopback address) serves the same registry and nothing else: no records, no
controls, so it needs no token. A plain ASGI callable: three answers need no framework.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

METRICS_CONNECTIONS_MAX = 64  # scrapers, not clients: a small bound


def metrics_app(registry: CollectorRegistry) -> Any:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:  # noqa: ARG001
        assert scope["type"] == "http", scope["type"]  # uvicorn runs with lifespan and ws off
        if scope["path"] != "/metrics":
            status, body = 404, b'{"error": "not_found", "message": "only /metrics here"}'
            kind = b"application/json"
        elif scope["method"] not in ("GET", "HEAD"):
            status, body = 405, b'{"error": "method_not_allowed", "message": "GET /metrics"}'
            kind = b"application/json"
        else:
            status, body, kind = 200, generate_latest(registry), CONTENT_TYPE_LATEST.encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", kind), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body})

    return app
