"""bench/client_step.py: one round against a real `cdt serve`, this checkout on both sides."""

from __future__ import annotations

import pytest

from bench.client_step import main
from bench.local_server import ROOT


def test_one_round_prints_both_checkouts_and_a_ratio(
    capsys: pytest.CaptureFixture[str],
) -> None:
    main(["--other", str(ROOT), "--rounds", "1", "--steps", "3"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("round 0: this ") and lines[1].startswith("round 0: other ")
    assert "ms per step, ratio " in lines[-1]
