"""The HTTP server against clients that misbehave: ones that go away mid-body, that lean on
redirects or on a web page's form posts. Real uvicorn on a free loopback port, raw sockets
where a well-behaved client library would not misbehave."""

from __future__ import annotations

import logging
from pathlib import Path

import anyio
import pytest
from daemon_support import daemon_and_client

RECORDS = "/v1/topics/t/partitions/0/records"
WAIT_S = 10.0


def assert_error(response, status: int, code: str, fragment: str = "") -> None:  # noqa: ANN001
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert set(body) == {"error", "message"}
    assert body["error"] == code, body
    assert fragment in body["message"], body


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


async def test_a_client_gone_mid_body_is_499_not_a_logged_500(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "levelzero.api")
    async with daemon_and_client(tmp_path) as (daemon, client):
        await client.create_topic("t", 1)
        assert daemon.url is not None
        stream = await anyio.connect_tcp("127.0.0.1", port_of(daemon.url))
        await stream.send(
            f"POST {RECORDS} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            "Content-Length: 1000\r\n\r\n{\"records\": [".encode()
        )
        await stream.aclose()
        route = '{code="499",route="/v1/topics/{topic}/partitions/{partition}/records"} 1.0'
        with anyio.fail_after(WAIT_S):
            while route not in (text := await client.metrics()):
                await anyio.sleep(0.01)
        assert 'code="500"' not in text
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert errors == [], [r.getMessage() for r in errors]
        assert any("closed the connection" in r.getMessage() for r in caplog.records)
        assert (await client.produce("t", 0, [b"still serving"])).base_offset == 0


async def test_a_trailing_slash_is_a_404_without_a_location(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path) as (_, client):
        http = client._http
        for path in ("/v1/topics/", "/v1/status/", "/healthz/"):
            response = await http.get(path, headers={"Host": "evil.example"})
            assert_error(response, 404, "not_found", f"no trailing slash: {path.rstrip('/')}")
            assert "location" not in response.headers


async def test_posts_must_say_they_are_json(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path) as (_, client):
        http = client._http
        body = b'{"name": "t", "partitions": 1}'
        for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
            response = await http.post("/v1/topics", content=body, headers={"Content-Type": content_type})
            assert_error(response, 415, "unsupported_media_type", "POST needs Content-Type: application/json")
        assert_error(await http.post("/v1/topics", content=body), 415, "unsupported_media_type", "got none")
        for path in ("/v1/epoch/advance", "/v1/gc/pause", "/v1/gc/run", "/v1/housekeeper/run"):
            assert_error(await http.post(path), 415, "unsupported_media_type")
        assert await client.list_topics() == []  # nothing was created
        assert (await client.status()).gc.paused is False
        created = await http.post(
            "/v1/topics", content=body, headers={"Content-Type": "Application/JSON; charset=utf-8"}
        )
        assert created.status_code == 201, created.text
        epoch = (await client.status()).cluster_epoch
        assert await client.advance_epoch() == epoch + 1  # the bundled client says it is JSON
