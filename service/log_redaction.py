"""No bearer token reaches a log line, valid or not, at any level.

uvicorn logs every websocket handshake with its query string (`"WebSocket /v1/stream?token=..."
[accepted]`) at INFO on `uvicorn.error`, whether or not access logging is on; its access log
carries each request's query string; at DEBUG the websockets library logs every handshake header
(`authorization: Bearer ...`) and at TRACE uvicorn logs each ASGI scope (`query_string`).
`TokenRedactor`, a filter on those loggers, rewrites the records before any handler formats
them: the value of a `token` query parameter and of an `authorization` header become `***`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

REDACTED = "***"
REDACTED_LOGGERS = ("uvicorn.error", "uvicorn.access", "uvicorn.asgi")
"""Where uvicorn and the websockets library (which logs to `uvicorn.error`) log requests."""
_SECRETS = re.compile(r"(?i)(\btoken=)[^&#\s\"']*|(\bauthorization:\s*)[^\r\n\"']+")
"""`token=` starting a query parameter (`?token=`, `&token=`, `b'token=`), and the value of an
`authorization` header written out in one string."""


def redact(text: str) -> str:
    """`text` with `token` query values and `authorization` header values replaced by `***`."""
    lowered = text.lower()
    if "token=" not in lowered and "authorization:" not in lowered:  # nearly every line
        return text
    return _SECRETS.sub(lambda match: (match[1] or match[2]) + REDACTED, text)


class TokenRedactor(logging.Filter):
    """Redacts tokens from a record's message and arguments, keeping their types (uvicorn's
    access formatter unpacks the arguments)."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Rewrite `record` in place; never drops it."""
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        if isinstance(record.args, tuple):
            record.args = _redacted_args(record.args)
        elif isinstance(record.args, Mapping):
            record.args = {key: _redacted(value) for key, value in record.args.items()}
        return True


def _redacted(value: Any) -> Any:
    """A string argument redacted; any other argument that would print a token (an ASGI scope)
    as its redacted text; numbers as they are."""
    if isinstance(value, str):
        return redact(value)
    if value is None or isinstance(value, int | float):
        return value
    text = str(value)
    redacted = redact(text)
    return value if redacted == text else redacted


def _redacted_args(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """The arguments redacted; the one after an `authorization` header name entirely."""
    redacted = []
    after_authorization = False
    for value in args:
        redacted.append(REDACTED if after_authorization else _redacted(value))
        after_authorization = isinstance(value, str) and value.lower() == "authorization"
    return tuple(redacted)


def install_token_redaction() -> None:
    """Add a `TokenRedactor` to each of `REDACTED_LOGGERS` (once per process)."""
    for name in REDACTED_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(existing, TokenRedactor) for existing in logger.filters):
            logger.addFilter(TokenRedactor())
