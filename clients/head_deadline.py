"""A time limit on the head of a synchronous answer (status line and headers) as a whole.

httpx bounds each read of a head by the read timeout, so a server that drips it a byte at a time
holds a synchronous call for as long as it likes; a sync call has no `asyncio.wait_for`. The
client's own transport reads through streams that cut each read's timeout to what is left of the
call's limit, which `head_limit` sets around sending.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import ssl
import time
import typing
from collections.abc import Iterator

import httpcore
import httpx

# (monotonic deadline, the limit in seconds) of the call being sent on this thread; None: none
_LIMIT: contextvars.ContextVar[tuple[float, float] | None] = contextvars.ContextVar(
    "head_limit", default=None
)


@contextlib.contextmanager
def head_limit(seconds: float) -> Iterator[None]:
    """Reads made inside this block by a `head_bounded_transport` end within `seconds` of its
    start (math.inf: no limit beyond each read's own timeout)."""
    limit = None if math.isinf(seconds) else (time.monotonic() + seconds, seconds)
    token = _LIMIT.set(limit)
    try:
        yield
    finally:
        _LIMIT.reset(token)


class _LimitedStream(httpcore.NetworkStream):
    """A network stream whose reads end by the deadline `head_limit` set, if any."""

    def __init__(self, stream: httpcore.NetworkStream) -> None:
        self._stream = stream

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        limit = _LIMIT.get()
        if limit is None:
            return self._stream.read(max_bytes, timeout)
        deadline, seconds = limit
        left = deadline - time.monotonic()
        if timeout is not None and timeout < left:
            return self._stream.read(max_bytes, timeout)
        if left > 0:
            with contextlib.suppress(httpcore.ReadTimeout):  # the call's limit ran out
                return self._stream.read(max_bytes, left)
        raise httpcore.ReadTimeout(f"no answer's head within {seconds:g} s")

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._stream.write(buffer, timeout)

    def close(self) -> None:
        self._stream.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        return _LimitedStream(self._stream.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> typing.Any:
        return self._stream.get_extra_info(info)


class _LimitedBackend(httpcore.NetworkBackend):
    """Opens connections as `backend` does, each read through a `_LimitedStream`."""

    def __init__(self, backend: httpcore.NetworkBackend) -> None:
        self._backend = backend

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: typing.Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        stream = self._backend.connect_tcp(host, port, timeout, local_address, socket_options)
        return _LimitedStream(stream)

    def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: typing.Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        return _LimitedStream(self._backend.connect_unix_socket(path, timeout, socket_options))

    def sleep(self, seconds: float) -> None:
        self._backend.sleep(seconds)


def head_bounded_transport() -> httpx.HTTPTransport:
    """httpx's default transport, its connections read through `_LimitedStream`s.

    httpx offers no public way to choose a transport's network backend, so the one its pool
    holds is wrapped; should a later httpx or httpcore rename it, this is the plain transport
    (each read of a head bounded, not the whole; tests/clients catch that)."""
    transport = httpx.HTTPTransport()
    pool = getattr(transport, "_pool", None)
    backend = getattr(pool, "_network_backend", None)
    if isinstance(backend, httpcore.NetworkBackend):
        pool._network_backend = _LimitedBackend(backend)  # type: ignore[union-attr]
    return transport
