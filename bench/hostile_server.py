"""A hostile policy server for `bench/fuzz_clients.py`: raw HTTP/1.1 and a websocket endpoint.

    server = HostileServer().start()
    server.arm([drip_body, ...])   # the next requests' misbehaviour, in order; then valid answers
    ... PolicyClient(server.http_url) ...
    server.stop()

The HTTP side is a raw asyncio socket server, so it can break the protocol itself (truncated,
dripped, endless or undecodable bodies, garbage status lines, closes mid-body, no answer at all).
The websocket side (`websockets`, `ws_url`) answers each frame with the next scripted
`Frame` behaviour. Every valid answer speaks for the one model `CARD` (2 actions in [-1, 1]).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from websockets.asyncio.server import Server, ServerConnection, serve

CARD: dict[str, Any] = {
    "name": "toy",
    "version": "1",
    "task": "toy-task",
    "observation_dim": 3,
    "action_dim": 2,
    "action_low": [-1.0, -1.0],
    "action_high": [1.0, 1.0],
    "context_len": 4,
    "max_episode_len": 6,
    "default_targets": [{"reward": 10.0, "cost": 5.0}],
    "reward_return_range": [0.0, 20.0],
}
ACTION = [0.25, -0.5]
MAX_DRIP_BYTES = 256 * 2**20
"""An endless body stops after this many bytes (then stalls), so a client without a cap cannot
eat the machine's memory before the case's hard timeout."""


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> dict[str, Any]:
        try:
            value = json.loads(self.body or b"{}")
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}


def episode_id_of(path: str) -> str:
    parts = path.split("?")[0].split("/")
    return parts[3] if len(parts) > 3 and parts[2] == "episodes" else "ep-1"


def step_answer(episode_id: str, step: int, action: list[Any] | None = None) -> dict[str, Any]:
    return {
        "episode_id": episode_id,
        "action": list(ACTION) if action is None else action,
        "step": step,
        "remaining_reward": 5.0,
        "remaining_cost": 2.0,
        "budget_exhausted": False,
        "model": "toy",
        "model_version": "1",
        "revision": step + 1,
    }


def episode_answer(episode_id: str) -> dict[str, Any]:
    return {
        "episode_id": episode_id,
        "model": "toy",
        "model_version": "1",
        "step": 3,
        "target_reward": 10.0,
        "target_cost": 5.0,
        "remaining_reward": 5.0,
        "remaining_cost": 2.0,
        "total_reward": 5.0,
        "total_cost": 3.0,
        "budget_exhausted": False,
        "deterministic": False,
        "seed": 0,
        "created_at": 1.0,
        "expires_at": 2.0,
    }


def summary_answer(episode_id: str) -> dict[str, Any]:
    return {
        "episode_id": episode_id,
        "model": "toy",
        "model_version": "1",
        "steps": 6,
        "total_reward": 5.0,
        "total_cost": 3.0,
        "remaining_reward": 5.0,
        "remaining_cost": 2.0,
        "budget_exhausted": False,
    }


class HostileServer:
    """Both endpoints on free 127.0.0.1 ports, served from one event loop in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.script: list[Behaviour] = []
        self.frames: list[Frame] = []
        self.requests: list[str] = []
        """`METHOD path` of every HTTP request and `ws <type>` of every frame since `arm`."""
        self.closed_ok: list[int] = []
        """The indices (in `requests`) of the DELETEs that got a valid answer since `arm`."""
        self.created = 0
        self._writers: set[asyncio.StreamWriter] = set()
        self._sockets: set[ServerConnection] = set()
        self._release = asyncio.Event()
        self._ws: Server | None = None
        self.http_url = self.ws_url = ""

    def start(self) -> HostileServer:
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self._thread.start()
        ready.wait(10.0)
        return self

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._listen())
        ready.set()
        self.loop.run_forever()
        self.loop.run_until_complete(self._close())
        self.loop.close()

    async def _listen(self) -> None:
        self._http = http = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self._ws = await serve(self._serve_ws, "127.0.0.1", 0, compression=None, max_size=None)
        self.http_url = f"http://127.0.0.1:{http.sockets[0].getsockname()[1]}"
        self.ws_url = f"ws://127.0.0.1:{self._ws.sockets[0].getsockname()[1]}"

    def arm(self, script: list[Behaviour], frames: list[Frame] | None = None) -> None:
        """End the last case (its connections are closed) and script the next one."""
        asyncio.run_coroutine_threadsafe(self._arm(script, frames or []), self.loop).result(10)

    async def _arm(self, script: list[Behaviour], frames: list[Frame]) -> None:
        self._release.set()
        self._release = asyncio.Event()
        for writer in list(self._writers):
            writer.transport.abort()
        for socket in list(self._sockets):
            socket.transport.abort()
        self.script, self.frames, self.requests, self.closed_ok = script, frames, [], []
        self.created = 0

    def stop(self) -> None:
        self.arm([])
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10.0)

    async def _close(self) -> None:
        self._http.close()
        assert self._ws is not None
        self._ws.close()
        await self._http.wait_closed()
        await self._ws.wait_closed()
        tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def stall(self) -> None:
        """Wait until the case ends (a server that never answers)."""
        await self._release.wait()

    async def _serve_ws(self, socket: ServerConnection) -> None:
        await _serve_ws_connection(self, socket)

    # ---- HTTP ------------------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while (request := await _read_request(reader)) is not None:
                self.requests.append(f"{request.method} {request.path}")
                behaviour = self.script.pop(0) if self.script else valid
                if not await behaviour(self, request, writer):
                    break
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            self._writers.discard(writer)
            with contextlib.suppress(Exception):
                writer.transport.abort()

    def valid_body(self, request: Request) -> dict[str, Any]:
        """The answer a correct server would give (status 200 or 201)."""
        path, method = request.path.split("?")[0], request.method
        if path == "/v1/models":
            return {"models": [CARD]}
        if path == "/readyz":
            return {"status": "ok", "models": 1}
        if path == "/v1/admin/reload":
            return {"loaded": [], "unchanged": [{"name": "toy", "version": "1"}], "removed": [],
                    "failed": []}  # fmt: skip
        if path == "/v1/episodes" and method == "POST":
            self.created += 1
            return step_answer(f"ep-{self.created}", 0)
        episode = episode_id_of(path)
        if path.endswith("/step"):
            step = request.json().get("step")
            return step_answer(episode, step if isinstance(step, int) else 1)
        if method == "DELETE":
            return summary_answer(episode)
        return episode_answer(episode)


