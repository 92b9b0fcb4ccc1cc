"""`cdt serve` option handling (uvicorn itself is not started here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.cli import build_parser, main, settings_environment
from service.config import Settings


def test_settings_environment_maps_given_options_to_cdt_variables() -> None:
    args = build_parser().parse_args(
        ["--models-dir", "m", "--api-token", "a", "--api-token", "b", "--no-batching"]
    )
    env = settings_environment(args)
    assert env == {"CDT_MODELS_DIR": "m", "CDT_API_TOKENS": "a,b", "CDT_BATCHING": "false"}


def test_settings_read_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDT_MODELS_DIR", "elsewhere")
    monkeypatch.setenv("CDT_API_TOKENS", "x, y")
    monkeypatch.delenv("CDT_REDIS_URL", raising=False)
    monkeypatch.setenv("REDIS_URL", "redis://r:6379/0")
    settings = Settings(_env_file=None)
    assert settings.models_dir == Path("elsewhere")
    assert settings.api_tokens == {"x", "y"}
    assert settings.redis_url == "redis://r:6379/0"


def test_settings_defaults_serve_models_in_memory() -> None:
    settings = Settings(_env_file=None)
    assert settings.models_dir == Path("models") and not settings.batching


def test_serve_several_workers_without_redis_exits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CDT_REDIS_URL", raising=False)
    monkeypatch.delenv("REDIS_URL", raising=False)
    with pytest.raises(SystemExit, match="redis"):
        main(["--workers", "2"])
