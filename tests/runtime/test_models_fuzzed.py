"""What `bench/fuzz_models.py` found in the runtime loaders: model folders written by others may
hold a FIFO or a device where a file belongs, or a cost critic of another model."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from runtime.card import CardError, read_card
from runtime.cost_critic import CostCritic, CostCriticLoadError
from runtime.files import CARD_FILE, COST_CRITIC_FILE, ONNX_FILE
from runtime.policy import Policy, PolicyLoadError, fingerprint
from runtime.user_errors import UserError
from tests.runtime.toy_critic import write_test_critic
from tests.service.toy_policy import write_test_policy

CRITIC_RECORD = {
    "discount": 0.9, "dataset": "toy.hdf5", "update_steps": 10, "validation_mse": 0.1,
    "target_variance": 1.0,
}  # fmt: skip
SECONDS = 10.0


def with_critic(directory: Path, observation_dim: int) -> Path:
    """The toy policy (3 observations, 2 actions) with a critic of `observation_dim`."""
    write_test_policy(directory)
    card = json.loads((directory / CARD_FILE).read_text())
    card["cost_critic"] = CRITIC_RECORD
    (directory / CARD_FILE).write_text(json.dumps(card))
    write_test_critic(directory, observation_dim=observation_dim, action_dim=2)
    return directory


@contextlib.contextmanager
def fifo_at(path: Path) -> Iterator[Path]:
    """`path` replaced by a symlink to a FIFO; a reader still blocked on it is let go after."""
    fifo = path.with_name("fifo")
    os.mkfifo(fifo)
    path.unlink(missing_ok=True)
    path.symlink_to(fifo)
    try:
        yield path
    finally:
        with contextlib.suppress(OSError):  # a blocked reader (the old code): EOF ends its read
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


def raised_within(call: Callable[[], object], seconds: float = SECONDS) -> BaseException:
    """What `call` raised, in a thread: a call still running after `seconds` fails the test."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as error:
            raised.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still blocked after {seconds:g} s"
    assert raised, "loaded"
    return raised[0]


def test_a_critic_of_other_dims_is_refused_in_one_line_naming_the_shape(tmp_path: Path) -> None:
    directory = with_critic(tmp_path / "toy", observation_dim=18)
    with pytest.raises(PolicyLoadError) as refused:
        Policy.load(directory)
    message = str(refused.value)
    assert "\n" not in message and "observations has shape" in message and "3" in message
    with pytest.raises(CostCriticLoadError) as direct:
        CostCritic.load(directory, observation_dim=3, action_dim=2)
    assert "\n" not in str(direct.value)


def test_load_errors_are_user_errors_of_one_line() -> None:
    assert issubclass(PolicyLoadError, UserError) and issubclass(CostCriticLoadError, UserError)
    assert str(PolicyLoadError("first\n  second")) == "first second"
    assert str(CostCriticLoadError("a\nb")) == "a b"


@pytest.mark.parametrize("name", [ONNX_FILE, CARD_FILE, COST_CRITIC_FILE])
def test_a_fifo_in_place_of_a_file_is_refused_not_read_for_good(tmp_path: Path, name: str) -> None:
    directory = with_critic(tmp_path / "toy", observation_dim=3)
    with fifo_at(directory / name):
        error = raised_within(lambda: Policy.load(directory))
    assert isinstance(error, PolicyLoadError), error
    assert "not a regular file" in str(error)


def test_a_card_that_is_a_device_is_refused(tmp_path: Path) -> None:
    directory = write_test_policy(tmp_path / "toy")
    (directory / CARD_FILE).unlink()
    (directory / CARD_FILE).symlink_to("/dev/null")  # a device: /dev/zero would never end
    with pytest.raises(CardError, match="not a regular file"):
        read_card(directory)


def test_the_critic_loader_refuses_a_fifo(tmp_path: Path) -> None:
    directory = with_critic(tmp_path / "toy", observation_dim=3)
    with fifo_at(directory / COST_CRITIC_FILE):
        error = raised_within(lambda: CostCritic.load(directory, 3, 2))
    assert isinstance(error, CostCriticLoadError) and "not a regular file" in str(error)


def test_fingerprint_refuses_a_fifo_and_a_device(tmp_path: Path) -> None:
    directory = write_test_policy(tmp_path / "toy")
    with fifo_at(directory / ONNX_FILE):
        assert isinstance(raised_within(lambda: fingerprint(directory)), OSError)
    (directory / ONNX_FILE).unlink()
    (directory / ONNX_FILE).symlink_to("/dev/zero")
    assert isinstance(raised_within(lambda: fingerprint(directory)), OSError)


def test_read_regular_reads_files_up_to_the_limit(tmp_path: Path) -> None:
    from runtime.files import read_regular  # new with the fix: the module's other tests run old

    path = tmp_path / "file"
    path.write_bytes(b"12345")
    assert read_regular(path) == read_regular(path, limit=5) == b"12345"
    with pytest.raises(OSError, match="larger than 4 bytes"):
        read_regular(path, limit=4)
    with pytest.raises(IsADirectoryError):
        read_regular(tmp_path)
