"""The collector's env workers: the same steps as in-process envs, in order, and loud failures."""

from __future__ import annotations

import numpy as np
import pytest

from training.collect.env_workers import LocalEnvs, WorkerEnvs, open_envs

TASK = "SafetyBallRun-v0"  # 100-step episodes, so 120 steps cross a reset


def _drive(envs: LocalEnvs | WorkerEnvs, actions: np.ndarray) -> list[np.ndarray]:
    seen = [envs.reset(seed=5)]
    for step_actions in actions:
        steps = envs.step(step_actions)
        seen += [
            steps.observations,
            steps.rewards,
            steps.costs,
            steps.done,
            steps.next_observations,
        ]
    return seen


@pytest.mark.slow
def test_each_worker_steps_its_envs_exactly_as_they_would_step_alone() -> None:
    actions = np.random.default_rng(0).uniform(-1, 1, size=(120, 4, 2))
    workers = WorkerEnvs(TASK, count=4, workers=2)
    try:
        together = _drive(workers, actions)
    finally:
        workers.close()
    alone = [
        _drive(LocalEnvs(TASK, 2, first_index=0, worker=0), actions[:, :2]),
        _drive(LocalEnvs(TASK, 2, first_index=2, worker=1), actions[:, 2:]),
    ]
    for index, array in enumerate(together):
        np.testing.assert_array_equal(array, np.concatenate([alone[0][index], alone[1][index]]))
    dones = np.stack(together[4::5])
    assert dones[99].all() and not dones[98].any()  # every env ended an episode at step 100
    last, following = together[1::5][99], together[5::5][99]
    assert not np.allclose(last, following)  # and went on from a new episode's first observation


def test_open_envs_keeps_one_env_or_one_worker_in_this_process() -> None:
    assert isinstance(open_envs(TASK, count=1, workers=2), LocalEnvs)
    assert isinstance(open_envs(TASK, count=3, workers=1), LocalEnvs)


def test_a_worker_that_cannot_build_its_envs_fails_with_its_traceback() -> None:
    with pytest.raises(RuntimeError, match=r"(?s)env worker 0 failed.*NoSuchTask"):
        WorkerEnvs("NoSuchTask-v0", count=2, workers=2)
