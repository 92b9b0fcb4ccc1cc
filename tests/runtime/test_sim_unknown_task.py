"""A task no simulator knows: one `UnknownTask` wherever an env is made (runtime/sim.py)."""

from __future__ import annotations

import pickle

import gymnasium
import pytest

from runtime.sim import UnknownTask, check_task, make_env
from runtime.user_errors import UserError


def test_make_env_names_an_unknown_task_and_the_known_ones() -> None:
    with pytest.raises(UnknownTask) as error:
        make_env("NoSuchEnv-v9")
    message = str(error.value)
    assert message.startswith("no simulator task 'NoSuchEnv-v9': Environment `NoSuchEnv`")
    assert "Known tasks: SafetyAntCircle-v0," in message and "SafetyCarRun-v0" in message
    assert "\n" not in message and error.value.task == "NoSuchEnv-v9"


@pytest.mark.parametrize("find", [make_env, check_task])
def test_an_unknown_task_is_a_user_error_and_still_every_error_it_was(find: object) -> None:
    """`cdt` reports it in one line; callers that caught gymnasium's error (a baseline reading
    action bounds) or check_task's ValueError (collect, pipeline, rollout) still catch it."""
    with pytest.raises(UnknownTask) as error:
        find("SafetyCarRum-v0")  # type: ignore[operator]
    assert isinstance(error.value, UserError)
    assert isinstance(error.value, ValueError)
    assert isinstance(error.value, gymnasium.error.UnregisteredEnv)
    assert "Did you mean: `SafetyCarRun`?" in str(error.value)


def test_an_unknown_task_crosses_a_process_boundary_whole() -> None:
    """A worker process' error reaches its parent pickled: the same type, task and message."""
    with pytest.raises(UnknownTask) as error:
        make_env("NoSuchEnv-v9")
    copy = pickle.loads(pickle.dumps(error.value))
    assert type(copy) is type(error.value) and isinstance(copy, UserError)
    assert (copy.task, str(copy)) == (error.value.task, str(error.value))
