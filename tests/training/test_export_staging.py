"""`cdt export`'s staging folders: gone with an interrupted export (Ctrl-C, SIGTERM), and those of
an export killed outright (`kill -9`) removed by the next export of the same folder."""

from __future__ import annotations

import fcntl
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from runtime.files import clear_stale_staging, staged_files
from training import export as export_module
from training.export import export_checkpoint


def _staging(out: Path, suffix: str, age_s: float = 3600.0) -> Path:
    """A staging folder as `staged_files` makes it (`.<name>.staged-*/<name>/`), `age_s` old."""
    root = out.parent / f".{out.name}.staged-{suffix}"
    (root / out.name).mkdir(parents=True)
    (root / out.name / "model.onnx").write_bytes(b"half an export")
    made = time.time() - age_s
    os.utime(root, (made, made))
    return root


@contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """`folder` locked through another open file, as a live export holds its staging folder."""
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield
    finally:
        os.close(descriptor)


def test_only_the_staging_of_killed_exports_of_that_folder_is_removed(tmp_path: Path) -> None:
    out = tmp_path / "models" / "cdt-x"
    killed = [_staging(out, "a1"), _staging(out, "b2")]
    live = _staging(out, "c3")  # an export still running: it holds the lock
    new = _staging(out, "d4", age_s=-60)  # made after this exporter loaded: perhaps not locked yet
    other = _staging(tmp_path / "models" / "cdt-y", "e5")  # another model's
    with _locked(live):
        assert clear_stale_staging(out) == killed
    assert [path.exists() for path in (*killed, live, new, other)] == [False] * 2 + [True] * 3


def test_a_staging_folder_is_locked_while_its_export_runs(tmp_path: Path) -> None:
    out = tmp_path / "cdt-x"
    with staged_files(out) as staging:
        os.utime(staging.parent, (0, 0))  # as old as can be: only the lock keeps it
        assert clear_stale_staging(out) == [] and staging.is_dir()
    assert [path.name for path in tmp_path.iterdir()] == ["cdt-x"]  # the staging gone


@pytest.fixture
def fake_exporter(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The exporter without torch: a checkpoint that loads as {}, a graph export whose steps are
    listed; the test decides what the graph export does."""
    steps: list[str] = []
    monkeypatch.setattr(export_module, "load_checkpoint", lambda path: {})
    monkeypatch.setattr(export_module, "policy_from_checkpoint", lambda checkpoint: None)
    monkeypatch.setattr(export_module, "model_card", lambda *args: {"name": "x"})
    return steps


def test_sigterm_during_an_export_leaves_no_staging_and_nothing_half_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_exporter: list[str]
) -> None:
    out = tmp_path / "models" / "cdt-x"
    stale = _staging(out, "killed")

    def export_onnx(policy: Any, path: Path) -> None:
        path.write_bytes(b"half a graph")
        os.kill(os.getpid(), signal.SIGTERM)  # `docker stop`, a scheduler's pre-emption
        time.sleep(5)  # the handler interrupts this
        fake_exporter.append("finished")

    monkeypatch.setattr(export_module, "export_onnx", export_onnx)
    previous = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):
        export_checkpoint(tmp_path / "last.pt", out)
    assert fake_exporter == [] and signal.getsignal(signal.SIGTERM) == previous
    assert not stale.exists()  # the earlier killed export's, removed as this one began
    assert sorted(path.name for path in out.parent.iterdir()) == []  # no staging, no model
