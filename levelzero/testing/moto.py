"""moto's standalone S3 server, as `python -m moto.server` serves it, plus one setup endpoint.

The benchmarks run moto's own WSGI application under werkzeug's threaded server with moto's
request handler, exactly as `moto.server.main` does, so every S3 request they measure takes the
same path. The one addition is `POST /_levelzero_bench/fill`, which creates many tiny objects at
once inside the server: a body of JSON `{"bucket": name, "keys": [key, ...]}`, each key stored
with the one-byte body `x`. Over HTTP an object costs the server about 2.5 ms (a request); here
it costs about 15 µs. The GC item deletes tens of thousands of objects per round, and creating
them one PUT at a time used to be most of its run time. Setup only: no figure times it.

    python -m levelzero.testing.moto -H 127.0.0.1 -p PORT

`moto_process` starts it as a subprocess on a free loopback port and stops it: the one moto
helper of the benchmarks (`common.moto_server`) and of the test suite (tests/conftest.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from levelzero.testing.loopback import free_local_port

FILL_PATH = "/_levelzero_bench/fill"
FILL_BODY = b"x"
FILL_KEYS_MAX = 200_000  # per request: a bounded body
MOTO_START_TIMEOUT_S = 30.0
MOTO_STOP_TIMEOUT_S = 10.0
MOTO_POLL_INTERVAL_S = 0.05


class MotoDidNotStart(RuntimeError):
    """The server exited or did not answer within MOTO_START_TIMEOUT_S (its log's tail)."""


def _wait_until_answering(proc: subprocess.Popen[bytes], url: str, log_path: Path) -> None:
    """Poll the server until it answers; fail early if the process exits. Bounded."""
    no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    for _ in range(int(MOTO_START_TIMEOUT_S / MOTO_POLL_INTERVAL_S)):
        try:
            with no_proxy.open(f"{url}/moto-api/", timeout=1.0):
                return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        try:
            proc.wait(timeout=MOTO_POLL_INTERVAL_S)  # doubles as the pause between polls
        except subprocess.TimeoutExpired:
            continue
        raise MotoDidNotStart(f"moto exited with {proc.returncode}:\n{log_path.read_text()[-4000:]}")
    raise MotoDidNotStart(f"moto did not answer within {MOTO_START_TIMEOUT_S} s at {url}")


@contextlib.contextmanager
def moto_process(log_path: Path) -> Iterator[str]:
    """This server as a subprocess on 127.0.0.1 (its output in `log_path`); yields its URL
    once it answers, stops it on the way out."""
    port = free_local_port()
    url = f"http://127.0.0.1:{port}"
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(  # noqa: S603 - our own interpreter, fixed arguments
            [sys.executable, "-m", "levelzero.testing.moto", "-H", "127.0.0.1", "-p", str(port)],
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_until_answering(proc, url, log_path)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=MOTO_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def fill_objects(bucket: str, keys: list[str]) -> None:
    """Create `keys` in `bucket` in moto's S3 backend (the default account, as the server's
    requests with the bench's credentials use).

    First, moto forgets the model instances it tracks for its dashboard: it keeps every object
    it ever made (about 3.5 KB each, deleted or not), and full collections of that growing
    heap slowed whichever way of a round ran later. Objects still in a bucket stay."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.core.model_instances import reset_model_data
    from moto.s3.models import s3_backends

    backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
    backend.get_bucket(bucket)  # raises MissingBucket before anything is stored
    reset_model_data()
    for key in keys:
        backend.put_object(bucket, key, FILL_BODY)


def with_fill(app: Callable[..., Iterable[bytes]]) -> Callable[..., Iterable[bytes]]:
    def wsgi(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != FILL_PATH:
            return app(environ, start_response)

        def answer(status: str, text: str) -> list[bytes]:
            start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
            return [text.encode()]

        if environ.get("REQUEST_METHOD") != "POST":
            return answer("405 Method Not Allowed", "POST a JSON body")
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
            request = json.loads(environ["wsgi.input"].read(length))
            bucket, keys = request["bucket"], request["keys"]
            if not isinstance(bucket, str) or not isinstance(keys, list):
                raise ValueError("bucket must be a string and keys a list")
            if len(keys) > FILL_KEYS_MAX or not all(isinstance(k, str) and k for k in keys):
                raise ValueError(f"keys must be at most {FILL_KEYS_MAX} non-empty strings")
        except (ValueError, KeyError, TypeError) as exc:
            return answer("400 Bad Request", f"bad fill request: {exc}")
        try:
            fill_objects(bucket, keys)
        except Exception as exc:  # noqa: BLE001 - moto's own errors (no such bucket) go back as text
            return answer("500 Internal Server Error", f"fill failed: {type(exc).__name__}: {exc}")
        return answer("200 OK", str(len(keys)))

    return wsgi


def main(argv: list[str] | None = None) -> None:
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import run_simple

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-H", "--host", default="127.0.0.1")
    parser.add_argument("-p", "--port", type=int, required=True)
    args = parser.parse_args(argv)
    os.environ.setdefault("MOTO_PORT", str(args.port))  # as moto.server sets it
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    app = DomainDispatcherApplication(create_backend_app)
    app.debug = True  # type: ignore[attr-defined]  # as moto.server sets it
    run_simple(
        args.host,
        args.port,
        with_fill(app),
        threaded=True,
        request_handler=MotoRequestHandler,
    )


if __name__ == "__main__":
    main()
