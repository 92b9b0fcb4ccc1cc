"""`cdt serve` option handling (uvicorn itself is not started here)."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from service.cli import build_parser, main, settings_environment
from service.config import Settings
from service.http_guard import GuardedHTTPProtocol, GuardedWebSocketProtocol


@pytest.fixture(autouse=True)
def restore_environment() -> Iterator[None]:
    """`main` exports the options as `CDT_*` variables (for uvicorn's workers): undo that."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The keyword arguments of each `uvicorn.run` call, which starts nothing here."""
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(uvicorn, "run", lambda *_, **kwargs: calls.append(kwargs))
    monkeypatch.delenv("CDT_REDIS_URL", raising=False)
    monkeypatch.delenv("REDIS_URL", raising=False)
    return calls


def refusal(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run `cdt serve ARGV`, which must exit 2 with one line on stderr; returns that line."""
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("cdt serve: ")
    return lines[0]


def test_settings_environment_maps_given_options_to_cdt_variables() -> None:
    options = ["--models-dir", "m", "--api-token", "a", "--api-token", "b"]
    guards = ["--header-timeout", "2.5", "--body-timeout", "20", "--max-connections", "500"]
    args = build_parser().parse_args([*options, *guards])
    env = settings_environment(args)
    assert env == {
        "CDT_MODELS_DIR": "m",
        "CDT_API_TOKENS": "a,b",
        "CDT_HTTP_HEADER_TIMEOUT_S": "2.5",
        "CDT_HTTP_BODY_TIMEOUT_S": "20.0",
        "CDT_HTTP_MAX_CONNECTIONS": "500",
    }


def test_settings_read_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDT_MODELS_DIR", "elsewhere")
    monkeypatch.setenv("CDT_API_TOKENS", "x, y")
    monkeypatch.delenv("CDT_REDIS_URL", raising=False)
    monkeypatch.setenv("REDIS_URL", "redis://r:6379/0")
    settings = Settings(_env_file=None)
    assert settings.models_dir == Path("elsewhere")
    assert settings.api_tokens == {"x", "y"}
    assert settings.redis_url == "redis://r:6379/0"


def test_settings_defaults_serve_models_in_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("CDT_MODELS_DIR", "CDT_REDIS_URL", "REDIS_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CDT_INFERENCE", "thread")  # a removed setting: ignored, not an error
    settings = Settings(_env_file=None)
    assert settings.models_dir == Path("models") and settings.redis_url is None
    assert "inference" not in Settings.model_fields


def test_serve_several_workers_without_redis_exits_2(
    served: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    assert "--redis-url" in refusal(["--workers", "2"], capsys)
    assert not served


def test_serve_missing_models_folder_exits_2_with_one_line(
    served: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    line = refusal(["--models-dir", "/missing"], capsys)
    assert line == "cdt serve: models folder /missing does not exist"
    assert not served


def test_serve_empty_models_folder_exits_2_unless_allowed(
    served: list[dict[str, Any]], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert "--allow-empty" in refusal(["--models-dir", str(tmp_path)], capsys)
    main(["--models-dir", str(tmp_path), "--allow-empty", "--port", "0"])
    assert len(served) == 1


def test_serve_one_models_folder_gets_a_hint(
    served: list[dict[str, Any]], capsys: pytest.CaptureFixture[str], models_dir: Path
) -> None:
    line = refusal(["--models-dir", str(models_dir / "toy")], capsys)
    assert f"point --models-dir at the folder that holds it ({models_dir.resolve()})" in line


def test_serve_invalid_option_exits_2_with_one_line(
    served: list[dict[str, Any]], capsys: pytest.CaptureFixture[str], models_dir: Path
) -> None:
    line = refusal(["--models-dir", str(models_dir), "--episode-ttl", "-1"], capsys)
    assert line.startswith("cdt serve: invalid CDT_EPISODE_TTL_S: ")


def test_serve_runs_uvicorn_with_the_guarded_protocol(
    served: list[dict[str, Any]], models_dir: Path
) -> None:
    main(["--models-dir", str(models_dir), "--keep-alive", "3", "--port", "0"])
    (call,) = served
    assert call["http"] is GuardedHTTPProtocol and call["ws"] is GuardedWebSocketProtocol
    assert call["factory"] and not call["access_log"]
    assert os.environ["CDT_HTTP_KEEP_ALIVE_S"] == "3.0"


def test_serve_refuses_a_bad_or_busy_port_and_a_bogus_redis_url_before_loading(
    served: list[dict[str, Any]], capsys: pytest.CaptureFixture[str], models_dir: Path
) -> None:
    assert "--port: must lie in 0-65535" in refusal(["--port", "-1"], capsys)
    with socket.create_server(("127.0.0.1", 0)) as busy:
        taken = str(busy.getsockname()[1])
        line = refusal(["--models-dir", str(models_dir), "--port", taken], capsys)
    assert line.startswith(f"cdt serve: cannot listen on 127.0.0.1:{taken}")
    line = refusal(["--models-dir", str(models_dir), "--redis-url", "bogus://x"], capsys)
    assert line.startswith("cdt serve: invalid CDT_REDIS_URL: ")
    assert not served
