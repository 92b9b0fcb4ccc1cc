"""Simulator ids: checked before long commands start."""

from __future__ import annotations

import pytest

from runtime.sim import check_task


def test_check_task_accepts_bullet_safety_gym_and_plain_gymnasium_ids() -> None:
    check_task("SafetyCarRun-v0")
    check_task("Pendulum-v1")


@pytest.mark.parametrize(
    ("task", "said"),
    [("SafetyCarRum-v0", "Did you mean: `SafetyCarRun`"), ("SafetyCarRun-v9", "`v9`")],
)
def test_check_task_names_an_unknown_id_and_gymnasiums_guess(task: str, said: str) -> None:
    with pytest.raises(ValueError, match=f"no simulator task '{task}'") as error:
        check_task(task)
    assert said in str(error.value)
