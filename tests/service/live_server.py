"""A real uvicorn server in a thread (the guarded protocols, a free port of 127.0.0.1) and a
capture of the log lines it emits, for tests of what only a real server does."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from fastapi import FastAPI

from service.http_guard import GuardedHTTPProtocol, GuardedWebSocketProtocol

SERVER_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi")


@contextmanager
def live_server(
    app: FastAPI, *, log_level: str = "warning", access_log: bool = False
) -> Iterator[int]:
    """Serve `app` as `cdt serve` does; yields the port. Logger levels are restored after."""
    levels = {name: logging.getLogger(name).level for name in SERVER_LOGGERS}
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        app,
        http=GuardedHTTPProtocol,
        ws=GuardedWebSocketProtocol,
        log_level=log_level,
        access_log=access_log,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]})
    thread.start()
    try:
        while not server.started and thread.is_alive():
            time.sleep(0.01)
        yield int(listener.getsockname()[1])
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        listener.close()
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.NOTSET)
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))
        self.lines: list[str] = []
        self.levels: list[int] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))  # the traceback too, when there is one
        self.levels.append(record.levelno)


@contextmanager
def captured_logs() -> Iterator[_Lines]:
    """Every line the server's loggers emit meanwhile, formatted as a handler would."""
    handler = _Lines()
    names = ("uvicorn.error", "uvicorn.access", "uvicorn.asgi")
    loggers = [logging.getLogger(name) for name in names]
    for logger in loggers:  # they log to handlers of their own or of "uvicorn", not to the root
        logger.addHandler(handler)
    try:
        yield handler
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
