"""Atomic writes (runtime/files.py): the old file or the new one, never half of one."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.files import write_atomic


def test_write_atomic_keeps_the_old_file_when_writing_fails(tmp_path: Path) -> None:
    path = write_atomic(tmp_path / "deep" / "card.json", lambda t: t.write_text("old"))

    def fail(temporary: Path) -> None:
        temporary.write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomic(path, fail)
    assert path.read_text() == "old"
    assert [p.name for p in path.parent.iterdir()] == ["card.json"]  # no temporary left behind
