"""moto's standalone S3 server, as `python -m moto.server` serves it, plus one setup endpoint.

The benchmarks run moto's own WSGI application under werkzeug's threaded server with moto's
request handler, exactly as `moto.server.main` does, so every S3 request they measure takes the
same path. The one addition is `POST /_levelzero_bench/fill`, which creates many tiny objects at
once inside the server: a body of JSON `{"bucket": name, "keys": [key, ...]}`, each key stored
with the one-byte body `x`. Over HTTP an object costs the server about 2.5 ms (a request); here
it costs about 15 µs. The GC item deletes tens of thousands of objects per round, and creating
them one PUT at a time used to be most of its run time. Setup only: no figure times it.

    python -m levelzero.bench.moto_fill -H 127.0.0.1 -p PORT
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Callable, Iterable
from typing import Any

FILL_PATH = "/_levelzero_bench/fill"
FILL_BODY = b"x"
FILL_KEYS_MAX = 200_000  # per request: a bounded body


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
        except Exception as exc:  # moto's own errors (no such bucket) go back as text
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
