"""The API fuzzer itself: a few dozen cases against a live server find nothing, and its checks
catch what they are there for (so that `bench/fuzz_api.py` cannot rot)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from bench.api_fuzz_values import Raw, encode
from bench.fuzz_api import error_problem, fuzz
from service.config import Settings
from service.main import create_app
from tests.service.live_server import live_server

MODELS = Path(__file__).resolve().parents[2] / "models"


def test_a_few_dozen_cases_against_a_live_server_break_no_invariant() -> None:
    settings = Settings(
        _env_file=None,
        models_dir=MODELS,
        redis_url=None,
        api_tokens=frozenset(),
        ws_max_episodes_per_socket=6,  # the socket-limit scenario meets it at once
    )
    with live_server(create_app(settings)) as port:
        report, figures = fuzz(f"http://127.0.0.1:{port}", seed=3, cases=40, timeout=10.0)
    assert report.violations == []
    routes = report.statuses
    assert sum(sum(counts.values()) for counts in routes.values()) >= 40
    assert routes["WS socket limit"] == {"limit at 6": 1}
    assert figures["control_laps"] >= 1 and figures["control_steps"] >= 3
    assert figures["differed"] == 0


def test_the_error_check_holds_answers_to_the_documented_shape() -> None:
    fine = {"code": "validation_error", "detail": "body: not valid JSON", "field": "body"}
    assert error_problem(422, fine) is None
    assert error_problem(503, fine | {"code": "store_unavailable"}) is None
    assert "undocumented code" in str(error_problem(400, fine | {"code": "http_error"}))
    assert "without a detail" in str(error_problem(422, fine | {"detail": " "}))
    assert "not a JSON object" in str(error_problem(422, ["x"]))
    assert "500 internal_error" in str(error_problem(500, fine | {"code": "internal_error"}))
    assert "readable" in str(error_problem(422, fine | {"detail": "Traceback (most recent"}))


def test_encode_writes_what_a_careless_client_would() -> None:
    text = encode({"a": float("nan"), "b": Raw("1e400"), "c": [Raw("-0"), math.inf]})
    assert text == b'{"a": NaN, "b": 1e400, "c": [-0, Infinity]}'
    assert json.loads(encode({"s": "\ud800"})) == {"s": "\ud800"}  # escaped, still ASCII
