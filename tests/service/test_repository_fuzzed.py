"""What `bench/fuzz_models.py` found in the model repository: corrupt folders are refused with
one line, the old version serves on, and no reload blocks on a FIFO."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import numpy as np
import onnx
from fastapi.testclient import TestClient

from runtime.files import CARD_FILE, COST_CRITIC_FILE, ONNX_FILE
from service.repository import ModelRepository
from service.schemas import ReloadResult
from tests.runtime.toy_critic import write_test_critic
from tests.service.toy_policy import write_test_policy

CRITIC_RECORD = {
    "discount": 0.9, "dataset": "toy.hdf5", "update_steps": 10, "validation_mse": 0.1,
    "target_variance": 1.0,
}  # fmt: skip


def edit_card(directory: Path, **changes: object) -> None:
    card = json.loads((directory / CARD_FILE).read_text())
    (directory / CARD_FILE).write_text(json.dumps({**card, **changes}))


def reload_within(repository: ModelRepository, seconds: float = 10.0) -> ReloadResult:
    """The reload's result; a reload still running after `seconds` fails the test (a FIFO it
    reads is then given EOF by the caller's cleanup, so the thread ends)."""
    results: list[ReloadResult] = []
    thread = threading.Thread(target=lambda: results.append(repository.reload()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"reload still blocked after {seconds:g} s"
    return results[0]


def let_readers_go(fifo: Path) -> None:
    try:  # a reader blocked on the FIFO (the old code) reads EOF once a writer comes and goes
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass


def test_a_critic_of_other_dims_is_refused_with_one_line_and_the_old_version_serves(
    client: TestClient, models_dir: Path
) -> None:
    directory = models_dir / "toy"
    edit_card(directory, version="2", cost_critic=CRITIC_RECORD)
    write_test_critic(directory, observation_dim=18, action_dim=2)
    response = client.post("/v1/admin/reload")
    assert response.status_code == 422
    (failure,) = response.json()["failed"]
    assert "\n" not in failure["error"] and "observations has shape" in failure["error"]
    assert client.get("/v1/models/toy").json()["version"] == "1"


def test_a_graph_linked_to_a_fifo_is_refused_without_blocking_the_reload(
    tmp_path: Path,
) -> None:
    directory = write_test_policy(tmp_path / "toy")
    repository = ModelRepository(tmp_path)
    repository.reload()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (directory / ONNX_FILE).unlink()
    (directory / ONNX_FILE).symlink_to(fifo)
    try:
        same_version = reload_within(repository)  # the fingerprint reads the files
        edit_card(directory, version="2")
        new_version = reload_within(repository)  # onnxruntime would open it
    finally:
        let_readers_go(fifo)
    for result in (same_version, new_version):
        (failure,) = result.failed
        assert "not a regular file" in failure.error and "\n" not in failure.error
    assert repository.current("toy").card.version == "1"


def test_a_critic_linked_to_dev_zero_is_refused(tmp_path: Path) -> None:
    directory = write_test_policy(tmp_path / "toy")
    repository = ModelRepository(tmp_path)
    repository.reload()
    edit_card(directory, version="2", cost_critic=CRITIC_RECORD)
    (directory / COST_CRITIC_FILE).symlink_to("/dev/zero")
    (failure,) = reload_within(repository).failed
    assert "not a regular file" in failure.error
    assert repository.current("toy").card.version == "1"


def test_a_broken_card_link_is_refused_not_taken_for_a_removed_model(tmp_path: Path) -> None:
    dangling = write_test_policy(tmp_path / "dangling", name="dangling")
    looping = write_test_policy(tmp_path / "looping", name="looping")
    repository = ModelRepository(tmp_path)
    repository.reload()
    (dangling / CARD_FILE).unlink()
    (dangling / CARD_FILE).symlink_to(tmp_path / "nowhere.json")
    (looping / CARD_FILE).unlink()
    (looping / CARD_FILE).symlink_to(looping / CARD_FILE)
    result = repository.reload()
    assert not result.removed and len(result.failed) == 2
    assert [policy.card.name for policy in repository.policies()] == ["dangling", "looping"]


def test_model_folders_lists_card_entries_only(tmp_path: Path) -> None:
    from service.repository import model_folders  # new with the fix: the others run old

    write_test_policy(tmp_path / "b")
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / CARD_FILE).symlink_to(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("x")
    write_test_policy(tmp_path / ".hidden")  # as `*/model.json` never matched it
    assert [path.name for path in model_folders(tmp_path)] == ["a", "b"]
    assert model_folders(tmp_path / "none") == []


def test_a_graph_answering_nan_for_an_empty_window_is_refused(tmp_path: Path) -> None:
    directory = write_test_policy(tmp_path / "toy")
    repository = ModelRepository(tmp_path)
    repository.reload()
    graph = onnx.load(directory / ONNX_FILE)
    for tensor in graph.graph.initializer:
        if tensor.name == "log_std":
            tensor.CopyFrom(onnx.numpy_helper.from_array(np.array(np.nan, np.float32), "log_std"))
    onnx.save(graph, directory / ONNX_FILE)
    edit_card(directory, version="2")
    (failure,) = repository.reload().failed
    assert "empty window: not finite" in failure.error
    assert repository.current("toy").card.version == "1"
