"""The one way commands report a user's mistake (runtime/user_errors.py)."""

from __future__ import annotations

import json
import sys

import pytest

from runtime.user_errors import (
    UserError,
    exit_on_user_errors,
    one_line,
    require,
    user_error_types,
)


def test_user_error_types_names_an_error_only_once_its_module_is_loaded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delitem(sys.modules, "not_loaded_yet", raising=False)
    assert user_error_types("json.JSONDecodeError", "not_loaded_yet.Error") == (
        UserError,
        json.JSONDecodeError,
    )


def test_a_named_error_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    @exit_on_user_errors("cdt fake", "json.JSONDecodeError")
    def main() -> None:
        json.loads("{not json")

    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.startswith("cdt fake: Expecting property name")


def test_require_names_the_extra_before_any_work(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    require("json")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as in an install without [train]

    @exit_on_user_errors("cdt fake")
    def main() -> None:
        require("matplotlib")
        raise AssertionError("the work started")

    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == (
        "cdt fake: needs matplotlib, from the [train] extra: pip install -e '.[train]'\n"
    )


def test_one_line_flattens_control_characters_cuts_to_a_limit_and_names_a_silent_error() -> None:
    assert one_line("a\n  b\x1b[31m\tc\u2028d") == "a b [31m c d"
    assert one_line("x" * 20, 10) == "xxxxxxx..." and one_line("short", 10) == "short"
    assert one_line(KeyError()) == "KeyError" and one_line("") == ""