Behaviour = Callable[[HostileServer, Request, asyncio.StreamWriter], Awaitable[bool]]
"""One answer to one request; returns whether the connection stays open."""


async def valid(server: HostileServer, request: Request, writer: asyncio.StreamWriter) -> bool:
    body = server.valid_body(request)
    status = 201 if request.method == "POST" and request.path == "/v1/episodes" else 200
    if request.method == "DELETE":
        server.closed_ok.append(len(server.requests) - 1)
    writer.write(response(status, json.dumps(body).encode()))
    await writer.drain()
    return True


def response(
    status: int | str,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
    *,
    length: int | None = None,
) -> bytes:
    """Raw bytes of an answer: status line, headers (Content-Length unless given), body."""
    fields = {"Content-Type": "application/json", "Content-Length": str(len(body))}
    if length is not None:
        fields["Content-Length"] = str(length)
    fields |= headers or {}
    head = f"HTTP/1.1 {status} X\r\n" + "".join(
        f"{name}: {value}\r\n" for name, value in fields.items() if value is not None
    )
    return head.encode("latin-1") + b"\r\n" + body


async def _read_request(reader: asyncio.StreamReader) -> Request | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        return None
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = ([*lines[0].split(" ", 2), "", ""])[:3]
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name:
            headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0") or 0))
    return Request(method, path, headers, body)


# ---- websocket -----------------------------------------------------------------------------


@dataclass
class Inbound:
    """One frame the client sent."""

    data: dict[str, Any] = field(default_factory=dict)

    @property
    def request_id(self) -> Any:
        return self.data.get("request_id")

    @property
    def episode_id(self) -> str:
        return str(self.data.get("episode_id", "ep-1"))


Frame = Callable[[HostileServer, Inbound, ServerConnection], Awaitable[bool]]
"""One answer to one websocket frame; returns whether to keep reading."""


def valid_frame(frame: Inbound) -> dict[str, Any]:
    kind = frame.data.get("type")
    if kind == "start":
        body = step_answer("ep-1", 0) | {"type": "action"}
    elif kind == "step":
        step = frame.data.get("step")
        body = step_answer(frame.episode_id, step if isinstance(step, int) else 1)
        body["type"] = "action"
    elif kind == "budget":
        body = episode_answer(frame.episode_id) | {"type": "state"}
    else:
        body = summary_answer(frame.episode_id) | {"type": "ended"}
    return body | {"request_id": frame.request_id}


async def valid_reply(server: HostileServer, frame: Inbound, socket: ServerConnection) -> bool:
    await socket.send(json.dumps(valid_frame(frame)))
    return True


async def _serve_ws_connection(server: HostileServer, socket: ServerConnection) -> None:
    server._sockets.add(socket)
    try:
        async for raw in socket:
            try:
                data = json.loads(raw)
            except ValueError:
                data = {}
            frame = Inbound(data if isinstance(data, dict) else {})
            server.requests.append(f"ws {frame.data.get('type')}")
            behaviour = server.frames.pop(0) if server.frames else valid_reply
            if not await behaviour(server, frame, socket):
                break
    except Exception:  # a hostile server shrugs off whatever the client does
        pass
    finally:
        server._sockets.discard(socket)
