"""Simulator ids and the memory for many envs: checked before long commands start."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.sim import (
    ENV_MEMORY_BYTES,
    NotEnoughMemory,
    available_memory,
    check_memory_for,
    check_task,
)


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


def test_available_memory_reads_memavailable_and_says_none_without_it(tmp_path: Path) -> None:
    meminfo, no_cgroup = tmp_path / "meminfo", tmp_path / "no-cgroup"
    meminfo.write_text("MemTotal:       24000000 kB\nMemAvailable:   2048 kB\n")
    assert available_memory(meminfo, no_cgroup) == 2048 * 1024
    meminfo.write_text("MemTotal:       24000000 kB\n")
    assert available_memory(meminfo, no_cgroup) is None
    assert available_memory(tmp_path / "absent", no_cgroup) is None


def test_available_memory_keeps_within_a_containers_cgroup_limit(tmp_path: Path) -> None:
    meminfo, cgroup = tmp_path / "meminfo", tmp_path / "cgroup"
    meminfo.write_text("MemAvailable:   2048 kB\n")  # the host's, in a container
    cgroup.mkdir()
    (cgroup / "memory.max").write_text("1000000\n")
    (cgroup / "memory.current").write_text("400000\n")
    assert available_memory(meminfo, cgroup) == 600_000
    (cgroup / "memory.max").write_text("max\n")  # no limit: the kernel's figure
    assert available_memory(meminfo, cgroup) == 2048 * 1024
    assert available_memory(tmp_path / "absent", cgroup) is None


def test_check_memory_for_counts_every_process_and_names_the_way_out() -> None:
    check_memory_for(10, processes=2, available=20 * ENV_MEMORY_BYTES)
    with pytest.raises(NotEnoughMemory, match="in each of 2 processes") as error:
        check_memory_for(11, processes=2, available=20 * ENV_MEMORY_BYTES)
    assert "run fewer episodes at once" in str(error.value)
    assert "\n" not in str(error.value)


def test_check_memory_for_stands_aside_where_the_memory_left_is_unknown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("runtime.sim.available_memory", lambda: None)
    check_memory_for(10**6)
