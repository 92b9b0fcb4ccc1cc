"""No token, valid or not, appears in any line the server logs, at any level."""

from __future__ import annotations

import json
import logging
import urllib.request

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from service.config import Settings
from service.log_redaction import REDACTED_LOGGERS, TokenRedactor, install_token_redaction, redact
from service.main import create_app
from tests.service.live_server import captured_logs, live_server

TOKEN = "alice-secret-1"
WRONG = ("wrong-secret-2", "wrong-secret-3", "wrong-secret-4")
START = json.dumps(
    {"type": "start", "model": "toy", "target_reward": 1.0, "target_cost": 1.0}
    | {"observation": [0.0, 0.0, 0.0]}
)


def test_server_logs_no_token_at_any_level(settings: Settings) -> None:
    app = create_app(settings.model_copy(update={"api_tokens": frozenset({TOKEN})}))
    with live_server(app, log_level="trace", access_log=True) as port, captured_logs() as logs:
        url = f"ws://127.0.0.1:{port}/v1/stream"
        with connect(f"{url}?token={TOKEN}", open_timeout=10) as websocket:
            websocket.send(START)
            assert json.loads(websocket.recv(timeout=10))["type"] == "action"
        with (
            pytest.raises(ConnectionClosed),
            connect(f"{url}?token={WRONG[0]}", open_timeout=10) as refused,
        ):
            refused.recv(timeout=10)
        headers = {"Authorization": f"Bearer {TOKEN}"}
        with connect(url, additional_headers=headers, open_timeout=10) as websocket:
            websocket.send(START)
            assert json.loads(websocket.recv(timeout=10))["type"] == "action"
        with (
            pytest.raises(ConnectionClosed),
            connect(url, additional_headers={"Authorization": WRONG[1]}) as refused,
        ):
            refused.recv(timeout=10)
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/models?token={WRONG[2]}", headers=headers
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200
    text = "\n".join(logs.lines)
    assert '"WebSocket /v1/stream?token=***" [accepted]' in text  # the line stays, not the token
    assert "GET /v1/models?token=***" in text and "authorization: ***" in text.lower()
    for secret in (TOKEN, *WRONG):
        assert secret not in text


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("GET /v1/stream?token=abc HTTP/1.1", "GET /v1/stream?token=*** HTTP/1.1"),
        ("/v1/stream?a=1&TOKEN=abc&b=2", "/v1/stream?a=1&TOKEN=***&b=2"),
        ("Authorization: Bearer abc.def", "Authorization: ***"),
        ("missing or invalid bearer token", "missing or invalid bearer token"),
        ("'query_string': b'token=abc&x=1'", "'query_string': b'token=***&x=1'"),
        ("/v1/stream?mytoken=abc&access_token=b", "/v1/stream?mytoken=abc&access_token=b"),
        ("no secrets here", "no secrets here"),
    ],
)
def test_redact_hides_query_tokens_and_authorization_values(line: str, expected: str) -> None:
    assert redact(line) == expected


def test_redactor_keeps_the_arguments_a_formatter_unpacks() -> None:
    record = logging.LogRecord(
        "uvicorn.access", logging.INFO, "", 0, '%s - "%s %s HTTP/%s" %d',
        ("1.2.3.4:5", "GET", "/v1/models?token=abc", "1.1", 200), None,
    )  # fmt: skip
    assert TokenRedactor().filter(record)
    assert record.args == ("1.2.3.4:5", "GET", "/v1/models?token=***", "1.1", 200)
    header = logging.LogRecord(
        "uvicorn.error", logging.DEBUG, "", 0, "< %s: %s", ("Authorization", "abc"), None
    )
    TokenRedactor().filter(header)
    assert header.getMessage() == "< Authorization: ***"


def test_install_token_redaction_adds_one_filter_per_logger() -> None:
    install_token_redaction()
    install_token_redaction()
    for name in REDACTED_LOGGERS:
        filters = logging.getLogger(name).filters
        assert sum(isinstance(item, TokenRedactor) for item in filters) == 1
