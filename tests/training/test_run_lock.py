"""One process at a time per run folder: a second one stops at once, naming the first."""

from __future__ import annotations

import errno
import fcntl
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime.user_errors import UserError
from training.run_lock import LOCK_FILE, run_folder_lock

HOLDER = """
import sys
from pathlib import Path
from training.run_lock import run_folder_lock
with run_folder_lock(Path(sys.argv[1]), "cdt pipeline"):
    print("held", flush=True)
    sys.stdin.readline()
"""


@pytest.fixture
def held_elsewhere(tmp_path: Path) -> Iterator[Path]:
    """A run folder whose lock another process holds until the test ends."""
    folder = tmp_path / "runs" / "pipeline-cdt-carcircle"
    root = Path(__file__).resolve().parents[2]
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(folder)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=root,
    )  # fmt: skip
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    yield folder
    holder.communicate("\n", timeout=10)


def test_a_folder_another_process_writes_is_refused_with_its_holder(held_elsewhere: Path) -> None:
    with pytest.raises(UserError, match=r"in use by cdt pipeline \(pid \d+\)"):
        with run_folder_lock(held_elsewhere, "cdt train"):
            pytest.fail("entered a folder another process holds")


def test_the_lock_is_reentrant_in_a_process_and_free_after_it(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    with run_folder_lock(folder, "cdt pipeline"):
        with run_folder_lock(folder, "cdt train"):  # the pipeline's own training stage
            pass
        assert f"cdt pipeline (pid {os.getpid()})" in (folder / LOCK_FILE).read_text()
        other = os.open(folder / LOCK_FILE, os.O_RDWR)
        try:  # still held after the inner block: another open file cannot take it
            with pytest.raises(BlockingIOError):
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(other)
    other = os.open(folder / LOCK_FILE, os.O_RDWR)
    try:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released: no error
    finally:
        os.close(other)


def test_a_file_system_without_locks_runs_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def unsupported(descriptor: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", unsupported)
    with run_folder_lock(tmp_path / "run", "cdt train"):
        pass
    assert "not locked" in caplog.text and "No locks available" in caplog.text
