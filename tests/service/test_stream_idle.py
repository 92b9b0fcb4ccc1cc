"""`WS /v1/stream` idle timeout: a real uvicorn server in a thread, probed with a websocket
client whose reads time out (a socket that is never closed fails the test, not hangs it)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from pydantic import ValidationError
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from service.cli import build_parser, settings_environment
from service.config import Settings
from service.main import create_app
from tests.service.live_server import live_server

IDLE_S = 0.3
"""`ws_idle_timeout_s` of the test server."""
OBSERVATION = [0.1, -0.2, 0.3]
START = {"type": "start", "model": "toy", "target_reward": 5.0, "target_cost": 1.0}
IDLE_REASON = f"idle for {IDLE_S:g} s without a frame"


@pytest.fixture
def port(settings: Settings) -> Iterator[int]:
    """Serve the app, with a short websocket idle timeout, on a free port of 127.0.0.1."""
    idle = settings.model_copy(update={"ws_idle_timeout_s": IDLE_S})
    with live_server(create_app(idle)) as served_port:
        yield served_port


def open_stream(port: int) -> ClientConnection:
    return connect(f"ws://127.0.0.1:{port}/v1/stream", open_timeout=10)


def request(websocket: ClientConnection, frame: dict[str, Any]) -> dict[str, Any]:
    websocket.send(json.dumps(frame))
    reply: dict[str, Any] = json.loads(websocket.recv(timeout=5))
    return reply


def start_episode(websocket: ClientConnection) -> str:
    started = request(websocket, START | {"observation": OBSERVATION})
    assert started["type"] == "action", started
    return str(started["episode_id"])


def step(episode_id: str) -> dict[str, Any]:
    return {"type": "step", "episode_id": episode_id, "observation": OBSERVATION}


def wait_for_close(websocket: ClientConnection) -> ConnectionClosed:
    """The server's close; fails when no close comes within 5 s (the socket was kept)."""
    with pytest.raises(ConnectionClosed) as closed:
        websocket.recv(timeout=5)
    return closed.value


def test_silent_socket_is_closed_1001_after_the_idle_timeout(port: int) -> None:
    with open_stream(port) as websocket:
        began = time.monotonic()
        closed = wait_for_close(websocket)
        waited_s = time.monotonic() - began
    assert closed.rcvd is not None, "closed without a close frame"
    assert (closed.rcvd.code, closed.rcvd.reason) == (1001, IDLE_REASON)
    assert IDLE_S * 0.8 <= waited_s < IDLE_S + 1.0


def test_socket_that_keeps_sending_stays_open_until_idle_after_its_last_frame(port: int) -> None:
    with open_stream(port) as websocket:
        episode_id = start_episode(websocket)
        began = time.monotonic()
        while time.monotonic() - began < 3 * IDLE_S:  # a frame every third of the timeout
            stepped = request(websocket, step(episode_id) | {"reward": 1.0, "cost": 0.0})
            assert stepped["type"] == "action", stepped
            time.sleep(IDLE_S / 3)
        last_answer = time.monotonic()
        closed = wait_for_close(websocket)  # the timer counts from the last frame
        waited_s = time.monotonic() - last_answer
    assert closed.rcvd is not None and closed.rcvd.code == 1001
    assert IDLE_S * 0.5 <= waited_s < IDLE_S + 1.0


def test_idle_close_ends_none_of_the_sockets_episodes(port: int) -> None:
    with open_stream(port) as websocket:
        episode_id = start_episode(websocket)
        closed = wait_for_close(websocket)
    assert closed.rcvd is not None and closed.rcvd.code == 1001
    state = httpx.get(f"http://127.0.0.1:{port}/v1/episodes/{episode_id}", timeout=5)
    assert state.status_code == 200, state.text  # live: an ended episode answers 410
    with open_stream(port) as websocket:  # another socket carries it on
        stepped = request(websocket, step(episode_id) | {"reward": 1.0, "cost": 0.5})
    assert (stepped["type"], stepped["step"]) == ("action", 1)


def test_idle_timeout_is_a_positive_setting_with_a_serve_flag() -> None:
    args = build_parser().parse_args(["--ws-idle-timeout", "2.5"])
    assert settings_environment(args) == {"CDT_WS_IDLE_TIMEOUT_S": "2.5"}
    assert Settings(_env_file=None).ws_idle_timeout_s == 60.0
    with pytest.raises(ValidationError):
        Settings(_env_file=None, ws_idle_timeout_s=0)
