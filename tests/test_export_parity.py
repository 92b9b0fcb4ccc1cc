"""The exported ONNX policy against the torch policy it came from (training/export.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from runtime.card import ModelCard
from runtime.context import WINDOW_NAMES
from tests.training.cdt_synthetic import tiny_config, write_dataset
from tests.training.placeholder_graphs import write_placeholder_graphs
from training.checkpoint import load_checkpoint
from training.export import OnnxPolicy, model_card, policy_from_checkpoint
from training.export_cli import main
from training.learn.train import train

REQUIRED_CARD_KEYS = {
    "name", "version", "task", "observation_dim", "action_dim", "action_low", "action_high",
    "context_len", "max_episode_len",
}  # fmt: skip


def random_windows(batch: int, fill: int, seq_len: int, seed: int) -> dict[str, np.ndarray]:
    """Raw env-unit windows with `fill` real steps; padding holds garbage that must not matter."""
    rng = np.random.default_rng(seed)
    padding = np.arange(seq_len)[None, :] < seq_len - fill  # [batch, seq_len], left padding
    padding = np.broadcast_to(padding, (batch, seq_len)).copy()
    return {
        "states": rng.normal(0.0, 3.0, (batch, seq_len, 7)).astype(np.float32),
        "actions": rng.uniform(-1.0, 1.0, (batch, seq_len, 2)).astype(np.float32),
        "returns_to_go": rng.uniform(0.0, 60.0, (batch, seq_len)).astype(np.float32),
        "costs_to_go": rng.uniform(0.0, 30.0, (batch, seq_len)).astype(np.float32),
        "time_steps": rng.integers(0, 500, (batch, seq_len)).astype(np.int64),  # some > max len
        "padding_mask": padding,
    }


@pytest.mark.slow
@pytest.mark.parametrize("batch", [1, 3, 16])
def test_onnxruntime_matches_torch_for_every_window_fill(
    exported_policy: tuple[Path, Path], batch: int
):
    checkpoint, out_dir = exported_policy
    policy = policy_from_checkpoint(load_checkpoint(checkpoint))
    session = ort.InferenceSession(str(out_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    seq_len = policy.model.config.seq_len
    for fill in range(1, seq_len + 1):
        inputs = random_windows(batch, fill, seq_len, seed=batch * 100 + fill)
        onnx_mean, onnx_log_std = session.run(None, inputs)
        with torch.no_grad():
            mean, log_std = policy(*(torch.from_numpy(inputs[name]) for name in WINDOW_NAMES))
        assert onnx_mean.shape == (batch, 2)
        np.testing.assert_allclose(onnx_mean, mean.numpy(), atol=1e-4, rtol=0)
        np.testing.assert_allclose(onnx_log_std, log_std.numpy(), atol=1e-4, rtol=0)
        assert np.all(onnx_mean >= -1.0) and np.all(onnx_mean <= 1.0)


@pytest.mark.slow
def test_a_context_one_policy_exports_its_short_attention_faithfully(tmp_path: Path):
    from training.export import export_checkpoint

    dataset = write_dataset(tmp_path / "tiny.hdf5")
    config = tiny_config(dataset, tmp_path, update_steps=3, seq_len=1, return_basis=4, num_layers=1)
    checkpoint = train(config)
    out_dir = export_checkpoint(checkpoint, tmp_path / "models" / "context-one")
    policy = policy_from_checkpoint(load_checkpoint(checkpoint))
    assert policy.model.blocks[0].attention.short  # the path under test
    session = ort.InferenceSession(str(out_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    inputs = random_windows(8, fill=1, seq_len=1, seed=3)
    with torch.no_grad():
        mean, log_std = policy(*(torch.from_numpy(inputs[name]) for name in WINDOW_NAMES))
    onnx_mean, onnx_log_std = session.run(None, inputs)
    np.testing.assert_allclose(onnx_mean, mean.numpy(), atol=1e-4, rtol=0)
    np.testing.assert_allclose(onnx_log_std, log_std.numpy(), atol=1e-4, rtol=0)


@pytest.mark.slow
def test_padding_contents_do_not_change_the_exported_action(exported_policy: tuple[Path, Path]):
    _, out_dir = exported_policy
    session = ort.InferenceSession(str(out_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    inputs = random_windows(4, fill=2, seq_len=5, seed=7)
    changed = {name: value.copy() for name, value in inputs.items()}
    changed["states"][:, :3] = 1e6
    changed["returns_to_go"][:, :3] = -1e6
    for left, right in zip(session.run(None, inputs), session.run(None, changed), strict=True):
        np.testing.assert_allclose(left, right, atol=1e-6)


@pytest.mark.slow
def test_graph_is_valid_with_a_dynamic_batch_and_fixed_context(exported_policy: tuple[Path, Path]):
    _, out_dir = exported_policy
    model = onnx.load(out_dir / "model.onnx")
    onnx.checker.check_model(model, full_check=True)
    states = next(item for item in model.graph.input if item.name == "states")
    dims = states.type.tensor_type.shape.dim
    assert dims[0].dim_param and not dims[0].dim_value  # dynamic batch
    assert [dim.dim_value for dim in dims[1:]] == [5, 7]  # fixed K, obs_dim
    assert [item.name for item in model.graph.input] == list(WINDOW_NAMES)
    assert [item.name for item in model.graph.output] == ["action_mean", "action_log_std"]


@pytest.mark.slow
def test_model_card_follows_the_artifact_contract(exported_policy: tuple[Path, Path]):
    checkpoint, out_dir = exported_policy
    card = json.loads((out_dir / "model.json").read_text())
    assert REQUIRED_CARD_KEYS <= set(card)
    assert card["name"] == "tiny-cdt" and card["task"] == "SafetyBallRun-v0"
    assert (card["observation_dim"], card["action_dim"], card["context_len"]) == (7, 2, 5)
    assert card["action_low"] == [-1.0, -1.0] and card["action_high"] == [1.0, 1.0]
    dataset = card["dataset"]
    assert dataset["episodes"] == 24 and dataset["reward_return_max"] > dataset["reward_return_min"]
    assert card["training_config"]["cost_transform"] is True
    assert card["onnx_opset"] >= 17 and card["git_commit"]
    assert card["max_episode_len"] == load_checkpoint(checkpoint)["stats"]["max_episode_len"]


def test_a_mean_action_scale_chosen_by_select_reaches_the_card_as_one_entry(
    exported_policy: tuple[Path, Path],
):
    checkpoint = load_checkpoint(exported_policy[0])
    assert model_card(checkpoint, "m", None, 18)["mean_action_budget_scales"] is None
    checkpoint |= {"budget_scale": 0.6, "mean_action_budget_scale": 1.0}
    card = ModelCard.model_validate(model_card(checkpoint, "m", None, 18))
    for budget in (5.0, 10.0, 40.0):  # select's scale holds at every budget
        assert card.cost_input_scale(True, budget) == pytest.approx(1.0 / 0.6)


def test_deterministic_policy_reports_a_constant_log_std(tmp_path: Path):
    dataset = write_dataset(tmp_path / "tiny.hdf5")
    checkpoint = train(tiny_config(dataset, tmp_path, update_steps=1, deterministic=True))
    policy: OnnxPolicy = policy_from_checkpoint(load_checkpoint(checkpoint))
    inputs = random_windows(3, fill=4, seq_len=10, seed=0)
    with torch.no_grad():
        _, log_std = policy(*(torch.from_numpy(inputs[name]) for name in WINDOW_NAMES))
    assert torch.unique(log_std).numel() == 1


def test_export_cli_requires_an_output_folder(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit):
        main(["runs/x/last.pt"])
    assert "--out" in capsys.readouterr().err


def test_an_export_over_a_model_with_a_cost_critic_drops_the_critic(
    exported_policy: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The critic was fitted for the model replaced; the new card names none."""
    from training.export import export_checkpoint

    write_placeholder_graphs(monkeypatch)  # what the export does beside its graph is under test
    out_dir = tmp_path / "models" / "tiny-cdt"
    out_dir.mkdir(parents=True)
    (out_dir / "cost_critic.onnx").write_bytes(b"the old model's critic")
    export_checkpoint(exported_policy[0], out_dir)
    assert not (out_dir / "cost_critic.onnx").exists()
    assert json.loads((out_dir / "model.json").read_text()).get("cost_critic") is None
