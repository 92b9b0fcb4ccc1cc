"""Atomic writes (runtime/files.py): the old file or the new one, never half of one."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.files import (
    check_writable,
    refuse_overwrite,
    same_file,
    staged_files,
    write_atomic,
)
from runtime.user_errors import UserError


def test_write_atomic_keeps_the_old_file_when_writing_fails(tmp_path: Path) -> None:
    path = write_atomic(tmp_path / "deep" / "card.json", lambda t: t.write_text("old"))

    def fail(temporary: Path) -> None:
        temporary.write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomic(path, fail)
    assert path.read_text() == "old"
    assert [p.name for p in path.parent.iterdir()] == ["card.json"]  # no temporary left behind


def test_staged_files_replace_together_or_not_at_all(tmp_path: Path) -> None:
    model = tmp_path / "models" / "m"
    model.mkdir(parents=True)
    for name, text in (("model.onnx", "old graph"), ("model.json", "old card"), ("notes", "x")):
        (model / name).write_text(text)
    with pytest.raises(OSError, match="card refused"), staged_files(model) as staging:
        (staging / "model.onnx").write_text("new graph")
        raise OSError("card refused")
    assert (model / "model.onnx").read_text() == "old graph"  # no mix of old and new
    with staged_files(model) as staging:
        (staging / "model.onnx").write_text("new graph")
        (staging / "model.json").write_text("new card")
    assert [(p.name, p.read_text()) for p in sorted(model.iterdir())] == [
        ("model.json", "new card"),
        ("model.onnx", "new graph"),
        ("notes", "x"),  # other files stay
    ]
    assert sorted(p.name for p in model.parent.iterdir()) == ["m"]  # no staging folder left


def test_check_writable_refuses_before_any_work(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    check_writable(tmp_path / "new" / "deeper" / "out.json")  # folders made when written
    check_writable(tmp_path / "new", folder=True)
    with pytest.raises(UserError, match="is a file, not a folder"):
        check_writable(tmp_path / "file" / "out.json", option="--json")
    with pytest.raises(UserError, match=r"folder .* does not exist"):
        check_writable(tmp_path / "new" / "out.json", create_folders=False)
    with pytest.raises(UserError, match="is a file, expected a folder"):
        check_writable(tmp_path / "file", folder=True)
    with pytest.raises(UserError, match="cannot write in /proc"):
        check_writable("/proc/out.json")  # read-only even for root
    assert list(tmp_path.iterdir()) == [tmp_path / "file"]  # checking wrote nothing


def test_refuse_overwrite_names_the_file_unless_forced(tmp_path: Path) -> None:
    (tmp_path / "b").write_text("work")
    refuse_overwrite([tmp_path / "a", tmp_path / "b"], force=True)
    with pytest.raises(UserError, match=r"b exists already: .*--force"):
        refuse_overwrite([tmp_path / "a", tmp_path / "b"], force=False)
    assert same_file(tmp_path / "b", tmp_path / "x" / ".." / "b")
