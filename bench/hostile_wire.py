"""The misbehaviours of `bench/hostile_server.py`, drawn per case by `bench/fuzz_clients.py`.

`draw_script(kind, rng, ...)` gives the HTTP answers of one case (a list of behaviours, one per
request, valid answers after it) and `draw_frames(kind, rng)` the websocket replies, each with a
label that names the misbehaviour in a violation's reproducer.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import random
from collections.abc import Callable
from functools import cache
from typing import Any

from websockets.asyncio.server import ServerConnection

from bench.hostile_server import (
    MAX_DRIP_BYTES,
    Behaviour,
    Frame,
    HostileServer,
    Inbound,
    Request,
    response,
    valid,
    valid_frame,
)

KINDS = ("valid", "bad json", "missing field", "extra field", "wrong type", "bad action",
         "huge number", "error shape", "unknown status", "5xx storm", "retry-after", "redirect",
         "slow drip", "cut body", "closed", "garbage status", "no answer", "huge body",
         "bad encoding")  # fmt: skip
WS_KINDS = ("ws valid", "ws garbage", "ws wrong reply", "ws other episode", "ws stray reply",
            "ws bad action", "ws error frame", "ws close", "ws abort", "ws silence",
            "ws handshake")  # fmt: skip
STORM = 12
"""Answers of a misbehaviour that persists: more than any retry policy should try."""
RAW = {"__NaN__": "NaN", "__Inf__": "Infinity", "__-Inf__": "-Infinity", "__big__": "1e999",
       "__bigint__": "1" + "0" * 400}  # fmt: skip
BAD_ACTIONS: list[list[Any]] = [["__NaN__", 0.0], ["__Inf__", 0.0], [0.0, "__-Inf__"],
    ["__big__", 0.0], [0.1], [], [0.0, 0.0, 0.0], [1.5, 0.0], [0.0, -7.0], [1e9, 1e9],
    ["0.5", 0.0], [None, 0.0], [True, 0.0], [[0.1], 0.0], [0.1] * 5000]  # fmt: skip
WRONG_VALUES: list[Any] = ["x", [], {}, None, True, -1, "__NaN__", "__bigint__", 0.5]
RETRY_AFTERS = ["-1", "-0.5", "1e9", "inf", "nan", "garbage", "Wed, 21 Oct 2015 07:28:00 GMT",
                "0", "0.01", "", "1e999", "  0  ", "0x10", "9" * 400, "1, 2"]  # fmt: skip


def encode(body: Any) -> bytes:
    text = json.dumps(body)
    for placeholder, raw in RAW.items():
        text = text.replace(f'"{placeholder}"', raw)
    return text.encode()


def send(raw: bytes, keep: bool = False) -> Behaviour:
    async def behaviour(server: HostileServer, request: Request, writer: Any) -> bool:
        writer.write(raw)
        await writer.drain()
        return keep

    return behaviour


def mutate(change: Callable[[Any], Any], status: int = 200, headers: Any = None) -> Behaviour:
    """A valid body changed by `change` (a new body; bytes are sent as they are)."""

    async def behaviour(server: HostileServer, request: Request, writer: Any) -> bool:
        body = change(server.valid_body(request))
        raw = body if isinstance(body, bytes) else encode(body)
        writer.write(response(status, raw, headers))
        await writer.drain()
        return True

    return behaviour


def _set(key: str, value: Any) -> Callable[[Any], Any]:
    return lambda body: body | {key: value}


def _drip(padding: int) -> Behaviour:
    async def behaviour(server: HostileServer, request: Request, writer: Any) -> bool:
        body = encode(server.valid_body(request)) + b" " * padding
        writer.write(response(200, b"", length=len(body)))
        for index in range(len(body)):
            writer.write(body[index : index + 1])
            await writer.drain()
            await asyncio.sleep(0.05)
        return True

    return behaviour


def _endless(server: HostileServer, request: Request, writer: Any) -> Any:
    async def behaviour() -> bool:
        writer.write(response(200, b"", {"Content-Length": None, "Transfer-Encoding": "chunked"}))
        chunk = b" " * 65536
        for _ in range(MAX_DRIP_BYTES // len(chunk)):
            writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            await writer.drain()
        await server.stall()
        return False

    return behaviour()


async def _stall(server: HostileServer, request: Request, writer: Any) -> bool:
    await server.stall()
    return False


@cache
def _gzip_bomb() -> bytes:
    return gzip.compress(b'{"models": []' + b" " * (64 * 2**20) + b"}", compresslevel=1)


def _bad_json(rng: random.Random) -> tuple[Behaviour, str]:
    html = b"<html><body>502 Bad Gateway</body></html>"
    variants: list[bytes | None] = [None, b"", html, rng.randbytes(40), b"[]", b"null",
        b'"ok"', b"{", b"{'a': 1}", b"\xef\xbb\xbf{}"]  # fmt: skip
    raw = rng.choice(variants)
    if raw is None:
        cut = rng.randrange(1, 60)
        return mutate(lambda body: encode(body)[:cut]), f"JSON cut after {cut} bytes"
    return mutate(lambda body: raw), f"body {raw[:40]!r}"


def _missing(rng: random.Random) -> tuple[Behaviour, str]:
    seed = rng.random()

    def change(body: dict[str, Any]) -> dict[str, Any]:
        if isinstance(body.get("models"), list) and body["models"] and seed < 0.7:
            card = dict(body["models"][0])
            card.pop(sorted(card)[int(seed * 100) % len(card)])
            return {"models": [card]}
        body.pop(sorted(body)[int(seed * 100) % len(body)])
        return body

    return mutate(change), f"field {int(seed * 100)} dropped"


def _wrong_type(rng: random.Random) -> tuple[Behaviour, str]:
    index, value = rng.randrange(100), rng.choice(WRONG_VALUES)

    def change(body: dict[str, Any]) -> dict[str, Any]:
        return body | {sorted(body)[index % len(body)]: value}

    return mutate(change), f"field {index} set to {value!r}"


def _error_shape(rng: random.Random) -> tuple[Behaviour, str]:
    status = rng.choice([400, 401, 403, 404, 409, 410, 412, 413, 422, 429, 500, 502, 503, 504])
    raw = rng.choice([b"", b"oops", b"<html><h1>Server Error</h1></html>", b"[]",
        b'{"detail": "x"}', b'{"code": 5, "detail": null}', b'{"detail": [{"msg": "bad"}]}',
        b"x" * 200_000, b"line1\nline2\r\nline3 \x1b[31mred\x00", encode(
            {"code": "boom", "detail": "a\nb " * 30000, "field": ["x"]}),
        encode({"code": "boom", "detail": "line one\nline two", "field": None})])  # fmt: skip
    return mutate(lambda body: raw, status), f"{status} with body {raw[:40]!r}"


def _statuses(rng: random.Random) -> tuple[list[Behaviour], str]:
    status = rng.choice([202, 203, 204, 205, 206, 226, 299, 300, 304, 402, 418, 420, 451, 499,
                         505, 520, 599, 999, 103])  # fmt: skip
    if status == 103:
        return [mutate(lambda body: b"", 103, {"Content-Length": None})], "103 then nothing"
    if rng.random() < 0.5:
        return [mutate(lambda body: body, status)], f"{status} with a valid body"
    return [mutate(lambda body: b"", status)] * STORM, f"{status} with no body, repeated"


def draw_script(
    kind: str, rng: random.Random, method: str, call: str
) -> tuple[list[Behaviour], str]:
    """The answers of one case of misbehaviour `kind`, and their label."""
    if kind == "valid":
        return [valid], "valid answers"
    if kind == "bad json":
        behaviour, label = _bad_json(rng)
        return [behaviour], label
    if kind == "missing field":
        behaviour, label = _missing(rng)
        return [behaviour], label
    if kind == "extra field":
        return [mutate(lambda body: body | {"surprise": [1, {"x": None}], "type": "?"})], "extra"
    if kind == "wrong type":
        behaviour, label = _wrong_type(rng)
        return [behaviour], label
    if kind == "bad action":
        action = rng.choice(BAD_ACTIONS)
        return [mutate(_set("action", action))], f"action {encode(action)[:40]!r}"
    if kind == "huge number":
        key = rng.choice(["step", "remaining_cost", "remaining_reward", "revision", "steps"])
        value = rng.choice(["__big__", "__bigint__", "__NaN__", 1e308])
        return [mutate(_set(key, value))], f"{key} = {RAW.get(str(value), value)!s:.20}"
    if kind == "error shape":
        behaviour, label = _error_shape(rng)
        return [behaviour] * rng.choice([1, STORM]), label
    if kind == "unknown status":
        return _statuses(rng)
    if kind == "5xx storm":
        statuses = [rng.choice([500, 502, 503, 504]) for _ in range(STORM)]
        hint = rng.choice([None, "0", "0.01"])
        body = encode({"code": "store_unavailable", "detail": "down", "field": None})
        return [mutate(lambda _, raw=body: raw, status, {"Retry-After": hint})
                for status in statuses], f"{statuses[:4]}... Retry-After {hint}"  # fmt: skip
    if kind == "retry-after":
        status = rng.choice([409, 429, 503])
        code = {409: "episode_busy", 429: "too_many_episodes", 503: "store_unavailable"}[status]
        hint = rng.choice(RETRY_AFTERS)
        body = encode({"code": code, "detail": "later", "field": None})
        count = rng.choice([1, STORM])
        behaviour = mutate(lambda _: body, status, {"Retry-After": hint})
        return [behaviour] * count, f"{status} Retry-After {hint[:20]!r} x{count}"
    if kind == "redirect":
        status = rng.choice([301, 302, 303, 307, 308])
        location = rng.choice([None, "", "/v1/models", "http://127.0.0.1:1/v1/models",
                               "javascript:alert(1)", "//evil.invalid/x", "../x"])  # fmt: skip
        headers = {"Location": location}
        return [mutate(lambda _: b"", status, headers)] * STORM, f"{status} to {location!r}"
    if kind == "slow drip":
        count = rng.choice([1, STORM])
        return [_drip(2000)] * count, f"body dripped at 20 bytes/s x{count}"
    if kind == "cut body":
        variant = rng.choice(["short", "chunk size", "chunk cut"])
        raw = {"short": response(200, b'{"episode_id": "ep', length=400),
               "chunk size": response(200, b"zz\r\n{}\r\n0\r\n\r\n", {"Content-Length": None,
                                      "Transfer-Encoding": "chunked"}),
               "chunk cut": response(200, b"40\r\n{\"models\"", {"Content-Length": None,
                                     "Transfer-Encoding": "chunked"})}[variant]  # fmt: skip
        return [send(raw)] * rng.choice([1, STORM]), f"body {variant}, then closed"
    if kind == "closed":
        return [send(b"")] * rng.choice([1, STORM]), "closed without answer"
    if kind == "garbage status":
        raw = rng.choice([b"HTTP/1.1 abc\r\n\r\n", b"SSH-2.0-OpenSSH_9.6\r\n", rng.randbytes(64),
            b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n", b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n",
            b"HTTP/2 200\r\n\r\n", b"\r\n\r\n"])  # fmt: skip
        return [send(raw)] * rng.choice([1, STORM]), f"raw {raw[:30]!r}"
    if kind == "no answer":
        count = rng.choice([1, STORM])
        return [_stall] * count, f"no answer x{count}"
    if kind == "huge body":
        variant = rng.choice(["padded", "endless", "error"])
        if variant == "endless":
            return [_endless], "an endless chunked body"
        status = 200 if variant == "padded" else 500
        pad = b" " * (24 * 2**20)
        return [mutate(lambda body: encode(body) + pad, status)], f"{variant} 24 MiB body"
    if kind == "bad encoding":
        coding = rng.choice(["gzip", "deflate", "br", "zstd", "x-unknown", "gzip-bomb"])
        if coding == "gzip-bomb":
            return [mutate(lambda _: _gzip_bomb(), 200, {"Content-Encoding": "gzip"})], coding
        return [mutate(lambda body: body, 200, {"Content-Encoding": coding})], f"{coding} body"
    raise ValueError(kind)


# ---- websocket -----------------------------------------------------------------------------


def reply(change: Callable[[dict[str, Any]], Any], keep: bool = True) -> Frame:
    async def frame(server: HostileServer, inbound: Inbound, socket: ServerConnection) -> bool:
        body = change(valid_frame(inbound))
        await socket.send(body if isinstance(body, bytes | str) else encode(body).decode())
        return keep

    return frame


def then(*frames: Frame) -> Frame:
    async def frame(server: HostileServer, inbound: Inbound, socket: ServerConnection) -> bool:
        for each in frames:
            if not await each(server, inbound, socket):
                return False
        return True

    return frame


async def _ws_stall(server: HostileServer, inbound: Inbound, socket: ServerConnection) -> bool:
    await server.stall()
    return False


async def _ws_abort(server: HostileServer, inbound: Inbound, socket: ServerConnection) -> bool:
    socket.transport.abort()
    return False


def _ws_close(code: int, reason: str) -> Frame:
    async def frame(server: HostileServer, inbound: Inbound, socket: ServerConnection) -> bool:
        await socket.close(code, reason)
        return False

    return frame


def draw_frames(kind: str, rng: random.Random) -> tuple[list[Frame], str]:
    """The websocket replies of one case of misbehaviour `kind`, and their label."""
    ok = reply(lambda body: body)
    if kind in ("ws valid", "ws handshake"):
        return [], "valid replies"
    if kind == "ws garbage":
        raw = rng.choice(["}{", "", "null", "[1]", rng.randbytes(30), encode({"type": "action"}),
                          '{"request_id": "1", "type": "action"}', "NaN", b"\xff\xfe",
                          "x" * (2 * 2**20)])  # fmt: skip
        after = rng.choice([[], [ok]])
        first = reply(lambda _: raw)
        return [then(first, *after)], f"frame {raw[:30]!r}{' then a valid one' if after else ''}"
    if kind == "ws wrong reply":
        wrong = rng.choice(["state", "ended", "action", "hello", 7, None])
        return [reply(lambda body: body | {"type": wrong})], f"reply of type {wrong!r}"
    if kind == "ws other episode":
        other = rng.choice(["ep-999", "", "../ep-1", 5])
        return [reply(lambda body: body | {"episode_id": other})], f"episode_id {other!r}"
    if kind == "ws stray reply":
        stray = rng.choice(["999", None, "", 1])
        first = reply(lambda body: body | {"request_id": stray})
        return [then(first, ok)], f"a reply for request_id {stray!r}, then the real one"
    if kind == "ws bad action":
        action = rng.choice(BAD_ACTIONS)
        return [reply(lambda body: body | {"action": action})], f"action {encode(action)[:40]!r}"
    if kind == "ws error frame":
        status = rng.choice([409, 429, 503, 999, 0, -1, 200, "500"])
        hint = rng.choice([None, -5, 0, 10**12, 0.5, "soon", 1e999])
        shape = {
            "type": "error",
            "status": status,
            "code": rng.choice(["episode_busy", 5, None]),
            "detail": rng.choice(["busy", "", "a\nb", None]),
            "retry_after": hint,
        }
        count = rng.choice([1, STORM])
        frame = reply(lambda body: shape | {"request_id": body["request_id"]})
        return [frame] * count, f"error {json.dumps(shape)[:80]} x{count}"
    if kind == "ws close":
        code = rng.choice([1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 1012, 1013,
                           3000, 4000, 4999])  # fmt: skip
        reason = rng.choice(["", "bye", "x" * 120, "\u00e9\u4e2d"])
        return [_ws_close(code, reason)], f"close {code} {reason[:10]!r}"
    if kind == "ws abort":
        return [_ws_abort], "connection aborted"
    if kind == "ws silence":
        return [_ws_stall] * STORM, "no reply"
    raise ValueError(kind)
