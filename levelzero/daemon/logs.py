"""Structured logs: one line per event, `key=value` or JSON, to stderr (journald) or a file.

A log call's `extra={...}` fields become fields of the line (`log.info("epoch advanced",
extra={"epoch": 7})` -> `... msg="epoch advanced" epoch=7`). A traceback stays on the same line
(escaped), so journald and `grep` see one event as one line. `configure_logging` replaces the
root handlers, so calling it again (SIGHUP) re-opens a log file that logrotate moved away.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, TextIO

from levelzero.core.throttled_warning import ThrottledRecords

_STANDARD_ATTRS = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys()
    | {"message", "asctime", "color_message", "taskName"}
)
_BARE_VALUE_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./:@+,[]()")


def _timestamp(created: float) -> str:
    seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created))
    return f"{seconds}.{int(created % 1 * 1000):03d}Z"


def _fields(record: logging.LogRecord, formatter: logging.Formatter) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "ts": _timestamp(record.created),
        "level": record.levelname.lower(),
        "logger": record.name,
        "msg": record.getMessage(),
    }
    for key, value in vars(record).items():
        if key not in _STANDARD_ATTRS and not key.startswith("_") and key not in fields:
            fields[key] = value
    if record.exc_info:
        fields["exc"] = formatter.formatException(record.exc_info)
    elif record.exc_text:
        fields["exc"] = record.exc_text
    return fields


def _kv_value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    if text and all(c in _BARE_VALUE_CHARS for c in text):
        return text
    return json.dumps(text)  # quotes, and escapes newlines: one event stays one line


class KeyValueFormatter(logging.Formatter):
    """`ts=... level=info logger=levelzero.node msg="node ready" partitions=4`."""

    def format(self, record: logging.LogRecord) -> str:
        return " ".join(f"{k}={_kv_value(v)}" for k, v in _fields(record, self).items())


class JsonFormatter(logging.Formatter):
    """One JSON object per line, the same fields as `KeyValueFormatter`."""

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(_fields(record, self), default=str)


class ErrorWithoutTraceback(logging.Filter):
    """A library's warning about a failure it retries by itself keeps the error's one line (an
    `error` field), not its traceback: asyncpg's pool re-connecting while PostgreSQL is down
    logged ~1.8 KB of its own call stack a line, which says nothing the error does not."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.levelno < logging.ERROR:
            error = record.exc_info[1]
            record.error = f"{type(error).__name__}: {error}"
            record.exc_info = None
            record.exc_text = None
        return True


# Loggers whose retried failures are logged without a traceback (a logger's filters are not
# inherited by its children: each is named).
RETRYING_LIBRARY_LOGGERS = ("asyncpg.pool",)


# A library's warning logged once per request a client sends (uvicorn's for each request that is
# not HTTP: anyone who can connect could grow the log at will), per logger: let through at most
# once an interval, with the count held back (`ThrottledRecords`).
THROTTLED_LIBRARY_WARNINGS = {"uvicorn.error": frozenset({"Invalid HTTP request received."})}


FORMATTERS: dict[str, type[logging.Formatter]] = {"kv": KeyValueFormatter, "json": JsonFormatter}


def configure_logging(
    level: str = "info", fmt: str = "kv", file: str = "", *, stream: TextIO | None = None
) -> logging.Handler:
    """(Re)create the root handler. Quiet third-party chatter below warnings."""
    handler: logging.Handler
    if file:
        handler = logging.FileHandler(file, encoding="utf-8")
    else:
        handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(FORMATTERS[fmt]())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(level.upper())
    for noisy in ("botocore", "aiobotocore", "aiosqlite", "asyncio", "httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
    for name in RETRYING_LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, ErrorWithoutTraceback) for f in logger.filters):
            logger.addFilter(ErrorWithoutTraceback())
    for name, messages in THROTTLED_LIBRARY_WARNINGS.items():
        logger = logging.getLogger(name)
        for old_filter in [f for f in logger.filters if isinstance(f, ThrottledRecords)]:
            logger.removeFilter(old_filter)
        logger.addFilter(ThrottledRecords(messages, time.monotonic))
    return handler
